//! Where the counters live in the shared zone, across reloads: one block of cells per zone name
//! and per Redis backend (its server block, named by the caller: by the backend's name and
//! address), found again by name when a new configuration is set up, so that a reload keeps the
//! counters of every zone and backend it keeps, whatever else changed, and allocates only for
//! names it has not seen.
//!
//! Only the master writes the directory (names, links, generations), while it sets up a cycle
//! and before it forks; workers, of this configuration and of earlier ones still finishing
//! their requests, only add to cells. So cells are never freed: a worker of an old
//! configuration may still add to them, and freed memory could be handed out again as a name or
//! a link the master then follows. A block no longer named is given to a new name instead (its
//! cells zeroed), once neither the new configuration nor the one it replaces uses it, which
//! bounds the zone to the names of two configurations.

use core::mem::size_of;
use core::ptr;
use core::slice;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{REDIS_CELLS, WORKER_CELLS, ZONE_CELLS};

/// The shared zone's allocator (nginx's slab pool, or a test's).
pub trait Slab {
    /// `size` zeroed bytes, 8-byte aligned, or null when the zone is full.
    fn calloc(&mut self, size: usize) -> *mut u8;
    /// # Safety
    /// `p` came from `calloc` and is not used afterwards.
    unsafe fn free(&mut self, p: *mut u8);
}

/// The start of the counters in the shared zone; nginx keeps its address in the slab pool's
/// `data` across reloads.
#[repr(C)]
pub struct Directory {
    /// The configurations set up so far, the current one included.
    generation: u64,
    entries: *mut Entry,
    /// Summed over every worker of every configuration: a worker gives back what it added.
    worker: [AtomicU64; WORKER_CELLS],
}

const ZONE: u32 = 0;
const SERVER: u32 = 1;

/// A named block of cells; the cells follow it in the same allocation.
#[repr(C)]
struct Entry {
    next: *mut Entry,
    /// The last configuration that used it.
    used: u64,
    name: *mut u8,
    /// Beside `kind`, so that the entry takes 32 bytes and a zone's block (its cells after it)
    /// fits nginx's 128-byte slab class.
    name_len: u32,
    kind: u32,
}

impl Entry {
    fn cells(kind: u32) -> usize {
        if kind == ZONE {
            ZONE_CELLS
        } else {
            REDIS_CELLS
        }
    }

    /// # Safety
    /// `e` is a live entry.
    unsafe fn cells_of(e: *mut Entry) -> *const AtomicU64 {
        (e as *mut u8).add(size_of::<Entry>()) as *const AtomicU64
    }

    /// # Safety
    /// `e` is a live entry.
    unsafe fn name<'a>(e: *const Entry) -> &'a [u8] {
        if (*e).name_len == 0 {
            return &[];
        }
        slice::from_raw_parts((*e).name, (*e).name_len as usize)
    }
}

/// Where one configuration counts: a block per zone (in the configuration's order), a block per
/// Redis backend (in the order of the servers given to [`attach`]) and the workers' cells; per
/// zone, the block of its concurrency slot events (null for the zones that have none).
#[derive(Debug)]
pub struct Cells {
    pub zones: Vec<*const AtomicU64>,
    pub redis: Vec<*const AtomicU64>,
    pub worker: *const AtomicU64,
    pub slots: Vec<*const AtomicU64>,
}

/// The name a Redis backend's block is found by, for [`attach`]: the unnamed backend's is its
/// server's, as the one server's was before backends had names; a named one's is
/// `name=NAME SERVER`, which no server written in an unnamed `ratelimit_redis` can be (`name=`
/// would be its name there). A backend renamed, or given another server, has another block: its
/// series have other labels, and start from 0.
pub fn server_block(backend: &str, server: &str) -> String {
    if backend.is_empty() {
        server.to_owned()
    } else {
        format!("name={backend} {server}")
    }
}

/// A new, empty directory, or null when the zone has no room for it.
pub fn create(slab: &mut impl Slab) -> *mut Directory {
    slab.calloc(size_of::<Directory>()) as *mut Directory
}

/// Finds or makes the blocks of a new configuration with these zone names and these Redis
/// servers (one block per name; a name given twice gets one block, counted by both); `None`
/// when the zone is full (the blocks found or made so far stay for the next configuration).
///
/// # Safety
/// `dir` comes from [`create`] with this `slab`, and only this process changes it meanwhile.
pub unsafe fn attach(
    dir: *mut Directory,
    slab: &mut impl Slab,
    zones: &[&str],
    servers: &[&str],
) -> Option<Cells> {
    (*dir).generation += 1;
    let generation = (*dir).generation;
    // The servers first: with the zone full, a configuration with fewer zones still fits.
    let wanted: Vec<(u32, &[u8])> = servers
        .iter()
        .map(|s| (SERVER, s.as_bytes()))
        .chain(zones.iter().map(|z| (ZONE, z.as_bytes())))
        .collect();
    // Kept names first, so that a block is given to a new name only once every kept one has
    // claimed its own.
    let mut found: Vec<*mut Entry> =
        wanted.iter().map(|&(kind, name)| claim(dir, kind, name, generation)).collect();
    for i in 0..wanted.len() {
        if found[i].is_null() {
            let (kind, name) = wanted[i];
            // A name given twice: the block its first mention just got.
            found[i] = match claim(dir, kind, name, generation) {
                e if !e.is_null() => e,
                _ => reuse(dir, slab, kind, name, generation)
                    .or_else(|| add(dir, slab, kind, name, generation))?,
            };
        }
    }
    let mut cells = found.into_iter().map(|e| Entry::cells_of(e));
    Some(Cells {
        redis: cells.by_ref().take(servers.len()).collect(),
        zones: cells.collect(),
        worker: (*dir).worker.as_ptr(),
        slots: Vec::new(),
    })
}

unsafe fn entries(dir: *mut Directory) -> impl Iterator<Item = *mut Entry> {
    let mut e = (*dir).entries;
    core::iter::from_fn(move || {
        let this = e;
        if this.is_null() {
            return None;
        }
        e = (*this).next;
        Some(this)
    })
}

/// The block already named so, marked as used by `generation`; null if none.
unsafe fn claim(dir: *mut Directory, kind: u32, name: &[u8], generation: u64) -> *mut Entry {
    match entries(dir).find(|&e| (*e).kind == kind && Entry::name(e) == name) {
        Some(e) => {
            (*e).used = generation;
            e
        }
        None => ptr::null_mut(),
    }
}

/// A block that neither this configuration nor the previous one uses, renamed and zeroed.
unsafe fn reuse(
    dir: *mut Directory,
    slab: &mut impl Slab,
    kind: u32,
    name: &[u8],
    generation: u64,
) -> Option<*mut Entry> {
    let e = entries(dir).find(|&e| (*e).kind == kind && (*e).used + 1 < generation)?;
    let copy = copy_name(slab, name)?;
    if !(*e).name.is_null() {
        slab.free((*e).name);
    }
    ((*e).name, (*e).name_len, (*e).used) = (copy, name.len() as u32, generation);
    let cells = Entry::cells_of(e);
    for i in 0..Entry::cells(kind) {
        (*cells.add(i)).store(0, Relaxed);
    }
    Some(e)
}

/// A new zeroed block, first in the directory.
unsafe fn add(
    dir: *mut Directory,
    slab: &mut impl Slab,
    kind: u32,
    name: &[u8],
    generation: u64,
) -> Option<*mut Entry> {
    let copy = copy_name(slab, name)?;
    let e =
        slab.calloc(size_of::<Entry>() + Entry::cells(kind) * size_of::<AtomicU64>()) as *mut Entry;
    if e.is_null() {
        if !copy.is_null() {
            slab.free(copy);
        }
        return None;
    }
    e.write(Entry {
        next: (*dir).entries,
        used: generation,
        kind,
        name: copy,
        name_len: name.len() as u32,
    });
    (*dir).entries = e;
    Some(e)
}

/// The name in the zone; null for an empty one.
unsafe fn copy_name(slab: &mut impl Slab, name: &[u8]) -> Option<*mut u8> {
    if name.is_empty() {
        return Some(ptr::null_mut());
    }
    let p = slab.calloc(name.len());
    if p.is_null() {
        return None;
    }
    ptr::copy_nonoverlapping(name.as_ptr(), p, name.len());
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{alloc_zeroed, dealloc, Layout};
    use std::collections::HashMap;

    /// A heap allocator with a byte budget, rounding as nginx's slab does for small blocks
    /// (powers of two from 8 bytes).
    struct Budget {
        left: usize,
        live: HashMap<usize, usize>,
    }

    impl Budget {
        fn new(bytes: usize) -> Self {
            Budget { left: bytes, live: HashMap::new() }
        }
        fn used(&self) -> usize {
            self.live.values().sum()
        }
    }

    impl Slab for Budget {
        fn calloc(&mut self, size: usize) -> *mut u8 {
            let size = size.next_power_of_two().max(8);
            if size > self.left {
                return ptr::null_mut();
            }
            self.left -= size;
            let p = unsafe { alloc_zeroed(Layout::from_size_align(size, 8).unwrap()) };
            self.live.insert(p as usize, size);
            p
        }
        unsafe fn free(&mut self, p: *mut u8) {
            let size = self.live.remove(&(p as usize)).expect("freed twice or never allocated");
            self.left += size;
            dealloc(p, Layout::from_size_align(size, 8).unwrap());
        }
    }

    fn names(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("z{i}")).collect()
    }

    unsafe fn reload(dir: *mut Directory, slab: &mut Budget, zones: &[String]) -> Option<Cells> {
        let zones: Vec<&str> = zones.iter().map(String::as_str).collect();
        attach(dir, slab, &zones, &["127.0.0.1:6379"])
    }

    unsafe fn count(c: &Cells, zone: usize) -> u64 {
        (*c.zones[zone]).load(Relaxed)
    }

    /// Issue 18 item 8: 30 zones in a 32k zone, then reloads with 31, 32, ... zones. Each
    /// configuration used to take a new array of every cell: the seventh reload found the zone
    /// full. Now each reload takes a block for the one new name only, and the zone never fills.
    #[test]
    fn reloads_that_add_zones_take_only_the_new_ones() {
        unsafe {
            let mut slab = Budget::new(32 << 10);
            let dir = create(&mut slab);
            let first = reload(dir, &mut slab, &names(30)).expect("30 zones fit");
            (*first.zones[0]).fetch_add(5, Relaxed);
            let per_config = slab.used();
            for n in 31..=60 {
                let c = reload(dir, &mut slab, &names(n)).unwrap_or_else(|| panic!("{n} zones"));
                assert_eq!(count(&c, 0), 5, "z1 keeps its counters at {n} zones");
                assert_eq!(count(&c, n - 1), 0, "z{n} starts at 0");
            }
            let per_zone = (slab.used() - per_config) / 30;
            assert!(per_zone <= 256, "{per_zone} bytes per zone added");
        }
    }

    #[test]
    fn kept_names_keep_their_cells_in_any_order() {
        unsafe {
            let mut slab = Budget::new(64 << 10);
            let dir = create(&mut slab);
            let a = attach(dir, &mut slab, &["api", "ip"], &["r:1"]).unwrap();
            (*a.zones[1]).fetch_add(7, Relaxed);
            (*a.redis[0]).fetch_add(3, Relaxed);
            (*a.worker).fetch_add(2, Relaxed);
            let b = attach(dir, &mut slab, &["new", "ip", "api"], &["r:1"]).unwrap();
            assert_eq!(b.zones[1], a.zones[1]);
            assert_eq!(b.zones[2], a.zones[0]);
            assert_eq!((count(&b, 1), (*b.redis[0]).load(Relaxed)), (7, 3));
            assert_eq!((*b.worker).load(Relaxed), 2, "one worker gauge for every configuration");
            // Another server: its own block; the zones' blocks stay.
            let c = attach(dir, &mut slab, &["ip"], &["r:2"]).unwrap();
            assert_ne!(c.redis[0], a.redis[0]);
            assert_eq!(count(&c, 0), 7);
            // A zone and a server of one name are different blocks.
            let d = attach(dir, &mut slab, &["r:2"], &["r:2"]).unwrap();
            assert_ne!(d.zones[0], d.redis[0]);
        }
    }

    /// Renaming every zone at each reload: blocks of names the running configuration still
    /// uses are left to its workers; older ones are given to the new names, so memory stays
    /// at two configurations' worth.
    #[test]
    fn renamed_zones_reuse_blocks_two_configurations_old() {
        unsafe {
            let mut slab = Budget::new(1 << 20);
            let dir = create(&mut slab);
            let gen = |i: usize| -> Vec<String> { (0..20).map(|z| format!("g{i}z{z}")).collect() };
            let first = reload(dir, &mut slab, &gen(0)).unwrap();
            let second = reload(dir, &mut slab, &gen(1)).unwrap();
            for (a, b) in first.zones.iter().zip(&second.zones) {
                assert_ne!(a, b, "the running configuration's cells are not taken");
            }
            (*first.zones[0]).fetch_add(9, Relaxed);
            let used = slab.used();
            let third = reload(dir, &mut slab, &gen(2)).unwrap();
            assert_eq!(slab.used(), used, "the first configuration's blocks are reused");
            let mut reused = third.zones.clone();
            reused.sort();
            let mut old = first.zones.clone();
            old.sort();
            assert_eq!(reused, old);
            assert!((0..20).all(|z| count(&third, z) == 0), "zeroed for their new names");
            for i in 3..50 {
                reload(dir, &mut slab, &gen(i)).unwrap();
                assert_eq!(slab.used(), used, "configuration {i}");
            }
        }
    }

    /// Issue 34: a block per backend, in the order given, each found again by its name in any
    /// order; a renamed backend gets a new block, and the old one goes to a new name two
    /// configurations later, as a zone's does.
    #[test]
    fn backends_keep_their_blocks_by_name() {
        unsafe {
            let mut slab = Budget::new(64 << 10);
            let dir = create(&mut slab);
            let zones = ["q", "r"];
            let (default, regional) = (server_block("", "r:1"), server_block("regional", "r:2"));
            assert_eq!((default.as_str(), regional.as_str()), ("r:1", "name=regional r:2"));
            let a = attach(dir, &mut slab, &zones, &["r:1", "name=regional r:2"]).unwrap();
            assert_eq!((a.redis.len(), a.zones.len()), (2, 2));
            assert_ne!(a.redis[0], a.redis[1]);
            (*a.redis[0]).fetch_add(3, Relaxed);
            (*a.redis[1]).fetch_add(5, Relaxed);
            // Declared the other way round: each backend's counters follow its name.
            let b = attach(dir, &mut slab, &zones, &["name=regional r:2", "r:1"]).unwrap();
            assert_eq!((b.redis[0], b.redis[1]), (a.redis[1], a.redis[0]));
            assert_eq!(((*b.redis[0]).load(Relaxed), (*b.redis[1]).load(Relaxed)), (5, 3));
            // "regional" renamed "eu": a new block from 0, while the running workers may still
            // count to the old one.
            let used = slab.used();
            let c = attach(dir, &mut slab, &zones, &["r:1", "name=eu r:2"]).unwrap();
            assert!(slab.used() > used, "a new block for the new name");
            assert_eq!(c.redis[0], a.redis[0]);
            assert!(!a.redis.contains(&c.redis[1]));
            assert_eq!((*c.redis[1]).load(Relaxed), 0);
            // Two configurations later "regional"'s block is free, and the next new name takes
            // it, zeroed.
            attach(dir, &mut slab, &zones, &["r:1", "name=eu r:2"]).unwrap();
            let used = slab.used();
            let e = attach(dir, &mut slab, &zones, &["r:1", "name=us r:3"]).unwrap();
            assert!(slab.used() <= used, "no new block, only the new name's bytes");
            assert_eq!(e.redis[1], a.redis[1]);
            assert_eq!((*e.redis[1]).load(Relaxed), 0);
            // No backend (no ratelimit_redis) and a name given twice.
            assert!(attach(dir, &mut slab, &zones, &[]).unwrap().redis.is_empty());
            let f = attach(dir, &mut slab, &zones, &["r:9", "r:9"]).unwrap();
            assert_eq!(f.redis[0], f.redis[1], "one block for one name");
        }
    }

    #[test]
    fn a_full_zone_fails_and_the_next_configuration_continues() {
        unsafe {
            let mut slab = Budget::new(4 << 10);
            let dir = create(&mut slab);
            assert!(reload(dir, &mut slab, &names(100)).is_none(), "100 zones do not fit");
            let left = slab.left;
            assert!(reload(dir, &mut slab, &names(100)).is_none());
            assert_eq!(slab.left, left, "the same names take nothing more");
            let c = reload(dir, &mut slab, &names(5)).expect("5 zones fit in what is there");
            assert_eq!(c.zones.len(), 5);
        }
    }

    #[test]
    fn no_room_for_the_directory() {
        assert!(create(&mut Budget::new(16)).is_null());
    }
}

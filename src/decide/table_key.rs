//! A (zone, Redis key) as the worker's tables find it (the deny cache, reservations): hashed
//! once per request, the hash reused by every table and every lookup of the request.
//!
//! Keys come from clients, so the hash is SipHash keyed with a random seed of this process, as
//! std's `HashMap` would use: no client can aim collisions at one bucket. The tables are maps
//! from that hash to an entry that keeps its whole key: a second key with the same 64-bit hash
//! (which no client can find without the seed) is simply not kept, so it is decided by Redis.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher, Hasher, RandomState};
use std::sync::OnceLock;

const ZONE_LEN: usize = core::mem::size_of::<usize>();

/// One zone's key, in the parts it was built of, and its hash.
#[derive(Debug, Clone, Copy)]
pub struct TableKey<'a> {
    pub zone: usize,
    pub parts: [&'a [u8]; 4],
    pub hash: u64,
    /// Built by the zone's [`TableHead`]: the first three parts are the head's, this many bytes,
    /// the same in every key of the zone the tables hold, so only the value (`parts[3]`) is
    /// compared. `None` for a key split any other way (a whole key Redis named): all compared.
    head: Option<usize>,
}

impl<'a> TableKey<'a> {
    /// The key whose bytes are `parts` in order (at most 4), however they are split.
    pub fn new(zone: usize, parts: &[&'a [u8]]) -> Self {
        let mut all: [&[u8]; 4] = [b""; 4];
        all[..parts.len()].copy_from_slice(parts);
        TableKey { head: None, ..TableHead::new(zone, &all[..3]).key(all) }
    }

    /// The whole Redis key, as Redis names it.
    pub fn key(&self) -> Vec<u8> {
        self.parts.concat()
    }

    /// What an entry keeps: the zone index's bytes followed by the key.
    pub fn stored(&self) -> Box<[u8]> {
        let mut out =
            Vec::with_capacity(ZONE_LEN + self.parts.iter().map(|p| p.len()).sum::<usize>());
        out.extend_from_slice(&self.zone.to_ne_bytes());
        self.parts.iter().for_each(|p| out.extend_from_slice(p));
        out.into_boxed_slice()
    }

    /// Whether an entry's `stored` bytes are this key's. Every entry was stored from a
    /// request's key (`TableHead::key`), so an entry of this zone starts with the zone's head:
    /// a key built by the head compares its value only, one short compare per lookup.
    pub fn is(&self, stored: &[u8]) -> bool {
        let Some(rest) = stored.strip_prefix(&self.zone.to_ne_bytes()) else { return false };
        if let Some(head) = self.head {
            let value = self.parts[3];
            return rest.len() == head + value.len() && rest[head..] == *value;
        }
        if rest.len() != self.parts.iter().map(|p| p.len()).sum::<usize>() {
            return false;
        }
        let mut rest = rest;
        self.parts.iter().all(|p| {
            let (head, tail) = rest.split_at(p.len());
            rest = tail;
            head == *p
        })
    }
}

/// The hash of what every key of a zone starts with (the zone's index, the key prefix and the
/// zone name: the first three of `crate::decide::key::Key::parts`), taken once per worker, so
/// that a request's key hashes its own value only.
#[derive(Clone)]
pub struct TableHead {
    zone: usize,
    state: DefaultHasher,
    /// The head's length in bytes.
    len: usize,
}

impl TableHead {
    pub fn new(zone: usize, head: &[&[u8]]) -> Self {
        static SEED: OnceLock<RandomState> = OnceLock::new();
        let mut state = SEED.get_or_init(RandomState::new).build_hasher();
        state.write(&zone.to_ne_bytes());
        // A byte stream: the same key split differently hashes the same.
        head.iter().for_each(|p| state.write(p));
        TableHead { zone, state, len: head.iter().map(|p| p.len()).sum() }
    }

    /// The key of `parts`, the first three of which are this head's.
    pub fn key<'a>(&self, parts: [&'a [u8]; 4]) -> TableKey<'a> {
        let mut h = self.state.clone();
        h.write(parts[3]);
        TableKey { zone: self.zone, parts, hash: h.finish(), head: Some(self.len) }
    }
}

/// The zone of an entry's stored bytes.
pub fn stored_zone(stored: &[u8]) -> usize {
    let mut b = [0u8; ZONE_LEN];
    b.copy_from_slice(&stored[..ZONE_LEN]);
    usize::from_ne_bytes(b)
}

/// The whole Redis key of an entry's stored bytes.
pub fn stored_key(stored: &[u8]) -> &[u8] {
    &stored[ZONE_LEN..]
}

/// A map keyed by [`TableKey::hash`]: the hash is already there, nothing to compute again.
pub type ByHash<V> = HashMap<u64, V, BuildHasherDefault<Prehashed>>;

#[derive(Default)]
pub struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, _: &[u8]) {
        unreachable!("the tables are keyed by u64 hashes only");
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::deny_cache::{Denial, DenyCache};
    use crate::decide::lease::{Ask, Figures, Grant, Leases};
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    /// The system allocator, counting this thread's allocations: tests run on several threads.
    struct Counting;

    thread_local! {
        static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    }

    // SAFETY: every call is the system allocator's; the count is a side effect.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
            System.alloc(layout)
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            System.dealloc(ptr, layout)
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, size: usize) -> *mut u8 {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
            System.realloc(ptr, layout, size)
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    /// What a request admitted from a reservation, or rejected from the deny cache, does with
    /// the tables: hash its keys, spend, check. None of it may allocate.
    #[test]
    fn the_lease_and_deny_paths_allocate_nothing() {
        let figures = Figures { limit: 1000, window_ms: 60_000 };
        let heads = [0, 1].map(|zone| TableHead::new(zone, &[b"rl:", b"ip", b":"]));
        let (mut leases, mut cache) = (Leases::new(100, 0), DenyCache::new(100));
        let grant = Grant { units: 500, life_ms: 1000, token: 1, rid: 1 };
        for (z, head) in heads.iter().enumerate() {
            let key = head.key([b"rl:", b"ip", b":", b"10.0.0.1"]);
            leases.granted(&Ask { key, cost: 1, figures }, grant, 0, 100, 60_000, false, false);
            let d = Denial {
                until_ms: 5000,
                kept_until_ms: 5000,
                cost: 1,
                limit: 10,
                window_ms: 1000,
                remaining: 0,
            };
            cache.insert(&TableKey::new(z, &[b"rl:ip:10.0.0.2"]), d);
        }
        let before = ALLOCATIONS.with(Cell::get);
        for now in 1..100 {
            let keys = heads.each_ref().map(|h| h.key([b"rl:", b"ip", b":", b"10.0.0.1"]));
            let asks = keys.map(|key| Ask { key, cost: 1, figures });
            assert!(leases.try_spend(asks, now).is_some());
            let denied = TableKey::new(1, &[b"rl:", b"ip", b":", b"10.0.0.2"]);
            assert!(cache.check(&denied, 1, 10, 1000, now).is_some());
        }
        assert_eq!(ALLOCATIONS.with(Cell::get), before);
    }

    #[test]
    fn a_key_is_its_bytes_however_split() {
        let whole = TableKey::new(3, &[b"rl:api:bob"]);
        let parts = TableKey::new(3, &[b"rl:", b"api", b":", b"bob"]);
        assert_eq!(whole.hash, parts.hash);
        assert!(parts.is(&whole.stored()) && whole.is(&parts.stored()));
        assert_eq!(stored_zone(&whole.stored()), 3);
        assert_eq!(stored_key(&whole.stored()), b"rl:api:bob");
        assert_eq!(parts.key(), b"rl:api:bob");
        for other in [TableKey::new(4, &[b"rl:api:bob"]), TableKey::new(3, &[b"rl:api:bo"])] {
            assert_ne!(other.hash, whole.hash);
            assert!(!other.is(&whole.stored()));
        }
        assert!(!TableKey::new(3, &[b"rl:api:bo", b"c"]).is(&whole.stored()));
        let head = TableHead::new(3, &[b"rl:", b"api", b":"]);
        let headed = head.key([b"rl:", b"api", b":", b"bob"]);
        assert_eq!(headed.hash, whole.hash);
        // The invalidation path finds a request's entry by the whole key, and the other way.
        assert!(whole.is(&headed.stored()) && headed.is(&whole.stored()));
        for other in ["bo", "bobs", "eve"].map(|v| head.key([b"rl:", b"api", b":", v.as_bytes()])) {
            assert!(!other.is(&headed.stored()) && !headed.is(&other.stored()));
        }
        let other_zone = TableHead::new(4, &[b"rl:", b"api", b":"]);
        assert!(!other_zone.key([b"rl:", b"api", b":", b"bob"]).is(&headed.stored()));
    }
}

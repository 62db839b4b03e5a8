//! Per-worker memory of recent rejections, so that a client that keeps hitting a limit it has
//! already exhausted is answered 429 locally instead of costing a Redis round trip per request.
//!
//! None of the algorithms frees a unit before the retry-after Redis reported, so until then every
//! request of the same zone and key that costs at least as much, under the same limit and window,
//! would be rejected by Redis too — unless the key changes in Redis meanwhile (an operator's reset,
//! `FLUSHALL`, a new balance). An empty balance frees nothing with time at all, only such a change
//! refills it, so its rejection holds until then. An entry is kept only while Redis tracks its key
//! for the worker
//! (`crate::redis::invalidation`), and forgotten when Redis says the key changed. Limit and window
//! are compared because they can come from per-request variables. Keys are whole Redis keys, as
//! Redis names them in its invalidations.

use crate::decide::table_key::{ByHash, TableKey};

/// One remembered rejection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denial {
    /// Monotonic time at which the rejection lapses. It should be the retry-after added to the time
    /// the request was sent to Redis, not to the time the reply arrived, so that the local rejection
    /// never outlasts the one Redis computed.
    pub until_ms: u64,
    /// Monotonic time until which it may be answered from memory: `until_ms`, or sooner when
    /// Redis does not tell this worker of changes to the key.
    pub kept_until_ms: u64,
    /// Units the rejected request asked for: a cheaper request may still fit.
    pub cost: u64,
    pub limit: u64,
    pub window_ms: u64,
    /// The units Redis said were left: repeated as they were, never made up.
    pub remaining: u64,
}

/// `Denial::until_ms` of an empty balance: no time refills it, only a write Redis tells of.
pub const UNTIL_CHANGED: u64 = u64::MAX;

/// A rejection answered from memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    /// Until the rejection lapses; 0 for an empty balance, which no wait refills.
    pub left_ms: u64,
    /// What Redis said was left when it rejected.
    pub remaining: u64,
}

/// Marks the absent neighbour at either end of the recency list.
const NIL: usize = usize::MAX;

struct Slot {
    /// `TableKey::stored`, which the lookup compares, and its hash, the map's key.
    key: Box<[u8]>,
    hash: u64,
    denial: Denial,
    /// Neighbour towards the most recently used end.
    prev: usize,
    /// Neighbour towards the least recently used end.
    next: usize,
}

/// A bounded map from (zone, key) to the last rejection, evicting the least recently used entry.
///
/// Memory: at most `capacity` entries, each costing its key plus `size_of::<usize>()` bytes of
/// zone index, plus about 120 bytes of overhead on 64-bit targets (a 64-byte slot, a 24-byte
/// hash-table bucket and its control byte at up to 7/8 load, the 16-byte reference counts of the
/// key's allocation) and allocator rounding. Nothing is reserved up front, so a large capacity
/// costs only what is used, but the slot vector and hash table grow by doubling: right after they
/// do, their spare room adds up to about 90 bytes per entry.
pub struct DenyCache {
    /// The key's hash (keyed SipHash, `crate::decide::table_key`) to its slot, which holds the
    /// key itself.
    map: ByHash<usize>,
    /// Kept dense (removal moves the last slot into the hole), so its length is the entry count.
    slots: Vec<Slot>,
    /// Most recently used slot.
    head: usize,
    /// Least recently used slot, the next victim.
    tail: usize,
    capacity: usize,
}

impl DenyCache {
    /// A cache of at most `capacity` entries; a capacity of 0 is taken as 1, as a worker that
    /// panics on a bad size would only abort.
    pub fn new(capacity: usize) -> Self {
        DenyCache {
            map: ByHash::default(),
            slots: Vec::new(),
            head: NIL,
            tail: NIL,
            capacity: capacity.max(1),
        }
    }

    /// Remembers a rejection of `key`, replacing any previous one, evicting the least recently
    /// used entry when full. A key whose hash another key holds is not remembered.
    pub fn insert(&mut self, key: &TableKey<'_>, denial: Denial) {
        match self.map.get(&key.hash) {
            Some(&i) if key.is(&self.slots[i].key) => {
                self.slots[i].denial = denial;
                self.touch(i);
                return;
            }
            Some(_) => return,
            None => {}
        }
        let (stored, hash) = (key.stored(), key.hash);
        let i = if self.slots.len() < self.capacity {
            self.slots.push(Slot { key: stored, hash, denial, prev: NIL, next: NIL });
            let i = self.slots.len() - 1;
            self.link_front(i);
            i
        } else {
            // Reusing the victim's slot in place avoids shuffling the dense slot vector.
            let i = self.tail;
            self.map.remove(&self.slots[i].hash);
            (self.slots[i].key, self.slots[i].hash) = (stored, hash);
            self.slots[i].denial = denial;
            self.touch(i);
            i
        };
        self.map.insert(hash, i);
    }

    /// The remembered rejection of `key`, and the time left on it, if it also applies to a
    /// request of `cost` units under `limit` per `window_ms` at monotonic time `now_ms`. An
    /// expired entry is dropped; a hit makes the entry the most recently used. Allocates nothing.
    pub fn check(
        &mut self,
        key: &TableKey<'_>,
        cost: u64,
        limit: u64,
        window_ms: u64,
        now_ms: u64,
    ) -> Option<Hit> {
        let i = self.find(key)?;
        let d = self.slots[i].denial;
        if d.kept_until_ms.min(d.until_ms) <= now_ms {
            self.remove(i);
            return None;
        }
        if cost < d.cost || limit != d.limit || window_ms != d.window_ms {
            // Still valid for the requests it describes, so it stays, without gaining recency.
            return None;
        }
        self.touch(i);
        let left_ms = if d.until_ms == UNTIL_CHANGED { 0 } else { d.until_ms - now_ms };
        Some(Hit { left_ms, remaining: d.remaining })
    }

    /// Drops what is remembered of `key`.
    pub fn forget(&mut self, key: &TableKey<'_>) {
        if let Some(i) = self.find(key) {
            self.remove(i);
        }
    }

    /// Drops everything.
    pub fn clear(&mut self) {
        self.map.clear();
        self.slots.clear();
        (self.head, self.tail) = (NIL, NIL);
    }

    /// Number of entries, expired ones included until they are checked or evicted.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    fn find(&self, key: &TableKey<'_>) -> Option<usize> {
        self.map.get(&key.hash).copied().filter(|&i| key.is(&self.slots[i].key))
    }

    fn remove(&mut self, i: usize) {
        self.unlink(i);
        let gone = self.slots.swap_remove(i);
        self.map.remove(&gone.hash);
        if i == self.slots.len() {
            return;
        }
        // The former last slot now sits at `i`: repoint its neighbours and its map entry.
        let (prev, next) = (self.slots[i].prev, self.slots[i].next);
        if prev == NIL {
            self.head = i;
        } else {
            self.slots[prev].next = i;
        }
        if next == NIL {
            self.tail = i;
        } else {
            self.slots[next].prev = i;
        }
        *self.map.get_mut(&self.slots[i].hash).expect("every slot has a map entry") = i;
    }

    /// Makes slot `i` the most recently used.
    fn touch(&mut self, i: usize) {
        if self.head != i {
            self.unlink(i);
            self.link_front(i);
        }
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.slots[i].prev, self.slots[i].next);
        if prev == NIL {
            self.head = next;
        } else {
            self.slots[prev].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.slots[next].prev = prev;
        }
    }

    fn link_front(&mut self, i: usize) {
        self.slots[i].prev = NIL;
        self.slots[i].next = self.head;
        if self.head == NIL {
            self.tail = i;
        } else {
            self.slots[self.head].prev = i;
        }
        self.head = i;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denial(until_ms: u64, cost: u64) -> Denial {
        Denial { until_ms, kept_until_ms: until_ms, cost, limit: 10, window_ms: 1000, remaining: 0 }
    }

    /// Whether `key` in `zone` hits with the defaults of `denial` at time 0.
    fn hits(c: &mut DenyCache, zone: usize, key: &[u8]) -> bool {
        c.check(&TableKey::new(zone, &[key]), 1, 10, 1000, 0).is_some()
    }

    /// The entries from most to least recently used, after checking every structural invariant.
    fn order(c: &DenyCache) -> Vec<(Vec<u8>, Denial)> {
        assert!(c.slots.len() <= c.capacity);
        assert_eq!(c.map.len(), c.slots.len());
        let mut out = Vec::new();
        let (mut prev, mut i) = (NIL, c.head);
        while i != NIL {
            let s = &c.slots[i];
            assert_eq!(s.prev, prev);
            assert_eq!(c.map[&s.hash], i);
            out.push((s.key.to_vec(), s.denial));
            assert!(out.len() <= c.slots.len(), "cycle in the recency list");
            (prev, i) = (i, s.next);
        }
        assert_eq!(c.tail, prev);
        assert_eq!(out.len(), c.slots.len());
        out
    }

    fn full_key(zone: usize, key: &[u8]) -> Vec<u8> {
        [&zone.to_ne_bytes()[..], key].concat()
    }

    #[test]
    fn hit_and_miss() {
        let mut c = DenyCache::new(4);
        assert_eq!(c.check(&TableKey::new(0, &[b"a"]), 1, 10, 1000, 0), None);
        c.insert(&TableKey::new(0, &[b"a"]), denial(500, 1));
        assert_eq!(
            c.check(&TableKey::new(0, &[b"a"]), 1, 10, 1000, 100).map(|h| h.left_ms),
            Some(400)
        );
        assert_eq!(
            c.check(&TableKey::new(0, &[b"a"]), 1, 10, 1000, 499).map(|h| h.left_ms),
            Some(1)
        );
        assert_eq!(c.check(&TableKey::new(0, &[b"b"]), 1, 10, 1000, 100), None);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn expired_entries_miss_and_are_removed() {
        let mut c = DenyCache::new(4);
        c.insert(&TableKey::new(0, &[b"a"]), denial(500, 1));
        c.insert(&TableKey::new(0, &[b"b"]), denial(900, 1));
        assert_eq!(c.check(&TableKey::new(0, &[b"a"]), 1, 10, 1000, 500), None);
        assert_eq!(c.len(), 1);
        assert_eq!(order(&c), [(full_key(0, b"b"), denial(900, 1))]);
        assert_eq!(c.check(&TableKey::new(0, &[b"a"]), 1, 10, 1000, 0), None);
        assert_eq!(c.check(&TableKey::new(0, &[b"b"]), 1, 10, 1000, 1000), None);
        assert_eq!(c.len(), 0);
        order(&c);
    }

    #[test]
    fn cheaper_requests_miss_and_keep_the_entry() {
        let mut c = DenyCache::new(4);
        c.insert(&TableKey::new(0, &[b"a"]), denial(500, 3));
        assert_eq!(c.check(&TableKey::new(0, &[b"a"]), 2, 10, 1000, 0), None);
        assert_eq!(c.len(), 1);
        assert_eq!(
            c.check(&TableKey::new(0, &[b"a"]), 3, 10, 1000, 0).map(|h| h.left_ms),
            Some(500)
        );
        assert_eq!(
            c.check(&TableKey::new(0, &[b"a"]), 7, 10, 1000, 0).map(|h| h.left_ms),
            Some(500)
        );
    }

    #[test]
    fn other_limit_or_window_misses() {
        let mut c = DenyCache::new(4);
        c.insert(&TableKey::new(0, &[b"a"]), denial(500, 1));
        assert_eq!(c.check(&TableKey::new(0, &[b"a"]), 1, 11, 1000, 0), None);
        assert_eq!(c.check(&TableKey::new(0, &[b"a"]), 1, 9, 1000, 0), None);
        assert_eq!(c.check(&TableKey::new(0, &[b"a"]), 1, 10, 999, 0), None);
        assert_eq!(c.check(&TableKey::new(0, &[b"a"]), 1, 10, 1001, 0), None);
        assert_eq!(c.len(), 1);
        assert_eq!(
            c.check(&TableKey::new(0, &[b"a"]), 1, 10, 1000, 0).map(|h| h.left_ms),
            Some(500)
        );
    }

    #[test]
    fn insert_replaces() {
        let mut c = DenyCache::new(4);
        c.insert(&TableKey::new(0, &[b"a"]), denial(500, 5));
        c.insert(
            &TableKey::new(0, &[b"a"]),
            Denial {
                until_ms: 300,
                kept_until_ms: 300,
                cost: 1,
                limit: 20,
                window_ms: 60,
                remaining: 0,
            },
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c.check(&TableKey::new(0, &[b"a"]), 5, 10, 1000, 0), None);
        assert_eq!(
            c.check(&TableKey::new(0, &[b"a"]), 1, 20, 60, 100).map(|h| h.left_ms),
            Some(200)
        );
    }

    #[test]
    fn evicts_the_least_recently_used() {
        let mut c = DenyCache::new(3);
        c.insert(&TableKey::new(0, &[b"a"]), denial(500, 1));
        c.insert(&TableKey::new(0, &[b"b"]), denial(500, 1));
        c.insert(&TableKey::new(0, &[b"c"]), denial(500, 1));
        // A hit refreshes "a", so "b" is now the oldest.
        assert!(hits(&mut c, 0, b"a"));
        c.insert(&TableKey::new(0, &[b"d"]), denial(500, 1));
        assert_eq!(c.len(), 3);
        assert!(!hits(&mut c, 0, b"b"));
        // Replacing refreshes too: "c" becomes the newest, leaving "a" the oldest.
        c.insert(&TableKey::new(0, &[b"c"]), denial(600, 1));
        c.insert(&TableKey::new(0, &[b"e"]), denial(500, 1));
        let keys: Vec<_> = order(&c).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, [full_key(0, b"e"), full_key(0, b"c"), full_key(0, b"d")]);
    }

    #[test]
    fn misses_do_not_refresh() {
        let mut c = DenyCache::new(2);
        c.insert(&TableKey::new(0, &[b"a"]), denial(500, 5));
        c.insert(&TableKey::new(0, &[b"b"]), denial(500, 1));
        assert_eq!(c.check(&TableKey::new(0, &[b"a"]), 1, 10, 1000, 0), None);
        c.insert(&TableKey::new(0, &[b"c"]), denial(500, 1));
        assert!(!hits(&mut c, 0, b"a"));
        assert!(hits(&mut c, 0, b"b"));
    }

    #[test]
    fn capacity_one() {
        for cap in [0, 1] {
            let mut c = DenyCache::new(cap);
            c.insert(&TableKey::new(0, &[b"a"]), denial(500, 1));
            assert!(hits(&mut c, 0, b"a"));
            c.insert(&TableKey::new(0, &[b"b"]), denial(500, 1));
            assert_eq!(c.len(), 1);
            assert!(!hits(&mut c, 0, b"a"));
            assert!(hits(&mut c, 0, b"b"));
            c.insert(&TableKey::new(0, &[b"b"]), denial(700, 1));
            assert_eq!(order(&c), [(full_key(0, b"b"), denial(700, 1))]);
        }
    }

    #[test]
    fn zones_and_keys_are_distinct() {
        let mut c = DenyCache::new(8);
        c.insert(&TableKey::new(0, &[b"a"]), denial(100, 1));
        c.insert(&TableKey::new(0, &[b"b"]), denial(200, 1));
        c.insert(&TableKey::new(1, &[b"a"]), denial(300, 1));
        c.insert(&TableKey::new(256, &[b"a"]), denial(400, 1));
        // The zone prefix has a fixed width, so moving bytes between zone and key cannot collide.
        c.insert(&TableKey::new(0, &[b""]), denial(500, 1));
        assert_eq!(
            c.check(&TableKey::new(0, &[b"a"]), 1, 10, 1000, 0).map(|h| h.left_ms),
            Some(100)
        );
        assert_eq!(
            c.check(&TableKey::new(0, &[b"b"]), 1, 10, 1000, 0).map(|h| h.left_ms),
            Some(200)
        );
        assert_eq!(
            c.check(&TableKey::new(1, &[b"a"]), 1, 10, 1000, 0).map(|h| h.left_ms),
            Some(300)
        );
        assert_eq!(
            c.check(&TableKey::new(256, &[b"a"]), 1, 10, 1000, 0).map(|h| h.left_ms),
            Some(400)
        );
        assert_eq!(
            c.check(&TableKey::new(0, &[b""]), 1, 10, 1000, 0).map(|h| h.left_ms),
            Some(500)
        );
        assert_eq!(c.check(&TableKey::new(1, &[b"b"]), 1, 10, 1000, 0), None);
        assert_eq!(c.check(&TableKey::new(2, &[b"a"]), 1, 10, 1000, 0), None);
        assert_eq!(c.len(), 5);
    }

    /// The obvious implementation: a list from most to least recently used.
    struct Model {
        capacity: usize,
        entries: Vec<(Vec<u8>, Denial)>,
    }

    impl Model {
        fn insert(&mut self, zone: usize, key: &[u8], d: Denial) {
            let k = full_key(zone, key);
            self.entries.retain(|(e, _)| *e != k);
            if self.entries.len() == self.capacity {
                self.entries.pop();
            }
            self.entries.insert(0, (k, d));
        }

        fn check(
            &mut self,
            zone: usize,
            key: &[u8],
            cost: u64,
            limit: u64,
            window_ms: u64,
            now: u64,
        ) -> Option<Hit> {
            let k = full_key(zone, key);
            let pos = self.entries.iter().position(|(e, _)| *e == k)?;
            let d = self.entries[pos].1;
            if d.until_ms <= now {
                self.entries.remove(pos);
                None
            } else if cost >= d.cost && limit == d.limit && window_ms == d.window_ms {
                let e = self.entries.remove(pos);
                self.entries.insert(0, e);
                Some(Hit { left_ms: d.until_ms - now, remaining: d.remaining })
            } else {
                None
            }
        }
    }

    #[test]
    fn matches_a_naive_model() {
        // A small deterministic xorshift keeps this test free of a rand dependency.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut rng = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let keys: [&[u8]; 6] = [b"", b"a", b"b", b"ab", b"consumer-42", &[0, 1, 2, 255]];
        for capacity in [1, 2, 3, 5, 8, 16] {
            let mut c = DenyCache::new(capacity);
            let mut m = Model { capacity, entries: Vec::new() };
            let mut now = 0;
            for _ in 0..10_000 {
                now += rng(20);
                let zone = rng(3) as usize;
                let key = keys[rng(keys.len() as u64) as usize];
                let (cost, limit, window_ms) = (1 + rng(3), 10 + rng(2), 1000 + rng(2));
                if rng(3) == 0 {
                    let (until_ms, remaining) = (now + rng(300), rng(3));
                    let d = Denial {
                        until_ms,
                        kept_until_ms: until_ms,
                        cost,
                        limit,
                        window_ms,
                        remaining,
                    };
                    c.insert(&TableKey::new(zone, &[key]), d);
                    m.insert(zone, key, d);
                } else {
                    assert_eq!(
                        c.check(&TableKey::new(zone, &[key]), cost, limit, window_ms, now),
                        m.check(zone, key, cost, limit, window_ms, now)
                    );
                }
                assert_eq!(c.len(), m.entries.len());
                assert_eq!(order(&c), m.entries);
            }
        }
    }
}

#[cfg(test)]
mod forgetting {
    use super::*;

    #[test]
    fn keys_are_their_parts_and_can_be_forgotten() {
        let d = Denial {
            until_ms: 500,
            kept_until_ms: 500,
            cost: 1,
            limit: 10,
            window_ms: 1000,
            remaining: 0,
        };
        let mut c = DenyCache::new(4);
        c.insert(&TableKey::new(0, &[b"rl:", b"api", b":", b"bob"]), d);
        c.insert(&TableKey::new(1, &[b"rl:api:bob"]), d);
        c.insert(&TableKey::new(0, &[b"rl:api:eve"]), d);
        // Parts or whole, the same key.
        assert!(c.check(&TableKey::new(0, &[b"rl:api:bob"]), 1, 10, 1000, 0).is_some());
        c.forget(&TableKey::new(0, &[b"rl:api:bob"]));
        assert_eq!(c.check(&TableKey::new(0, &[b"rl:api:bob"]), 1, 10, 1000, 0), None);
        assert!(c.check(&TableKey::new(1, &[b"rl:api:bob"]), 1, 10, 1000, 0).is_some());
        c.clear();
        assert_eq!(c.len(), 0);
        assert_eq!(c.check(&TableKey::new(0, &[b"rl:api:eve"]), 1, 10, 1000, 0), None);
        c.insert(&TableKey::new(0, &[b"x"]), d);
        assert_eq!(c.len(), 1);
        // Kept briefly, it still reports the whole wait.
        c.insert(&TableKey::new(0, &[b"y"]), Denial { kept_until_ms: 100, ..d });
        assert_eq!(
            c.check(&TableKey::new(0, &[b"y"]), 1, 10, 1000, 50).map(|h| h.left_ms),
            Some(450)
        );
        assert_eq!(c.check(&TableKey::new(0, &[b"y"]), 1, 10, 1000, 100), None);
    }

    #[test]
    fn an_empty_balance_holds_until_forgotten_and_repeats_what_redis_said() {
        let d = Denial {
            until_ms: UNTIL_CHANGED,
            kept_until_ms: UNTIL_CHANGED,
            cost: 2,
            limit: 3,
            window_ms: 1000,
            remaining: 1,
        };
        let mut c = DenyCache::new(4);
        c.insert(&TableKey::new(0, &[b"rl:credits:bob"]), d);
        let hit = Hit { left_ms: 0, remaining: 1 };
        assert_eq!(c.check(&TableKey::new(0, &[b"rl:credits:bob"]), 2, 3, 1000, 0), Some(hit));
        assert_eq!(
            c.check(&TableKey::new(0, &[b"rl:credits:bob"]), 2, 3, 1000, u64::MAX / 2),
            Some(hit)
        );
        // A top-up: Redis says the key changed.
        c.forget(&TableKey::new(0, &[b"rl:credits:bob"]));
        assert_eq!(c.check(&TableKey::new(0, &[b"rl:credits:bob"]), 2, 3, 1000, 0), None);
    }
}

//! A (zone, Redis key) as the worker's tables find it (the deny cache, reservations): hashed
//! once per request, the hash reused by every table and every lookup of the request.
//!
//! Keys come from clients, so the hash is SipHash keyed with a random seed of this process, as
//! std's `HashMap` would use: no client can aim collisions at one bucket. The tables are maps
//! from that hash to an entry that keeps its whole key: a second key with the same 64-bit hash
//! (which no client can find without the seed) is simply not kept, so it is decided by Redis.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::OnceLock;

const ZONE_LEN: usize = core::mem::size_of::<usize>();

/// One zone's key, in the parts it was built of, and its hash.
#[derive(Debug, Clone, Copy)]
pub struct TableKey<'a> {
    pub zone: usize,
    pub parts: [&'a [u8]; 4],
    pub hash: u64,
}

impl<'a> TableKey<'a> {
    /// The key whose bytes are `parts` in order (at most 4), however they are split.
    pub fn new(zone: usize, parts: &[&'a [u8]]) -> Self {
        let mut all: [&[u8]; 4] = [b""; 4];
        all[..parts.len()].copy_from_slice(parts);
        static SEED: OnceLock<RandomState> = OnceLock::new();
        let mut h = SEED.get_or_init(RandomState::new).build_hasher();
        h.write(&zone.to_ne_bytes());
        // A byte stream: the same key split differently hashes the same.
        all.iter().for_each(|p| h.write(p));
        TableKey { zone, parts: all, hash: h.finish() }
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

    /// Whether an entry's `stored` bytes are this key's.
    pub fn is(&self, stored: &[u8]) -> bool {
        let len = self.parts.iter().map(|p| p.len()).sum::<usize>();
        if stored.len() != ZONE_LEN + len || stored[..ZONE_LEN] != self.zone.to_ne_bytes() {
            return false;
        }
        let mut rest = &stored[ZONE_LEN..];
        self.parts.iter().all(|p| {
            let (head, tail) = rest.split_at(p.len());
            rest = tail;
            head == *p
        })
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
    }
}

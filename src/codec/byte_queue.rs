//! A queue of byte strings (keys, replies) in one buffer, each with a tag: what a worker keeps
//! between events (keys whose `EXISTS` is on the wire, invalidations to hear, a tracker's
//! replies) without a heap allocation per string. Its buffers keep their capacity: once a
//! worker's traffic has sized them, queueing allocates nothing.

use std::collections::VecDeque;

#[derive(Debug)]
pub struct ByteQueue<T> {
    bytes: Vec<u8>,
    /// Each string's length and tag, in order.
    items: VecDeque<(usize, T)>,
    /// Where the first string not yet taken starts in `bytes`.
    at: usize,
}

impl<T> Default for ByteQueue<T> {
    fn default() -> Self {
        ByteQueue { bytes: Vec::new(), items: VecDeque::new(), at: 0 }
    }
}

/// Bytes of taken strings left before the rest is moved to the front: a queue that is never
/// empty (a tracker under steady traffic) would otherwise grow without bound.
const COMPACT_AT: usize = 4096;

impl<T: Copy> ByteQueue<T> {
    /// Appends the string made of `parts` (a key's parts: joined here, never apart).
    pub fn push(&mut self, parts: &[&[u8]], tag: T) {
        if self.items.is_empty() {
            self.bytes.clear();
            self.at = 0;
        } else if self.at >= COMPACT_AT && self.at * 2 >= self.bytes.len() {
            self.bytes.drain(..self.at);
            self.at = 0;
        }
        let start = self.bytes.len();
        parts.iter().for_each(|p| self.bytes.extend_from_slice(p));
        self.items.push_back((self.bytes.len() - start, tag));
    }

    /// Takes the oldest string and its tag.
    pub fn pop_front(&mut self) -> Option<(&[u8], T)> {
        let (len, tag) = self.items.pop_front()?;
        let start = self.at;
        self.at += len;
        Some((&self.bytes[start..self.at], tag))
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Empties it, its capacity kept.
    pub fn clear(&mut self) {
        self.items.clear();
        self.bytes.clear();
        self.at = 0;
    }

    /// Takes back the buffers of `used`, a queue taken out whole (`mem::take`) by a reader that
    /// must not hold this one while it handles each string (which may queue more), when nothing
    /// was queued meanwhile.
    pub fn recycle(&mut self, mut used: ByteQueue<T>) {
        if self.is_empty() && self.bytes.capacity() <= used.bytes.capacity() {
            used.clear();
            *self = used;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_in_order_with_their_tags() {
        let mut q = ByteQueue::default();
        q.push(&[b"rl:", b"api:", b"k1"], 1);
        q.push(&[b""], 2);
        q.push(&[b"k3"], 3);
        assert_eq!(q.len(), 3);
        assert_eq!(q.pop_front(), Some((&b"rl:api:k1"[..], 1)));
        assert_eq!(q.pop_front(), Some((&b""[..], 2)));
        q.push(&[b"k4"], 4);
        assert_eq!(q.pop_front(), Some((&b"k3"[..], 3)));
        assert_eq!(q.pop_front(), Some((&b"k4"[..], 4)));
        assert_eq!(q.pop_front(), None);
        assert!(q.is_empty());
    }

    #[test]
    fn never_empty_yet_bounded() {
        // One string always waiting, as a tracker's EXISTS under steady traffic.
        let mut q = ByteQueue::default();
        q.push(&[&[7u8; 100][..]], ());
        for _ in 0..10_000 {
            q.push(&[&[7u8; 100][..]], ());
            assert_eq!(q.pop_front().map(|(b, _)| b.len()), Some(100));
        }
        assert_eq!(q.len(), 1);
        assert!(q.bytes.len() <= 2 * COMPACT_AT + 200, "{}", q.bytes.len());
    }

    #[test]
    fn capacity_kept() {
        let mut q = ByteQueue::default();
        q.push(&[&[1u8; 64][..]], ());
        let mut taken = core::mem::take(&mut q);
        let cap = taken.bytes.capacity();
        assert_eq!(taken.pop_front().map(|(b, _)| b.len()), Some(64));
        q.recycle(taken);
        assert!(q.is_empty() && q.bytes.capacity() == cap);
        q.push(&[&[1u8; 64][..]], ());
        assert_eq!(q.bytes.capacity(), cap);
        // Queued meanwhile: what was queued stays.
        let taken = core::mem::take(&mut q);
        q.push(&[b"new"], ());
        q.recycle(taken);
        assert_eq!(q.pop_front(), Some((&b"new"[..], ())));
    }
}

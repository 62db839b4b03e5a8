//! A Redis key copied out of a request or a table for what outlives them (a give-back, a
//! settlement): its buffer is taken from, and given back to, a few kept by the worker, so that
//! returning units allocates nothing once the worker has run a while.

use core::cell::RefCell;
use core::ops::Deref;

/// Buffers kept between give-backs: more at once than this allocate the rest.
const KEPT: usize = 64;
/// A longer key's buffer is freed rather than kept, so that what is kept stays small.
const KEPT_CAPACITY: usize = 1024;

thread_local! {
    static SPARE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

#[derive(Debug, PartialEq, Eq)]
pub struct KeyBuf(Vec<u8>);

impl KeyBuf {
    /// The key made of `parts`, one after the other.
    pub fn of(parts: &[&[u8]]) -> KeyBuf {
        let mut buf = SPARE.with(|s| s.borrow_mut().pop()).unwrap_or_default();
        buf.clear();
        parts.iter().for_each(|p| buf.extend_from_slice(p));
        KeyBuf(buf)
    }
}

impl Clone for KeyBuf {
    fn clone(&self) -> KeyBuf {
        KeyBuf::of(&[&self.0])
    }
}

impl Deref for KeyBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for KeyBuf {
    fn drop(&mut self) {
        let buf = core::mem::take(&mut self.0);
        if (1..=KEPT_CAPACITY).contains(&buf.capacity()) {
            // At the thread's exit the list may be gone already: the buffer is freed.
            let _ = SPARE.try_with(|s| {
                let mut s = s.borrow_mut();
                if s.len() < KEPT {
                    s.push(buf);
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again() {
        let a = KeyBuf::of(&[b"rl:api:", b"alice"]);
        assert_eq!(&*a, b"rl:api:alice");
        let at = a.as_ptr();
        drop(a);
        let b = KeyBuf::of(&[b"rl:api:bob"]);
        assert_eq!((&*b, b.as_ptr()), (&b"rl:api:bob"[..], at), "the same buffer");
        let c = b.clone();
        assert_eq!(c, b);
        assert_ne!(c.as_ptr(), b.as_ptr());
    }

    #[test]
    fn long_keys_and_too_many_are_not_kept() {
        let long = KeyBuf::of(&[&[b'k'; KEPT_CAPACITY + 1]]);
        let at = long.as_ptr();
        drop(long);
        assert_ne!(KeyBuf::of(&[b"k"]).as_ptr(), at);
        let many: Vec<KeyBuf> = (0..KEPT + 10).map(|_| KeyBuf::of(&[b"k"])).collect();
        drop(many);
        assert_eq!(SPARE.with(|s| s.borrow().len()), KEPT);
    }
}

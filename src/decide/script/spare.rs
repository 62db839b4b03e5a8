//! Room a worker keeps between decisions for their encoded arguments and their replies'
//! verdicts: once it is warm, an exact decision allocates nothing (issue 30). Bounded, so that a
//! burst of long keys or many zones leaves no large buffers behind.

use super::ZoneVerdict;

/// Argument buffers kept: about the decisions a worker has on their way at once.
const ARGS_KEPT: usize = 64;
/// A buffer that grew past this (a long key) is freed, not kept.
const ARGS_KEPT_BYTES: usize = 1024;
/// Verdicts kept room for: more zones than a location names in practice.
const VERDICTS_KEPT: usize = 16;

#[derive(Default)]
pub struct Spare {
    args: Vec<Vec<u8>>,
    verdicts: Vec<ZoneVerdict>,
}

impl Spare {
    /// An empty buffer for a decision's arguments, with room if one was kept.
    pub fn args(&mut self) -> Vec<u8> {
        self.args.pop().unwrap_or_default()
    }

    /// A decision's arguments, done with: their room is kept for the next one.
    pub fn keep_args(&mut self, mut bytes: Vec<u8>) {
        if self.args.len() < ARGS_KEPT && (1..=ARGS_KEPT_BYTES).contains(&bytes.capacity()) {
            bytes.clear();
            self.args.push(bytes);
        }
    }

    /// An empty list for a reply's verdicts, with room if some was kept.
    pub fn verdicts(&mut self) -> Vec<ZoneVerdict> {
        core::mem::take(&mut self.verdicts)
    }

    /// A decision's verdicts, done with.
    pub fn keep_verdicts(&mut self, mut verdicts: Vec<ZoneVerdict>) {
        if verdicts.capacity() <= VERDICTS_KEPT && verdicts.capacity() > self.verdicts.capacity() {
            verdicts.clear();
            self.verdicts = verdicts;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_reused_and_bounded() {
        let mut s = Spare::default();
        assert_eq!(s.args().capacity(), 0, "nothing kept yet");
        let mut b = Vec::with_capacity(200);
        b.extend_from_slice(b"*1\r\n");
        let at = b.as_ptr();
        s.keep_args(b);
        let again = s.args();
        assert_eq!((again.as_ptr(), again.len()), (at, 0), "the same room, emptied");
        s.keep_args(Vec::with_capacity(ARGS_KEPT_BYTES + 1));
        s.keep_args(Vec::new());
        assert_eq!(s.args().capacity(), 0, "neither a grown buffer nor an empty one is kept");
        (0..ARGS_KEPT + 5).for_each(|_| s.keep_args(Vec::with_capacity(64)));
        assert_eq!(s.args.len(), ARGS_KEPT);

        let v = Vec::with_capacity(2);
        let at = v.as_ptr();
        s.keep_verdicts(v);
        let again = s.verdicts();
        assert_eq!(again.as_ptr(), at);
        assert_eq!(s.verdicts().capacity(), 0, "taken: none left");
        s.keep_verdicts(Vec::with_capacity(VERDICTS_KEPT + 1));
        assert_eq!(s.verdicts().capacity(), 0);
    }
}

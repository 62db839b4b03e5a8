//! Room a worker keeps between decisions for their encoded arguments and their replies'
//! verdicts: once it is warm, an exact decision allocates nothing (issue 30). Bounded, so that a
//! burst of long keys or many zones leaves no large buffers behind.

use super::ZoneVerdict;
use crate::codec::buffers::Buffers;

/// Argument buffers kept: about the decisions a worker has on their way at once.
const ARGS_KEPT: usize = 64;
/// A buffer that grew past this (a long key) is freed, not kept.
const ARGS_KEPT_BYTES: usize = 1024;
/// Verdicts a kept list has room for: more zones than a location names in practice.
const VERDICTS_KEPT: usize = 16;
/// Lists of verdicts kept: a decision on several backends holds one per backend and one for
/// them all at once.
const VERDICT_LISTS_KEPT: usize = 8;

pub struct Spare {
    args: Buffers,
    verdicts: Vec<Vec<ZoneVerdict>>,
}

impl Default for Spare {
    fn default() -> Self {
        Spare { args: Buffers::new(ARGS_KEPT, ARGS_KEPT_BYTES), verdicts: Vec::new() }
    }
}

impl Spare {
    /// An empty buffer for a decision's arguments, with room if one was kept.
    pub fn args(&mut self) -> Vec<u8> {
        self.args.take()
    }

    /// A decision's arguments, done with: their room is kept for the next one.
    pub fn keep_args(&mut self, bytes: Vec<u8>) {
        self.args.keep(bytes);
    }

    /// An empty list for a reply's verdicts, with room if some was kept.
    pub fn verdicts(&mut self) -> Vec<ZoneVerdict> {
        self.verdicts.pop().unwrap_or_default()
    }

    /// A decision's verdicts, done with.
    pub fn keep_verdicts(&mut self, mut verdicts: Vec<ZoneVerdict>) {
        let room = verdicts.capacity();
        if room > 0 && room <= VERDICTS_KEPT && self.verdicts.len() < VERDICT_LISTS_KEPT {
            verdicts.clear();
            self.verdicts.push(verdicts);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_room_is_reused_and_bounded() {
        let mut s = Spare::default();
        let v = Vec::with_capacity(2);
        let at = v.as_ptr();
        s.keep_verdicts(v);
        let again = s.verdicts();
        assert_eq!(again.as_ptr(), at);
        assert_eq!(s.verdicts().capacity(), 0, "taken: none left");
        s.keep_verdicts(Vec::with_capacity(VERDICTS_KEPT + 1));
        assert_eq!(s.verdicts().capacity(), 0);
        for _ in 0..VERDICT_LISTS_KEPT + 1 {
            s.keep_verdicts(Vec::with_capacity(1));
        }
        let kept = core::iter::from_fn(|| Some(s.verdicts()).filter(|v| v.capacity() > 0));
        assert_eq!(kept.count(), VERDICT_LISTS_KEPT, "as many lists as several backends use");
    }
}

//! Short values (header values, numbers for variables) assembled from bytes and integers, on
//! the stack or straight into the request's pool: a heap `String` in between is wasted work per
//! request, and so is `core::fmt`'s machinery for a few decimal numbers.

use crate::codec::resp::fmt_u64;

/// Long enough for a draft header with a 64-character zone name and three 20-digit numbers.
const CAPACITY: usize = 160;

/// Values written into `buf`: one at a time (`clear`), or one after another (`after`), each left
/// where it was written.
pub struct Text<B> {
    buf: B,
    /// Where the value being written starts ...
    start: usize,
    /// ... and ends.
    len: usize,
    /// Something did not fit: the value is cut, and `get` refuses it.
    overflow: bool,
}

/// A value on the stack, copied where it goes.
pub type StackText = Text<[u8; CAPACITY]>;

impl Default for StackText {
    fn default() -> Self {
        Text::new([0; CAPACITY])
    }
}

impl<B: AsRef<[u8]> + AsMut<[u8]>> Text<B> {
    pub fn new(buf: B) -> Self {
        Text { buf, start: 0, len: 0, overflow: false }
    }

    /// The value, unless something pushed since the last `clear` or `after` did not fit.
    pub fn get(&self) -> Option<&[u8]> {
        (!self.overflow).then_some(&self.buf.as_ref()[self.start..self.len])
    }

    pub fn clear(&mut self) -> &mut Self {
        (self.start, self.len, self.overflow) = (0, 0, false);
        self
    }

    /// Starts a value after the last one, which stays as it is.
    pub fn after(&mut self) -> &mut Self {
        (self.start, self.overflow) = (self.len, false);
        self
    }

    pub fn push(&mut self, bytes: &[u8]) -> &mut Self {
        let end = self.len + bytes.len();
        if end > self.buf.as_ref().len() {
            self.overflow = true;
        } else {
            self.buf.as_mut()[self.len..end].copy_from_slice(bytes);
            self.len = end;
        }
        self
    }

    /// `n` in decimal.
    pub fn num(&mut self, n: u64) -> &mut Self {
        let mut digits = [0; 20];
        self.push(fmt_u64(n, &mut digits))
    }

    /// `n` in decimal, zero-padded to at least `width` digits (at most 20).
    pub fn num_padded(&mut self, n: u64, width: usize) -> &mut Self {
        let mut digits = [0; 20];
        let d = fmt_u64(n, &mut digits);
        for _ in d.len()..width.min(20) {
            self.push(b"0");
        }
        self.push(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_numbers_and_refuses_overflow() {
        let mut t = StackText::default();
        t.push(b"\"").push(&[b'x'; 64]).push(b"\";r=").num(u64::MAX).push(b";t=").num(0);
        assert_eq!(t.get().unwrap().len(), 2 + 64 + 3 + 20 + 3 + 1);
        assert!(t.get().unwrap().ends_with(b"\";r=18446744073709551615;t=0"));
        t.clear();
        t.num(12).push(b".").num_padded(7, 3).push(b"|").num_padded(1234, 3);
        assert_eq!(t.get(), Some(&b"12.007|1234"[..]));
        t.clear();
        t.push(&[b'y'; CAPACITY]);
        assert_eq!(t.get().map(<[u8]>::len), Some(CAPACITY));
        t.push(b"z");
        assert_eq!(t.get(), None);
    }

    #[test]
    fn values_one_after_another_stay_where_they_were_written() {
        let mut buf = [0; 8];
        let mut t = Text::new(&mut buf[..]);
        assert_eq!(t.num(42).get(), Some(&b"42"[..]));
        assert_eq!(t.after().push(b"ab").num(7).get(), Some(&b"ab7"[..]));
        assert_eq!(t.after().num(1234).get(), None, "8 bytes in all");
        assert_eq!(t.after().num(9).get(), Some(&b"9"[..]));
        assert_eq!(&buf[..6], b"42ab79");
    }
}

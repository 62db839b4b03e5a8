//! Formatting short values (header values, numbers for variables) on the stack: they are copied
//! into the request's pool anyway, so a heap `String` in between is wasted work per request.

use core::fmt;

/// Long enough for a draft header with a 64-character zone name and three 20-digit numbers.
const CAPACITY: usize = 160;

pub struct StackText {
    buf: [u8; CAPACITY],
    len: usize,
}

impl Default for StackText {
    fn default() -> Self {
        StackText { buf: [0; CAPACITY], len: 0 }
    }
}

impl StackText {
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }
}

impl fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        if end > CAPACITY {
            return Err(fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::fmt::Write;

    #[test]
    fn formats_and_refuses_overflow() {
        let mut t = StackText::default();
        write!(t, "\"{}\";r={};t={}", "x".repeat(64), u64::MAX, u64::MAX).unwrap();
        assert_eq!(t.as_bytes().len(), 2 + 64 + 3 + 20 + 3 + 20);
        t.clear();
        assert!(write!(t, "{}", "y".repeat(CAPACITY + 1)).is_err());
    }
}

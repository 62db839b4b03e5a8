//! Byte buffers a worker keeps between uses (a decision's arguments, a reply kept on the heap),
//! so that once warm it allocates none for them. Bounded: a burst of long keys or a large reply
//! leaves no large buffers behind.

#[derive(Debug)]
pub struct Buffers {
    kept: Vec<Vec<u8>>,
    /// How many are kept, at most.
    most: usize,
    /// A buffer that grew past this many bytes is freed, not kept.
    largest: usize,
}

impl Buffers {
    pub const fn new(most: usize, largest: usize) -> Self {
        Buffers { kept: Vec::new(), most, largest }
    }

    /// An empty buffer, with room if one was kept.
    pub fn take(&mut self) -> Vec<u8> {
        self.kept.pop().unwrap_or_default()
    }

    /// A buffer done with: its room is kept for the next use.
    pub fn keep(&mut self, mut bytes: Vec<u8>) {
        if self.kept.len() < self.most && (1..=self.largest).contains(&bytes.capacity()) {
            bytes.clear();
            self.kept.push(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_reused_and_bounded() {
        let mut s = Buffers::new(4, 1024);
        assert_eq!(s.take().capacity(), 0, "nothing kept yet");
        let mut b = Vec::with_capacity(200);
        b.extend_from_slice(b"*1\r\n");
        let at = b.as_ptr();
        s.keep(b);
        let again = s.take();
        assert_eq!((again.as_ptr(), again.len()), (at, 0), "the same room, emptied");
        s.keep(Vec::with_capacity(1025));
        s.keep(Vec::new());
        assert_eq!(s.take().capacity(), 0, "neither a grown buffer nor an empty one is kept");
        (0..9).for_each(|_| s.keep(Vec::with_capacity(64)));
        assert_eq!(s.kept.len(), 4);
    }
}

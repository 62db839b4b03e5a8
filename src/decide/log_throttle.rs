//! At most one log line a second per kind of line: a flood of requests failing alike must not
//! become a flood of identical lines, and one kind of failure must not hide another.

/// The last time each key logged, per worker. The keys are few and fixed by the configuration
/// (a kind of line and a zone), so a list searched in order is enough and bounded.
pub struct LogThrottle<K> {
    last: Vec<(K, u64)>,
}

const INTERVAL_MS: u64 = 1000;

impl<K: PartialEq> LogThrottle<K> {
    pub const fn new() -> Self {
        LogThrottle { last: Vec::new() }
    }

    /// Whether a line of `key` may be logged at `now_ms`; if so, it counts as logged.
    pub fn allow(&mut self, key: K, now_ms: u64) -> bool {
        match self.last.iter_mut().find(|(k, _)| *k == key) {
            Some((_, last)) if now_ms.wrapping_sub(*last) < INTERVAL_MS => false,
            Some((_, last)) => {
                *last = now_ms;
                true
            }
            None => {
                self.last.push((key, now_ms));
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_a_second_per_key() {
        let mut t = LogThrottle::new();
        assert!(t.allow(("limit", 0), 5));
        assert!(!t.allow(("limit", 0), 900));
        // Another kind, or the same kind in another zone, is not hidden by the first.
        assert!(t.allow(("cost", 0), 900));
        assert!(t.allow(("limit", 1), 900));
        assert!(!t.allow(("cost", 0), 1899));
        assert!(t.allow(("limit", 0), 1005));
        assert!(!t.allow(("limit", 0), 2004));
        assert!(t.allow(("cost", 0), 1900));
    }

    #[test]
    fn the_first_line_at_time_zero_is_logged() {
        let mut t = LogThrottle::new();
        assert!(t.allow((), 0));
        assert!(!t.allow((), 999));
        assert!(t.allow((), 1000));
    }
}

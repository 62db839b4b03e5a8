//! The circuit breaker of one Redis server in one worker: after `threshold` consecutive
//! failures Redis is not asked at all for `backoff`, then one decision probes it, and its
//! outcome closes the breaker or opens it again. Pure, so every transition has a unit test.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed,
    Open {
        until: u64,
    },
    /// One probe is out; everything else keeps failing fast until it answers.
    HalfOpen,
}

/// Whether a decision may go to Redis now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Yes,
    /// Yes, as the one probe after a back-off.
    Probe,
    No,
}

/// A change of state worth one log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Opened,
    Reopened,
    Closed,
}

#[derive(Debug, Clone)]
pub struct Breaker {
    threshold: u32,
    backoff_ms: u64,
    failures: u32,
    state: State,
}

impl Breaker {
    pub fn new(threshold: u32, backoff_ms: u64) -> Self {
        Breaker { threshold: threshold.max(1), backoff_ms, failures: 0, state: State::Closed }
    }

    pub fn admit(&mut self, now_ms: u64) -> Admit {
        match self.state {
            State::Closed => Admit::Yes,
            State::Open { until } if now_ms >= until => {
                self.state = State::HalfOpen;
                Admit::Probe
            }
            State::Open { .. } | State::HalfOpen => Admit::No,
        }
    }

    /// Redis answered something usable.
    pub fn success(&mut self) -> Option<Transition> {
        self.failures = 0;
        let was = core::mem::replace(&mut self.state, State::Closed);
        (was != State::Closed).then_some(Transition::Closed)
    }

    /// A refused connect, a timeout, a dropped connection or an error reply meaning that Redis
    /// cannot serve decisions.
    pub fn failure(&mut self, now_ms: u64) -> Option<Transition> {
        self.failures = self.failures.saturating_add(1);
        let open = State::Open { until: now_ms + self.backoff_ms };
        match self.state {
            State::HalfOpen => {
                self.state = open;
                Some(Transition::Reopened)
            }
            State::Closed if self.failures >= self.threshold => {
                self.state = open;
                Some(Transition::Opened)
            }
            State::Closed | State::Open { .. } => None,
        }
    }

    /// True from the first failure until Redis answers again: while it holds, connect errors
    /// are not logged again.
    pub fn failing(&self) -> bool {
        self.failures > 0 || self.state != State::Closed
    }
}

/// Error replies after which Redis cannot decide anything for now: they count as failures.
/// Others (`WRONGTYPE` for one key, `NOSCRIPT`) say nothing about the server.
pub fn unusable(error: &[u8]) -> bool {
    const PREFIXES: [&[u8]; 10] = [
        b"CLUSTERDOWN",
        b"LOADING",
        b"BUSY",
        b"READONLY",
        b"OOM",
        b"NOAUTH",
        b"WRONGPASS",
        b"NOPERM",
        b"MASTERDOWN",
        b"MISCONF",
    ];
    PREFIXES.iter().any(|p| error.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_consecutive_failures() {
        let mut b = Breaker::new(3, 1000);
        assert_eq!(b.failure(0), None);
        assert_eq!(b.success(), None);
        assert!(!b.failing());
        assert_eq!(b.failure(10), None);
        assert_eq!(b.failure(20), None);
        assert!(b.failing());
        assert_eq!(b.admit(25), Admit::Yes);
        assert_eq!(b.failure(30), Some(Transition::Opened));
        assert_eq!(b.admit(31), Admit::No);
        assert_eq!(b.admit(1029), Admit::No);
        // Late failures of decisions already out while it is open change nothing.
        assert_eq!(b.failure(500), None);
        assert_eq!(b.admit(1030), Admit::Probe);
        assert_eq!(b.admit(1031), Admit::No, "one probe at a time");
        assert_eq!(b.success(), Some(Transition::Closed));
        assert_eq!(b.admit(1032), Admit::Yes);
    }

    #[test]
    fn a_failed_probe_opens_it_again() {
        let mut b = Breaker::new(1, 500);
        assert_eq!(b.failure(0), Some(Transition::Opened));
        assert_eq!(b.admit(500), Admit::Probe);
        assert_eq!(b.failure(700), Some(Transition::Reopened));
        assert_eq!(b.admit(1199), Admit::No);
        assert_eq!(b.admit(1200), Admit::Probe);
        assert_eq!(b.success(), Some(Transition::Closed));
        assert!(!b.failing());
    }

    #[test]
    fn zero_threshold_means_one() {
        let mut b = Breaker::new(0, 10);
        assert_eq!(b.failure(0), Some(Transition::Opened));
    }

    #[test]
    fn unusable_errors() {
        for e in [
            "LOADING Redis is loading",
            "BUSY Redis is busy",
            "READONLY You can't write",
            "OOM command not allowed",
            "NOAUTH Authentication required",
            "MASTERDOWN Link",
            "WRONGPASS invalid username-password pair",
            "NOPERM this user has no permissions",
            "CLUSTERDOWN The cluster is down",
        ] {
            assert!(unusable(e.as_bytes()), "{e}");
        }
        for e in ["WRONGTYPE Operation", "NOSCRIPT No matching script", "ERR ratelimit: bad"] {
            assert!(!unusable(e.as_bytes()), "{e}");
        }
    }
}

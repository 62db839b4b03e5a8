//! The circuit breaker of one Redis server in one worker: after `threshold` consecutive
//! failures no decision reaches the server; a background probe (its node's timer, a `PING` on
//! a connection of its own) asks it instead, first after `FIRST_PROBE_MS`, then after twice as
//! long each time it fails, up to `backoff`; the first usable reply closes the breaker. So
//! decisions go back to Redis within a probe interval of it answering again, while a dead
//! server costs one connect per interval, not one per request. Pure, so every transition has a
//! unit test; the timer and the probe itself live in the node.

/// The first probe's delay after the breaker opens: a restarted Redis usually answers again
/// within tens of milliseconds.
pub const FIRST_PROBE_MS: u64 = 25;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed,
    /// Nothing asks the server; the next probe is due `delay` after the last one ended.
    Open {
        delay: u64,
    },
    /// The probe is out; everything else keeps failing fast until it answers.
    Probing {
        delay: u64,
    },
}

/// A change of state worth one log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Opened,
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

    /// Whether a decision may go to the server now.
    pub fn admit(&self) -> bool {
        self.state == State::Closed
    }

    /// Redis answered something usable.
    pub fn success(&mut self) -> Option<Transition> {
        self.failures = 0;
        let was = core::mem::replace(&mut self.state, State::Closed);
        (was != State::Closed).then_some(Transition::Closed)
    }

    /// A refused connect, a timeout, a dropped connection or an error reply meaning that Redis
    /// cannot serve decisions. Once open, only the probe's outcome counts: late failures of
    /// decisions already out change nothing.
    pub fn failure(&mut self) -> Option<Transition> {
        self.failures = self.failures.saturating_add(1);
        match self.state {
            State::Closed if self.failures >= self.threshold => {
                self.state = State::Open { delay: FIRST_PROBE_MS.min(self.backoff_ms) };
                Some(Transition::Opened)
            }
            _ => None,
        }
    }

    /// When open with no probe out: how long to wait before the next probe.
    pub fn probe_delay(&self) -> Option<u64> {
        match self.state {
            State::Open { delay } => Some(delay),
            _ => None,
        }
    }

    /// The timer fired: a probe goes out. False when there is nothing to probe (closed
    /// meanwhile, or a probe is already out).
    pub fn probe_started(&mut self) -> bool {
        match self.state {
            State::Open { delay } => {
                self.state = State::Probing { delay };
                true
            }
            _ => false,
        }
    }

    /// The probe failed: the delay before the next one, twice the last, at most `backoff`.
    /// `None` when no probe was out (a success closed the breaker meanwhile).
    pub fn probe_failed(&mut self) -> Option<u64> {
        let State::Probing { delay } = self.state else { return None };
        let delay = delay.saturating_mul(2).min(self.backoff_ms);
        self.state = State::Open { delay };
        Some(delay)
    }

    /// The longest delay between probes: reached, probes fail at the old back-off's pace.
    pub fn backoff(&self) -> u64 {
        self.backoff_ms
    }

    /// True from the first failure until Redis answers again: while it holds, connect errors
    /// are not logged again.
    pub fn failing(&self) -> bool {
        self.failures > 0 || self.state != State::Closed
    }
}

/// Error replies after which Redis cannot decide anything for now: they count as failures.
/// Others (`WRONGTYPE` or `NOPERM` for one key, `NOSCRIPT`) say nothing about the server: a
/// client that sends a key the ACL refuses must not open the breaker for everyone.
pub fn unusable(error: &[u8]) -> bool {
    const PREFIXES: [&[u8]; 9] = [
        b"CLUSTERDOWN",
        b"LOADING",
        b"BUSY",
        b"READONLY",
        b"OOM",
        b"NOAUTH",
        b"WRONGPASS",
        b"MASTERDOWN",
        b"MISCONF",
    ];
    PREFIXES.iter().any(|p| error.starts_with(p))
}

/// Error replies of a server that will answer again by itself within moments (loading its data
/// after a restart, a long script, a replica without its primary, a cluster mending): worth
/// asking again soon, unlike a refusal (an ACL, a command a managed service disabled).
pub fn passing(error: &[u8]) -> bool {
    const PREFIXES: [&[u8]; 5] = [b"LOADING", b"BUSY", b"MASTERDOWN", b"CLUSTERDOWN", b"TRYAGAIN"];
    PREFIXES.iter().any(|p| error.starts_with(p))
}

/// A call refused before it ran because of the keys it declared (the ACL's key patterns): one
/// decision's keys may be the cause, and the call applied nothing.
pub fn refused_keys(error: &[u8]) -> bool {
    error.starts_with(b"NOPERM")
}

/// Error replies only a Redis Cluster node gives: pointed at one without `cluster=on`, every
/// decision whose keys live on another node gets one.
pub fn from_cluster(error: &[u8]) -> bool {
    [&b"MOVED "[..], b"ASK ", b"CLUSTERDOWN"].iter().any(|p| error.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_consecutive_failures() {
        let mut b = Breaker::new(3, 1000);
        assert_eq!(b.failure(), None);
        assert_eq!(b.success(), None);
        assert!(!b.failing());
        assert_eq!(b.failure(), None);
        assert_eq!(b.failure(), None);
        assert!(b.failing());
        assert!(b.admit());
        assert_eq!(b.failure(), Some(Transition::Opened));
        assert!(!b.admit());
        assert_eq!(b.probe_delay(), Some(FIRST_PROBE_MS));
        // Late failures of decisions already out while it is open change nothing.
        assert_eq!(b.failure(), None);
        assert_eq!(b.probe_delay(), Some(FIRST_PROBE_MS));
    }

    #[test]
    fn probes_back_off_up_to_the_backoff_and_a_success_closes() {
        let mut b = Breaker::new(1, 1000);
        assert_eq!(b.failure(), Some(Transition::Opened));
        let mut delays = vec![b.probe_delay().unwrap()];
        for _ in 0..8 {
            assert!(b.probe_started());
            assert!(!b.probe_started(), "one probe at a time");
            assert_eq!(b.probe_delay(), None, "no timer while the probe is out");
            // Failures reported meanwhile (the probe's own connection) do not count twice.
            assert_eq!(b.failure(), None);
            assert!(!b.admit(), "decisions keep failing fast while probing");
            delays.push(b.probe_failed().unwrap());
        }
        assert_eq!(delays, [25, 50, 100, 200, 400, 800, 1000, 1000, 1000]);
        assert!(b.probe_started());
        assert_eq!(b.success(), Some(Transition::Closed));
        assert!(b.admit());
        assert!(!b.failing());
        assert_eq!(b.probe_failed(), None, "a probe answered after the close changes nothing");
        assert!(b.admit());
    }

    #[test]
    fn any_usable_reply_closes_it_while_open() {
        let mut b = Breaker::new(1, 1000);
        b.failure();
        assert_eq!(b.success(), Some(Transition::Closed));
        assert_eq!(b.probe_delay(), None);
        assert!(!b.probe_started(), "the pending timer finds nothing to probe");
    }

    #[test]
    fn a_short_backoff_caps_the_first_delay() {
        let mut b = Breaker::new(1, 10);
        b.failure();
        assert_eq!(b.probe_delay(), Some(10));
    }

    #[test]
    fn zero_threshold_means_one() {
        let mut b = Breaker::new(0, 10);
        assert_eq!(b.failure(), Some(Transition::Opened));
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
            "CLUSTERDOWN The cluster is down",
        ] {
            assert!(unusable(e.as_bytes()), "{e}");
        }
        // One key's refusal says nothing about the server: a client could open the breaker.
        for e in [
            "WRONGTYPE Operation",
            "NOSCRIPT No matching script",
            "ERR ratelimit: bad",
            "NOPERM this user has no permissions to access one of the keys",
        ] {
            assert!(!unusable(e.as_bytes()), "{e}");
        }
        assert!(refused_keys(b"NOPERM No permissions to access a key"));
        assert!(!refused_keys(b"WRONGTYPE Operation"));
    }

    #[test]
    fn passing_errors_are_a_server_state_not_a_refusal() {
        for e in ["LOADING Redis is loading", "BUSY Redis is busy", "MASTERDOWN Link", "TRYAGAIN"] {
            assert!(passing(e.as_bytes()), "{e}");
        }
        for e in [
            "NOPERM this user has no permissions to run the 'client|tracking' command",
            "ERR unknown command 'CLIENT'",
            "WRONGPASS invalid username-password pair",
        ] {
            assert!(!passing(e.as_bytes()), "{e}");
        }
    }

    #[test]
    fn cluster_errors() {
        for e in ["MOVED 3999 127.0.0.1:7002", "ASK 3999 127.0.0.1:7002", "CLUSTERDOWN down"] {
            assert!(from_cluster(e.as_bytes()), "{e}");
        }
        for e in ["ERR unknown", "ASKING", "READONLY You can't write"] {
            assert!(!from_cluster(e.as_bytes()), "{e}");
        }
    }
}

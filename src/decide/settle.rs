//! Settled costs (`ratelimit ZONE cost=ESTIMATE settle=VALUE`): a request is admitted on its
//! estimate, recorded in Redis as a placement (a token and a rid in the key's ledger), and when
//! it ends the value it really cost replaces the estimate: less gives the difference back (a
//! `G` decision), more charges the excess past the limit (a `C` decision). Both name the rid, so
//! a settlement of an older life of the key (a reset since) writes nothing, and one sent twice
//! (a retry after a timeout) is applied once. Settlements Redis cannot take now wait here and
//! are sent again for a bounded time.

use std::collections::VecDeque;

use crate::decide::lease::GiveBack;
use crate::decide::params::parse_cost;

/// What a settlement does to the units an estimate placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// The value is the estimate: nothing to send.
    Keep,
    /// The value is less: these units go back.
    Return(u64),
    /// The value is more: these units are charged, past the limit.
    Charge(u64),
}

/// The value a request settles with, from the text of `settle=` evaluated when it ended: the
/// value charged and what to send. `None` for the value when the text is empty or not a whole
/// number of at most 10^9 units: the estimate is kept then (and the caller logs it).
pub fn settle(estimate: u64, text: &[u8]) -> (Option<u64>, Settlement) {
    // What `cost=` takes, and for the same reason: whole units the scripts count exactly.
    let value = core::str::from_utf8(text).ok().and_then(parse_cost);
    let s = match value {
        None => Settlement::Keep,
        Some(v) if v < estimate => Settlement::Return(estimate - v),
        Some(v) if v > estimate => Settlement::Charge(v - estimate),
        Some(_) => Settlement::Keep,
    };
    (value, s)
}

/// A settlement on its way to Redis: the placement it concerns (`GiveBack`'s fields name it:
/// the key, its figures, the token and the rid), the units, and which way they go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub place: GiveBack,
    pub charge: bool,
    /// After this instant (ms, the worker's clock) it is given up and counted lost.
    pub until_ms: u64,
    /// An earlier attempt may have been applied, its answer lost (a timeout, a connection
    /// closed): a later one that finds it done counts it.
    pub tried: bool,
}

/// How long a settlement Redis cannot take is tried again: a Redis restart or a failover is
/// over well within it; a longer outage loses what was not settled (counted).
pub const RETRY_MS: u64 = 60_000;

/// Whether Redis would answer a settlement with this error however often it were sent: the key
/// holds other data (`WRONGTYPE`, the script's own `ERR ratelimit:`), the ACL refuses it
/// (`NOPERM`), the script failed (Redis 7's `ERR user_script`, Redis 6's `ERR Error running
/// script`). Such a settlement is given up at once, not tried for
/// [`RETRY_MS`]; a server that cannot answer for now (`LOADING`, `BUSY`, a failover) is tried again.
pub fn refused(error: &[u8]) -> bool {
    const PREFIXES: [&[u8]; 5] = [
        b"WRONGTYPE",
        b"NOPERM",
        b"ERR ratelimit:",
        b"ERR user_script",
        b"ERR Error running script",
    ];
    PREFIXES.iter().any(|p| error.starts_with(p))
}

/// The settlements of a worker waiting to be sent again, oldest first. Bounded: beyond
/// `capacity` the oldest is given up (counted lost), so an outage under load cannot grow it.
pub struct Queue {
    pending: VecDeque<Pending>,
    capacity: usize,
}

impl Queue {
    pub fn new(capacity: usize) -> Self {
        Queue { pending: VecDeque::new(), capacity }
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Keeps `p` to send again; returns one given up to make room, if any.
    pub fn push(&mut self, p: Pending) -> Option<Pending> {
        let dropped = (self.pending.len() >= self.capacity).then(|| self.pending.pop_front());
        self.pending.push_back(p);
        dropped.flatten()
    }

    /// Everything to send now, and what is past its time (lost).
    pub fn take(&mut self, now_ms: u64) -> (Vec<Pending>, Vec<Pending>) {
        self.pending.drain(..).partition(|p| now_ms <= p.until_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::key_buf::KeyBuf;

    #[test]
    fn values() {
        assert_eq!(settle(100, b"30"), (Some(30), Settlement::Return(70)));
        assert_eq!(settle(100, b"250"), (Some(250), Settlement::Charge(150)));
        assert_eq!(settle(100, b"100"), (Some(100), Settlement::Keep));
        assert_eq!(settle(1, b"0"), (Some(0), Settlement::Return(1)));
        for bad in [&b""[..], b"-5", b"1.5", b" 3", b"x", b"1000000001", b"99999999999999999999"] {
            assert_eq!(settle(7, bad), (None, Settlement::Keep), "{bad:?}");
        }
    }

    fn pending(until_ms: u64) -> Pending {
        let place = GiveBack {
            zone: 0,
            key: KeyBuf::of(&[b"k"]),
            units: 1,
            token: 0,
            rid: 1,
            limit: 10,
            window_ms: 1000,
        };
        Pending { place, charge: false, until_ms, tried: false }
    }

    #[test]
    fn the_queue_is_bounded_and_gives_up_in_time() {
        let mut q = Queue::new(2);
        assert_eq!(q.push(pending(10)), None);
        assert_eq!(q.push(pending(20)), None);
        assert_eq!(q.push(pending(30)), Some(pending(10)));
        let (send, lost) = q.take(25);
        assert_eq!((send, lost), (vec![pending(30)], vec![pending(20)]));
        assert!(q.is_empty());
    }

    #[test]
    fn refusals_are_given_up_outages_tried_again() {
        let cases: [(&[u8], bool); 15] = [
            (b"WRONGTYPE ratelimit: rl:tok:a holds other data", true),
            (b"WRONGTYPE Operation against a key holding the wrong kind of value script: x", true),
            (b"NOPERM this user has no permissions to access one of the keys", true),
            (b"ERR ratelimit: malformed batch at decision 1", true),
            (
                b"ERR user_script:12: Script attempted to access nonexistent global variable 'x'",
                true,
            ),
            (
                b"ERR Error running script (call to f_0123): @user_script:12: Script attempted to access nonexistent global variable 'x'",
                true,
            ),
            (b"LOADING Redis is loading the dataset in memory", false),
            (b"BUSY Redis is busy running a script", false),
            (b"READONLY You can't write against a read only replica.", false),
            (b"CLUSTERDOWN The cluster is down", false),
            (b"TRYAGAIN Multiple keys request during rehashing of slot", false),
            (b"NOSCRIPT No matching script", false),
            (b"OOM command not allowed when used memory > 'maxmemory'.", false),
            (b"MASTERDOWN Link with MASTER is down", false),
            (b"ERR max number of clients reached", false),
        ];
        for (e, given_up) in cases {
            assert_eq!(refused(e), given_up, "{}", String::from_utf8_lossy(e));
        }
    }
}

//! The decision script and what a decision asks of it: the script text (`lua/decide.lua`) and
//! how each zone counts ([`Algorithm`]); a decision's arguments, encoded for the call
//! ([`args`]); the script's reply, read into decisions ([`reply`]). How a batch of decisions
//! goes on the wire is `crate::codec::call`'s.

use std::sync::OnceLock;

use crate::codec::call::{sha1_hex, Script};
use crate::decide::params::MAX_LIMIT;

mod args;
mod reply;
mod spare;
#[cfg(test)]
mod tests;

pub use args::{EncodedArgs, EncodedFigures, Place, SlotOp, SlotRef, ZoneArgs, MAX_ZONES};
#[cfg(test)]
pub use reply::decode_decision;
pub use reply::{decode_one, decode_reply, decode_reply_in, Decision, ReplyError, ZoneVerdict};
pub use spare::Spare;

/// The decision script. The files in `lua/` are the single source of truth; tests that run the
/// script directly (`t/lib/RLTest/Script.pm`) read this list to assemble it the same way.
pub const SCRIPT: &str = concat!(include_str!("../../../lua/decide.lua"));

/// The script for every decision, whatever its algorithms and clock. One flat script serves every
/// combination: it rebuilds nothing per call (its whole set-up, scratch tables and two helpers,
/// costs Redis about 0.35 us a call), dispatches with a few string comparisons per zone, and
/// lets any decisions of a connection share a batch.
pub fn script() -> &'static Script {
    static GENERIC: OnceLock<Script> = OnceLock::new();
    GENERIC.get_or_init(|| Script { body: SCRIPT, sha: sha1_hex(SCRIPT.as_bytes()) })
}

/// How a zone counts; each algorithm is a section of `lua/decide.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    SlidingLog,
    /// The same exact log stored as one string: fewer commands and less memory per entry, but
    /// every admission rewrites the string, so only for small limits (docs/memory.md).
    SlidingLogPacked,
    SlidingCounter,
    Gcra,
    /// `limit` units per calendar period (`crate::decide::quota::Period`), one counter per key that
    /// ends with the period. The window field carries [`crate::decide::quota::Period::encode`].
    CalendarQuota,
    /// A balance of credits the operator sets and tops up; requests draw their cost from it.
    /// The burst field carries the balance of a missing key (0: none).
    Balance,
    /// Not a zone's: `ratelimit_admin` sets (window field 1) or adds to (2) a balance the cost.
    BalanceAdmin,
    /// Not a zone's: `ratelimit_admin`'s `DELETE` removes the key, whatever its algorithm.
    Reset,
    /// `limit` requests in flight per key, no window: each admitted request holds a slot, a
    /// sorted-set member of its own scored by when the slot lapses (`crate::decide::slots`). The window
    /// field carries the slot's life, the burst field the member.
    Concurrency,
}

impl Algorithm {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "sliding_log" => Some(Algorithm::SlidingLog),
            "sliding_log_packed" => Some(Algorithm::SlidingLogPacked),
            "sliding_counter" => Some(Algorithm::SlidingCounter),
            "gcra" => Some(Algorithm::Gcra),
            "balance" => Some(Algorithm::Balance),
            "concurrency" => Some(Algorithm::Concurrency),
            _ => None,
        }
    }

    /// The letter `lua/decide.lua` dispatches on.
    fn code(self) -> &'static [u8] {
        match self {
            Algorithm::SlidingLog => b"l",
            Algorithm::SlidingLogPacked => b"p",
            Algorithm::SlidingCounter => b"c",
            Algorithm::Gcra => b"g",
            Algorithm::CalendarQuota => b"q",
            Algorithm::Balance => b"b",
            Algorithm::BalanceAdmin => b"B",
            Algorithm::Reset => b"D",
            Algorithm::Concurrency => b"n",
        }
    }

    /// The most units one request can ever be granted: a request costing more is denied
    /// without asking Redis, since no amount of waiting would admit it.
    /// The largest limit a zone of this algorithm takes. The logs keep an entry per unit, so
    /// their limit bounds what one key holds and what one decision makes Redis do, measured
    /// here: the sorted set about 12 MB and 0.2 s of `ZADD`s for a cost of 100,000; the packed
    /// string is read and written whole by every decision, about 0.1 ms at 10,000 entries.
    /// Above that, `sliding_counter` and `gcra` are O(1) per key.
    pub fn max_limit(self) -> u64 {
        match self {
            // A member per request in flight, as the log keeps one per unit.
            Algorithm::SlidingLog | Algorithm::Concurrency => 100_000,
            Algorithm::SlidingLogPacked => 10_000,
            Algorithm::SlidingCounter
            | Algorithm::Gcra
            | Algorithm::CalendarQuota
            | Algorithm::Balance
            | Algorithm::BalanceAdmin
            | Algorithm::Reset => MAX_LIMIT,
        }
    }

    pub fn capacity(self, limit: u64, burst: u64) -> u64 {
        match self {
            Algorithm::Gcra => burst,
            // Only the balance itself, in Redis, says how much one request may take.
            Algorithm::Balance | Algorithm::BalanceAdmin | Algorithm::Reset => u64::MAX,
            Algorithm::SlidingLog
            | Algorithm::SlidingLogPacked
            | Algorithm::SlidingCounter
            | Algorithm::CalendarQuota
            | Algorithm::Concurrency => limit,
        }
    }
}

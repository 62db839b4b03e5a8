//! The script's reply, read into decisions.

use crate::codec::resp::View;
use crate::decide::lease::Grant;

use super::EncodedArgs;

/// What one zone said about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoneVerdict {
    pub ok: bool,
    pub remaining: u64,
    pub reset_ms: u64,
    /// What a zone that asked for a reservation was granted (nothing otherwise).
    pub grant: Grant,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Admitted, but only after this many ms (`delay=`): the request is recorded at that
    /// instant in every zone, each zone's `grant` naming its place for a give-back. 0: now.
    pub wait_ms: u64,
    pub zones: Vec<ZoneVerdict>,
}

impl Decision {
    /// The zone that describes the decision in headers and variables: on rejection the rejecting
    /// zone with the longest wait, otherwise the zone with the least remaining.
    pub fn deciding_zone(&self) -> usize {
        let mut best = 0;
        for (i, z) in self.zones.iter().enumerate() {
            let b = &self.zones[best];
            let better = if self.allowed {
                z.remaining < b.remaining
            } else {
                !z.ok && (b.ok || z.reset_ms > b.reset_ms)
            };
            if better {
                best = i;
            }
        }
        best
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    /// Redis no longer has the script cached; retry with `EVAL`.
    NoScript,
    /// An error reply, such as `WRONGTYPE` when someone else's data sits under our key.
    Redis(String),
    /// A reply that is not what the script returns.
    Unexpected,
}

/// Reads the script's reply for a decision over `zones` zones, none asking for a reservation:
/// the tests' reading of any such reply (the module's are of one zone: [`decode_one`]).
#[cfg(test)]
pub fn decode_decision(reply: View<'_>, zones: usize) -> Result<Decision, ReplyError> {
    decode_args_reply(reply, zones, |_| false, Vec::new())
}

/// Reads the script's reply for a decision of one zone that asked for no reservation (a
/// give-back, a check, a slot's renewal, the admin's): whether it was allowed, and the zone's
/// verdict. No heap allocation.
pub fn decode_one(reply: View<'_>) -> Result<(bool, ZoneVerdict), ReplyError> {
    let mut verdict = None;
    let (allowed, _) = read_verdicts(reply, 1, |_| false, |v| verdict = Some(v))?;
    verdict.map(|v| (allowed, v)).ok_or(ReplyError::Unexpected)
}

/// Reads the script's reply for the decision `args` encoded.
pub fn decode_reply(reply: View<'_>, args: &EncodedArgs) -> Result<Decision, ReplyError> {
    decode_reply_in(reply, args, Vec::new())
}

/// [`decode_reply`], its verdicts in `room` (kept from an earlier decision: no allocation).
pub fn decode_reply_in(
    reply: View<'_>,
    args: &EncodedArgs,
    room: Vec<ZoneVerdict>,
) -> Result<Decision, ReplyError> {
    decode_args_reply(reply, args.call().zones(), |i| args.leased(i), room)
}

/// Reads the script's reply, each zone's verdict into `verdicts` (`room`).
fn decode_args_reply(
    reply: View<'_>,
    zones: usize,
    leased: impl Fn(usize) -> bool,
    mut verdicts: Vec<ZoneVerdict>,
) -> Result<Decision, ReplyError> {
    // Sized once: collecting results through an iterator of `Result`s starts small and grows.
    verdicts.clear();
    verdicts.reserve(zones);
    let (allowed, wait_ms) = read_verdicts(reply, zones, leased, |v| verdicts.push(v))?;
    Ok(Decision { allowed, wait_ms, zones: verdicts })
}

/// A zone that asked for a reservation or may wait answers seven fields, the others three. The
/// integers are read straight from the reply's bytes, in order, each zone's verdict handed to
/// `verdict`. Returns whether the decision was allowed, and after what wait.
fn read_verdicts(
    reply: View<'_>,
    zones: usize,
    leased: impl Fn(usize) -> bool,
    mut verdict: impl FnMut(ZoneVerdict),
) -> Result<(bool, u64), ReplyError> {
    let len = 1 + (0..zones).map(|z| if leased(z) { 7 } else { 3 }).sum::<usize>();
    let mut items = match reply.items() {
        Some(items) if items.len() == len && zones > 0 => items,
        _ => {
            return Err(match reply.error() {
                Some(msg) if msg.starts_with(b"NOSCRIPT") => ReplyError::NoScript,
                Some(msg) => ReplyError::Redis(String::from_utf8_lossy(msg).into()),
                None => ReplyError::Unexpected,
            })
        }
    };
    let mut int = || match items.next_int() {
        Some(v) if v >= 0 => Ok(v as u64),
        _ => Err(ReplyError::Unexpected),
    };
    // 2: admitted after a wait, which only a decision whose zones may wait is answered.
    let (allowed, delayed) = match int()? {
        0 => (false, false),
        1 => (true, false),
        2 if (0..zones).all(&leased) => (true, true),
        _ => return Err(ReplyError::Unexpected),
    };
    // Every zone's place lasts until the wait's end, the same instant in all.
    let mut wait_ms = None;
    for z in 0..zones {
        let mut v = ZoneVerdict {
            ok: int()? == 1,
            remaining: int()?,
            reset_ms: int()?,
            grant: Grant::default(),
        };
        if leased(z) {
            v.grant = Grant { units: int()?, life_ms: int()?, token: int()?, rid: int()? };
        }
        if allowed && !v.ok {
            return Err(ReplyError::Unexpected);
        }
        if delayed
            && (v.grant.life_ms == 0 || *wait_ms.get_or_insert(v.grant.life_ms) != v.grant.life_ms)
        {
            return Err(ReplyError::Unexpected);
        }
        verdict(v);
    }
    Ok((allowed, wait_ms.unwrap_or(0)))
}

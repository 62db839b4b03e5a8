//! The script call on the wire: `EVALSHA` of a batch of decisions, each RESP-encoded once by
//! whoever decided what to ask (`crate::decide::script`), and the split of its reply; the
//! script's hash and `SCRIPT LOAD`. What the script does with its arguments is not known here,
//! only how many a decision has and that a call puts every key before every argument.

use super::resp::{self, View};
use super::slot;

/// A script Redis runs, and its hash for `EVALSHA`.
#[derive(Debug, PartialEq, Eq)]
pub struct Script {
    pub body: &'static str,
    pub sha: [u8; 40],
}

impl AsRef<[u8]> for Script {
    fn as_ref(&self) -> &[u8] {
        self.body.as_bytes()
    }
}

/// Hex SHA-1 of a script body, as `EVALSHA` expects it.
pub fn sha1_hex(body: &[u8]) -> [u8; 40] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = [0u8; 40];
    for (i, b) in sha1_smol::Sha1::from(body).digest().bytes().iter().enumerate() {
        hex[2 * i] = DIGITS[usize::from(b >> 4)];
        hex[2 * i + 1] = DIGITS[usize::from(b & 0xf)];
    }
    hex
}

/// Appends `SCRIPT LOAD body`; takes a [`Script`] or its body.
pub fn write_script_load(out: &mut Vec<u8>, body: impl AsRef<[u8]>) {
    resp::put_array_len(out, 3);
    resp::put_bulk(out, b"SCRIPT");
    resp::put_bulk(out, b"LOAD");
    resp::put_bulk(out, body.as_ref());
}

/// At most this many decisions in one call. What a call costs besides its decisions (parsing it,
/// `TIME`, the script's set-up: about 2.5 us of Redis CPU for `sliding_log`, bench/redis-cost.md)
/// is a small share of each decision at 16 and negligible at 64, while Redis runs nothing else
/// during the call: 64 decisions of about 7 us keep that under half a millisecond (not with
/// `sliding_log_packed` at large limits, ~100 us a decision at 10,000).
pub const MAX_BATCH_DECISIONS: usize = 64;
// A batch's reply is split where its framer found its items' ends.
const _: () = assert!(MAX_BATCH_DECISIONS <= resp::ENDS_KEPT);

/// At most this many bytes of decisions ([`Args::wire_len`]) in one call: Redis copies
/// every argument into the script's KEYS and ARGV tables before the first decision runs. 64
/// typical decisions take about 10 KiB.
/// A decision larger than this still goes alone: a batch of one is always valid.
pub const MAX_BATCH_BYTES: usize = 64 * 1024;

/// Arguments per zone after the decision's clock, in the order `lua/decide.lua` reads them.
pub const ARGS_PER_ZONE: usize = 5;

/// One decision's share of a call, RESP-encoded once so that it can join any batch and a
/// `NOSCRIPT` retry reuses it unchanged: its zone keys, then its arguments (a clock, then
/// [`ARGS_PER_ZONE`] per zone), kept apart because a call puts every decision's keys before all
/// the arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Args {
    /// The keys, then the arguments.
    bytes: Vec<u8>,
    keys_len: usize,
    zones: usize,
}

impl Args {
    /// `bytes` holds the bulk strings of `zones` keys (`keys_len` bytes), then the decision's
    /// arguments.
    pub fn new(bytes: Vec<u8>, keys_len: usize, zones: usize) -> Self {
        Args { bytes, keys_len, zones }
    }

    pub fn zones(&self) -> usize {
        self.zones
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// The Cluster slot all the keys share, if they do: one script call touches one slot.
    /// Read back from the encoded keys, so that only a Cluster pays for it.
    pub fn slot(&self) -> Option<u16> {
        let mut slots = resp::bulk_strings(self.keys()).map(|key| slot::key_slot(&[key]));
        let first = slots.next()?;
        slots.all(|s| s == first).then_some(first)
    }

    /// The first key (empty if none): a decision of one zone's.
    pub fn first_key(&self) -> &[u8] {
        resp::bulk_strings(self.keys()).next().unwrap_or_default()
    }

    /// The bytes this decision adds to a call, for [`MAX_BATCH_BYTES`].
    pub fn wire_len(&self) -> usize {
        self.bytes.len()
    }

    fn keys(&self) -> &[u8] {
        &self.bytes[..self.keys_len]
    }

    fn argv(&self) -> &[u8] {
        &self.bytes[self.keys_len..]
    }

    fn argv_count(&self) -> usize {
        1 + self.zones * ARGS_PER_ZONE
    }
}

/// Appends one `EVALSHA` that decides each decision of `batch` in order; its reply is split
/// with [`split_batch`]. Redis wants all KEYS before all ARGV: `EVALSHA sha numkeys <every
/// decision's keys> <every decision's argv>`.
///
/// `mixed`: a Cluster node's batch whose decisions are of several slots. Only the first
/// decision's keys are declared (a call may declare keys of one slot); the others go first in
/// ARGV, after `k<count>`, and the script learns whether the node serves each from its first
/// access, before its decision writes anything.
///
/// `batch` is walked several times, as it lies (a connection's queue): gathering it first was
/// an array to fill per call.
pub fn write_batch<'a>(
    out: &mut Vec<u8>,
    script: &Script,
    batch: impl Iterator<Item = &'a Args> + Clone,
    mixed: bool,
) {
    let (mut n, mut zones, mut argv) = (0, 0, 0);
    for a in batch.clone() {
        (n, zones, argv) = (n + 1, zones + a.zones, argv + a.argv_count());
    }
    let declared = match batch.clone().next() {
        Some(first) if mixed && n > 1 => first.zones,
        _ => zones,
    };
    let split = if declared < zones { 1 } else { n };
    resp::put_array_len(out, 3 + zones + usize::from(split < n) + argv);
    resp::put_bulk(out, b"EVALSHA");
    resp::put_bulk(out, &script.sha);
    resp::put_bulk_int(out, declared as u64);
    for a in batch.clone().take(split) {
        out.extend_from_slice(a.keys());
    }
    if split < n {
        let mut digits = [0u8; 20];
        resp::put_bulk_parts(out, &[b"k", resp::fmt_u64((zones - declared) as u64, &mut digits)]);
        for a in batch.clone().skip(split) {
            out.extend_from_slice(a.keys());
        }
    }
    for a in batch {
        out.extend_from_slice(a.argv());
    }
}

/// The replies of a call that decided `n` decisions: one per decision, in order (an error among
/// them concerns that decision alone); or `Err` with the reply that concerns the whole call
/// (`NOSCRIPT`, a script that could not run), for the caller to hand to each of the `n`. A call
/// of one decision answers that decision's reply itself. `ends` are where the reply's items
/// end, as its [`resp::Framer`] found them. Read where the reply lies: each decision's share is
/// a view of its bytes, nothing is copied or allocated.
pub fn split_batch<'a>(
    reply: View<'a>,
    n: usize,
    ends: &'a [usize],
) -> Result<BatchReplies<'a>, View<'a>> {
    if reply.error().is_some() {
        return Err(reply);
    }
    if n == 1 {
        return Ok(BatchReplies { reply: reply.bytes(), at: 0, ends: &[], whole: true });
    }
    match reply.items() {
        Some(items) if items.len() == n && ends.len() == n => {
            // The first item starts after the array's line.
            let at = reply.bytes().iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
            Ok(BatchReplies { reply: reply.bytes(), at, ends, whole: false })
        }
        _ => Err(reply),
    }
}

/// The replies [`split_batch`] hands out, in order: the whole reply (a call of one), or its
/// items, each from where the last ended.
#[derive(Debug)]
pub struct BatchReplies<'a> {
    reply: &'a [u8],
    at: usize,
    ends: &'a [usize],
    whole: bool,
}

impl<'a> Iterator for BatchReplies<'a> {
    type Item = View<'a>;

    fn next(&mut self) -> Option<View<'a>> {
        if core::mem::take(&mut self.whole) {
            return Some(View::of(self.reply));
        }
        let (&end, rest) = self.ends.split_first()?;
        let item = self.reply.get(self.at..end)?;
        (self.at, self.ends) = (end, rest);
        Some(View::of(item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha_matches_redis_script_load() {
        // `redis-cli SCRIPT LOAD "return 1"` answers this hash.
        assert_eq!(&sha1_hex(b"return 1"), b"e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
    }

    #[test]
    fn script_load() {
        let mut out = Vec::new();
        write_script_load(&mut out, b"return 1");
        assert_eq!(out, redis::cmd("SCRIPT").arg("LOAD").arg("return 1").get_packed_command());
        let mut of_script = Vec::new();
        write_script_load(&mut of_script, Script { body: "return 1", sha: [b'0'; 40] });
        assert_eq!(of_script, out);
    }
}

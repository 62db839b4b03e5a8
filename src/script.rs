//! The Redis script call: the script text and its hash, the command that carries a batch of
//! decisions, and the decoding of the script's reply into decisions.

use std::sync::OnceLock;

use crate::key::Key;
use crate::lease::{GiveBack, Grant};
use crate::params::MAX_LIMIT;
use crate::redis::resp::{self, Reply};
use crate::redis::slot;

/// The decision script. The files in `lua/` are the single source of truth; tests that run the
/// script directly (`t/lib/RLTest/Script.pm`) read this list to assemble it the same way.
pub const SCRIPT: &str = concat!(include_str!("../lua/decide.lua"));

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

/// The script for every decision, whatever its algorithms and clock. One flat script serves every
/// combination: it rebuilds nothing per call (its whole set-up, scratch tables and two helpers,
/// costs Redis about 0.35 us a call), dispatches with a few string comparisons per zone, and
/// lets any decisions of a connection share a batch.
pub fn script() -> &'static Script {
    static GENERIC: OnceLock<Script> = OnceLock::new();
    GENERIC.get_or_init(|| Script { body: SCRIPT, sha: sha1_hex(SCRIPT.as_bytes()) })
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

/// At most this many bytes of decisions ([`EncodedArgs::wire_len`]) in one call: Redis copies
/// every argument into the script's KEYS and ARGV tables before the first decision runs. 64
/// typical decisions take about 10 KiB.
/// A decision larger than this still goes alone: a batch of one is always valid.
pub const MAX_BATCH_BYTES: usize = 64 * 1024;

/// Appends one `EVALSHA` that decides each decision of `batch` in order; its reply is split
/// with [`split_batch`]. Redis wants all KEYS before all ARGV: `EVALSHA sha numkeys <every
/// decision's keys> <every decision's argv>`.
///
/// `mixed`: a Cluster node's batch whose decisions are of several slots. Only the first
/// decision's keys are declared (a call may declare keys of one slot); the others go first in
/// ARGV, after `k<count>`, and the script probes each before its decision uses it.
pub fn write_batch(out: &mut Vec<u8>, script: &Script, batch: &[&EncodedArgs], mixed: bool) {
    let zones: usize = batch.iter().map(|a| a.zones).sum();
    let argv: usize = batch.iter().map(|a| a.argv_count()).sum();
    let declared = match batch.first() {
        Some(first) if mixed && batch.len() > 1 => first.zones,
        _ => zones,
    };
    let (head, rest) = batch.split_at(if declared < zones { 1 } else { batch.len() });
    resp::put_array_len(out, 3 + zones + usize::from(!rest.is_empty()) + argv);
    resp::put_bulk(out, b"EVALSHA");
    resp::put_bulk(out, &script.sha);
    resp::put_bulk_int(out, declared as u64);
    for a in head {
        out.extend_from_slice(a.keys());
    }
    if !rest.is_empty() {
        let mut digits = [0u8; 20];
        resp::put_bulk_parts(out, &[b"k", resp::fmt_u64((zones - declared) as u64, &mut digits)]);
        for a in rest {
            out.extend_from_slice(a.keys());
        }
    }
    for a in batch {
        out.extend_from_slice(a.argv());
    }
}

/// The replies of a call that decided `n` decisions: one per decision, in order, each for
/// [`decode_decision`] (an error among them concerns that decision alone); or `Err` with the
/// reply that concerns the whole call (`NOSCRIPT`, a script that could not run), for the caller
/// to hand to each of the `n`. A call of one decision answers that decision's reply itself.
pub fn split_batch(reply: Reply, n: usize) -> Result<Vec<Reply>, Reply> {
    match reply {
        Reply::Error(_) => Err(reply),
        reply if n == 1 => Ok(vec![reply]),
        Reply::Array(Some(items)) if items.len() == n => Ok(items),
        other => Err(other),
    }
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
    /// `limit` units per calendar period (`crate::quota::Period`), one counter per key that
    /// ends with the period. The window field carries [`crate::quota::Period::encode`].
    CalendarQuota,
    /// A balance of credits the operator sets and tops up; requests draw their cost from it.
    /// The burst field carries the balance of a missing key (0: none).
    Balance,
    /// Not a zone's: `ratelimit_admin` sets (window field 1) or adds to (2) a balance the cost.
    BalanceAdmin,
    /// Not a zone's: `ratelimit_admin`'s `DELETE` removes the key, whatever its algorithm.
    Reset,
    /// `limit` requests in flight per key, no window: each admitted request holds a slot, a
    /// sorted-set member of its own scored by when the slot lapses (`crate::slots`). The window
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

/// One zone's share of a decision's arguments, with the request's own limit, window and cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoneArgs<'a> {
    pub key: Key<'a>,
    pub algorithm: Algorithm,
    pub limit: u64,
    pub window_ms: u64,
    pub cost: u64,
    /// GCRA: units that may arrive at once; balance: the balance of a missing key.
    pub burst: u64,
    /// `sliding_log` with `member=request_id`: the request's id, the base of its members. It
    /// goes as algorithm `r`, in the place of `burst`, which the log does not use.
    /// `concurrency`: the request's member, in the same place.
    pub member: Option<&'a [u8]>,
    /// `lease=`: the units to reserve besides the cost (0: none, an exact decision) and the
    /// reservation's life in ms. The zone then goes as `<letter>+<want>:<life>`.
    pub lease: Option<(u64, u64)>,
}

/// Arguments per zone after the key, in the order `lua/decide.lua` reads them.
const ARGS_PER_ZONE: usize = 5;

/// One decision's share of a call, RESP-encoded once so that it can join any batch and a
/// `NOSCRIPT` retry with `EVAL` reuses it unchanged: its zone keys, then its arguments
/// `now (algorithm limit window cost burst)..`, kept apart because a call puts every decision's
/// keys before all the arguments. The script tells decisions apart by their clocks (numbers or
/// empty, never an algorithm), so a call of one decision is exactly the command it always was.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedArgs {
    /// The keys, then the arguments.
    bytes: Vec<u8>,
    keys_len: usize,
    zones: usize,
    /// Per zone, whether it asks for a reservation (and so is answered with six fields); empty
    /// when none does.
    leased: Vec<bool>,
}

impl EncodedArgs {
    /// `now_ms` is `None` for `clock=redis`: the script then reads Redis `TIME`. The zones are
    /// walked three times (size, keys, figures), so callers can build them on the fly.
    pub fn new<'a>(
        zones: impl ExactSizeIterator<Item = ZoneArgs<'a>> + Clone,
        now_ms: Option<u64>,
    ) -> Self {
        let count = zones.len();
        let key_len = |z: &ZoneArgs<'_>| z.key.parts().iter().map(|p| p.len()).sum::<usize>();
        let mut bytes =
            Vec::with_capacity(40 + zones.clone().map(|z| key_len(&z) + 96).sum::<usize>());
        for z in zones.clone() {
            resp::put_bulk_parts(&mut bytes, &z.key.parts());
        }
        let keys_len = bytes.len();
        match now_ms {
            Some(now) => resp::put_bulk_int(&mut bytes, now),
            None => resp::put_bulk(&mut bytes, b""),
        }
        let mut leased = Vec::new();
        for (i, z) in zones.enumerate() {
            let code = match z.algorithm {
                Algorithm::SlidingLog if z.member.is_some() => b"r",
                a => a.code(),
            };
            match z.lease {
                Some((want, life_ms)) => {
                    leased.resize(count, false);
                    leased[i] = true;
                    let field = format!("{}+{want}:{life_ms}", code[0] as char);
                    resp::put_bulk(&mut bytes, field.as_bytes());
                }
                None => resp::put_bulk(&mut bytes, code),
            }
            resp::put_bulk_int(&mut bytes, z.limit);
            resp::put_bulk_int(&mut bytes, z.window_ms);
            resp::put_bulk_int(&mut bytes, z.cost);
            match z.member {
                Some(id) => resp::put_bulk(&mut bytes, id),
                None => {
                    let burst = match z.algorithm {
                        Algorithm::Gcra | Algorithm::Balance => z.burst,
                        _ => 0,
                    };
                    resp::put_bulk_int(&mut bytes, burst);
                }
            }
        }
        EncodedArgs { bytes, keys_len, zones: count, leased }
    }

    /// A decision of its own that returns a reservation's unspent units (`G<letter><rid>`).
    pub fn give_back(g: &GiveBack, algorithm: Algorithm) -> Self {
        let (mut digits, mut op) = ([0u8; 20], [0u8; 22]);
        let token = resp::fmt_u64(g.token, &mut digits);
        let op = rid_op(&mut op, &[b'G', algorithm.code()[0]], g.rid);
        Self::one_zone(&g.key, op, g.limit, g.window_ms, g.units, token)
    }

    /// A decision of its own that asks whether the reservation `rid` is still of the present
    /// life of `key` (`V<rid>`): it reads only.
    pub fn check(key: &[u8], rid: u64) -> Self {
        let mut op = [0u8; 21];
        let op = rid_op(&mut op, b"V", rid);
        Self::one_zone(key, op, 1, 1, 0, b"0")
    }

    /// A concurrency slot's release (`Gn`) or renewal (`Rn`), a decision of its own.
    pub fn slot_op(op: SlotOp, s: &SlotRef<'_>) -> Self {
        let op: &[u8] = if op == SlotOp::Release { b"Gn" } else { b"Rn" };
        Self::one_zone(s.key, op, s.limit, s.life_ms, 1, s.member)
    }

    /// A one-zone decision a worker sends without a request, on its script clock ("").
    fn one_zone(key: &[u8], op: &[u8], limit: u64, window_ms: u64, cost: u64, last: &[u8]) -> Self {
        let mut bytes = Vec::with_capacity(key.len() + last.len() + 64);
        resp::put_bulk(&mut bytes, key);
        let keys_len = bytes.len();
        resp::put_bulk(&mut bytes, b"");
        resp::put_bulk(&mut bytes, op);
        resp::put_bulk_int(&mut bytes, limit);
        resp::put_bulk_int(&mut bytes, window_ms);
        resp::put_bulk_int(&mut bytes, cost);
        resp::put_bulk(&mut bytes, last);
        EncodedArgs { bytes, keys_len, zones: 1, leased: Vec::new() }
    }

    /// Whether zone `i` asked for a reservation.
    pub fn leased(&self, i: usize) -> bool {
        self.leased.get(i).copied().unwrap_or(false)
    }

    /// The Cluster slot all the keys share, if they do: one script call touches one slot.
    /// Read back from the encoded keys, so that only a Cluster pays for it.
    pub fn slot(&self) -> Option<u16> {
        let mut slots = resp::bulk_strings(self.keys()).map(|key| slot::key_slot(&[key]));
        let first = slots.next()?;
        slots.all(|s| s == first).then_some(first)
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

/// What a worker does to a slot it holds, without a request deciding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotOp {
    Release,
    Renew,
}

/// A slot as its release or renewal names it: the whole Redis key, the zone's limit (for the
/// remaining count the reply carries), the slot's life and the request's member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRef<'a> {
    pub key: &'a [u8],
    pub limit: u64,
    pub life_ms: u64,
    pub member: &'a [u8],
}

/// `head` followed by the digits of `rid`, in `buf`.
fn rid_op<'a>(buf: &'a mut [u8], head: &[u8], rid: u64) -> &'a [u8] {
    let mut digits = [0u8; 20];
    let rid = resp::fmt_u64(rid, &mut digits);
    buf[..head.len()].copy_from_slice(head);
    buf[head.len()..head.len() + rid.len()].copy_from_slice(rid);
    &buf[..head.len() + rid.len()]
}

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

/// Reads the script's reply for a decision over `zones` zones, none asking for a reservation.
pub fn decode_decision(reply: &Reply, zones: usize) -> Result<Decision, ReplyError> {
    decode_args_reply(reply, zones, |_| false)
}

/// Reads the script's reply for the decision `args` encoded.
pub fn decode_reply(reply: &Reply, args: &EncodedArgs) -> Result<Decision, ReplyError> {
    decode_args_reply(reply, args.zones, |i| args.leased(i))
}

/// A zone that asked for a reservation answers seven fields, the others three.
fn decode_args_reply(
    reply: &Reply,
    zones: usize,
    leased: impl Fn(usize) -> bool,
) -> Result<Decision, ReplyError> {
    let len = 1 + (0..zones).map(|z| if leased(z) { 7 } else { 3 }).sum::<usize>();
    let items = match reply {
        Reply::Error(msg) if msg.starts_with(b"NOSCRIPT") => return Err(ReplyError::NoScript),
        Reply::Error(msg) => return Err(ReplyError::Redis(String::from_utf8_lossy(msg).into())),
        Reply::Array(Some(items)) if items.len() == len && zones > 0 => items,
        _ => return Err(ReplyError::Unexpected),
    };
    let int = |i: usize| match items[i] {
        Reply::Int(v) if v >= 0 => Ok(v as u64),
        _ => Err(ReplyError::Unexpected),
    };
    let allowed = match int(0)? {
        0 => false,
        1 => true,
        _ => return Err(ReplyError::Unexpected),
    };
    let mut at = 1;
    let zones = (0..zones)
        .map(|z| {
            let mut v = ZoneVerdict {
                ok: int(at)? == 1,
                remaining: int(at + 1)?,
                reset_ms: int(at + 2)?,
                grant: Grant::default(),
            };
            at += 3;
            if leased(z) {
                v.grant = Grant {
                    units: int(at)?,
                    life_ms: int(at + 1)?,
                    token: int(at + 2)?,
                    rid: int(at + 3)?,
                };
                at += 4;
            }
            Ok(v)
        })
        .collect::<Result<Vec<_>, _>>()?;
    if allowed && zones.iter().any(|z| !z.ok) {
        return Err(ReplyError::Unexpected);
    }
    Ok(Decision { allowed, zones })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha_matches_redis_script_load() {
        // `redis-cli SCRIPT LOAD "return 1"` answers this hash.
        assert_eq!(&sha1_hex(b"return 1"), b"e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
        assert_eq!(script().sha, sha1_hex(SCRIPT.as_bytes()));
        assert_eq!(script().body, SCRIPT);
        assert!(std::ptr::eq(script(), script()), "one script, its hash computed once");
    }

    fn zone(key: Key<'_>, algorithm: Algorithm, cost: u64) -> ZoneArgs<'_> {
        ZoneArgs {
            key,
            algorithm,
            limit: 100,
            window_ms: 60_000,
            cost,
            burst: 7,
            member: None,
            lease: None,
        }
    }

    #[test]
    fn a_batch_of_one_is_the_plain_call() {
        let zones = [
            zone(Key::new(b"rl:", b"api", b"a"), Algorithm::SlidingLog, 1),
            zone(Key::new(b"rl:", b"ip", b"10.0.0.1"), Algorithm::Gcra, 3),
        ];
        let args = EncodedArgs::new(zones.iter().copied(), Some(1_700_000_000_123));
        assert_call(
            &args,
            &[
                "2",
                "rl:api:a",
                "rl:ip:10.0.0.1",
                "1700000000123",
                "l",
                "100",
                "60000",
                "1",
                "0",
                "g",
                "100",
                "60000",
                "3",
                "7",
            ],
        );
    }

    #[test]
    fn request_id_members_go_as_algorithm_r_in_the_place_of_burst() {
        let mut z = zone(Key::new(b"rl:", b"api", b"a"), Algorithm::SlidingLog, 2);
        z.member = Some(b"0123456789abcdef0123456789abcdef");
        let args = EncodedArgs::new([z].into_iter(), None);
        assert_call(
            &args,
            &["1", "rl:api:a", "", "r", "100", "60000", "2", "0123456789abcdef0123456789abcdef"],
        );
    }

    #[test]
    fn a_zone_asking_for_a_reservation_names_it_in_its_algorithm_field_and_gets_seven_fields() {
        let mut z = zone(Key::new(b"rl:", b"api", b"a"), Algorithm::SlidingCounter, 1);
        z.lease = Some((50, 1000));
        let plain = zone(Key::new(b"rl:", b"ip", b"b"), Algorithm::Gcra, 1);
        let args = EncodedArgs::new([z, plain].into_iter(), Some(7));
        assert_call(
            &args,
            &[
                "2",
                "rl:api:a",
                "rl:ip:b",
                "7",
                "c+50:1000",
                "100",
                "60000",
                "1",
                "0",
                "g",
                "100",
                "60000",
                "1",
                "7",
            ],
        );
        let d = decode_reply(&ints(&[1, 1, 40, 900, 10, 1000, 77, 99, 1, 5, 600]), &args).unwrap();
        assert_eq!(d.zones[0].grant, Grant { units: 10, life_ms: 1000, token: 77, rid: 99 });
        assert_eq!((d.zones[1].remaining, d.zones[1].grant), (5, Grant::default()));
        // Three fields for the reserving zone: not the script's answer.
        assert_eq!(
            decode_reply(&ints(&[1, 1, 40, 900, 1, 5, 600]), &args),
            Err(ReplyError::Unexpected)
        );
    }

    #[test]
    fn a_give_back_is_a_decision_of_its_own() {
        let g = GiveBack {
            zone: 0,
            key: b"rl:api:a".to_vec(),
            units: 3,
            token: 1234,
            rid: 1_700_000_000_123_456,
            limit: 100,
            window_ms: 60_000,
        };
        let args = EncodedArgs::give_back(&g, Algorithm::SlidingLog);
        let op = "Gl1700000000123456";
        assert_call(&args, &["1", "rl:api:a", "", op, "100", "60000", "3", "1234"]);
        let check = EncodedArgs::check(b"rl:api:a", u64::MAX);
        assert_call(&check, &["1", "rl:api:a", "", "V18446744073709551615", "1", "1", "0", "0"]);
    }

    #[test]
    fn a_concurrency_zone_sends_its_member_and_a_slot_is_released_or_renewed_alone() {
        let mut z = zone(Key::new(b"rl:", b"conc", b"a"), Algorithm::Concurrency, 1);
        z.member = Some(b"f00d");
        z.window_ms = 5000;
        let args = EncodedArgs::new([z].into_iter(), None);
        assert_call(&args, &["1", "rl:conc:a", "", "n", "100", "5000", "1", "f00d"]);
        let s = SlotRef { key: b"rl:conc:a", limit: 5, life_ms: 5000, member: b"f00d" };
        let release = EncodedArgs::slot_op(SlotOp::Release, &s);
        assert_call(&release, &["1", "rl:conc:a", "", "Gn", "5", "5000", "1", "f00d"]);
        let renew = EncodedArgs::slot_op(SlotOp::Renew, &s);
        assert_call(&renew, &["1", "rl:conc:a", "", "Rn", "5", "5000", "1", "f00d"]);
        // A renewal that finds the slot gone: not allowed, the zone not ok.
        assert!(!decode_decision(&ints(&[0, 0, 4, 0]), 1).unwrap().allowed);
        assert_eq!(Algorithm::parse("concurrency"), Some(Algorithm::Concurrency));
        assert_eq!(Algorithm::Concurrency.capacity(5, 1), 5);
    }

    #[test]
    fn the_slot_of_a_decision_is_the_one_all_its_keys_share() {
        let alg = Algorithm::SlidingLog;
        let one = [zone(Key::new(b"rl:", b"api", b"consumer-42"), alg, 0)];
        assert_eq!(EncodedArgs::new(one.iter().copied(), None).slot(), Some(14017));
        let tagged = [
            zone(Key::new(b"rl:", b"min", b"{user1000}"), alg, 0),
            zone(Key::new(b"rl:", b"day", b"{user1000}"), alg, 0),
        ];
        assert_eq!(EncodedArgs::new(tagged.iter().copied(), Some(1)).slot(), Some(3443));
        let apart = [
            zone(Key::new(b"rl:", b"min", b"a"), alg, 0),
            zone(Key::new(b"rl:", b"day", b"a"), alg, 0),
        ];
        assert_eq!(EncodedArgs::new(apart.iter().copied(), None).slot(), None);
        // Keys with CR, LF and `$` in them are read back whole.
        let odd = [zone(Key::new(b"rl:", b"api", b"a\r\n$3\r\n{x}"), alg, 0)];
        let slot = crate::redis::slot::key_slot(&[b"rl:api:a\r\n$3\r\n{x}"]);
        assert_eq!(EncodedArgs::new(odd.iter().copied(), None).slot(), Some(slot));
    }

    /// A decision of one zone (clock from Redis) and one of two (a gateway clock of 42 ms).
    fn two_decisions() -> (EncodedArgs, EncodedArgs) {
        let one = [zone(Key::new(b"rl:", b"api", b"a"), Algorithm::SlidingCounter, 2)];
        let two = [
            zone(Key::new(b"rl:", b"ip", b"b"), Algorithm::SlidingLog, 0),
            zone(Key::new(b"rl:", b"user", b"c"), Algorithm::Gcra, 1),
        ];
        (
            EncodedArgs::new(one.iter().copied(), None),
            EncodedArgs::new(two.iter().copied(), Some(42)),
        )
    }

    #[test]
    fn a_batch_puts_every_key_before_every_argument() {
        let (a, b) = two_decisions();
        let mut cmd = Vec::new();
        write_batch(&mut cmd, &Script { body: "", sha: [b'0'; 40] }, &[&a, &b, &a], false);
        let mut expected = redis::cmd("EVALSHA");
        expected.arg(&[b'0'; 40][..]).arg(4).arg("rl:api:a").arg("rl:ip:b").arg("rl:user:c");
        expected.arg("rl:api:a");
        expected.arg("").arg("c").arg(100).arg(60_000).arg(2).arg(0);
        expected.arg(42).arg("l").arg(100).arg(60_000).arg(0).arg(0);
        expected.arg("g").arg(100).arg(60_000).arg(1).arg(7);
        expected.arg("").arg("c").arg(100).arg(60_000).arg(2).arg(0);
        assert_eq!(cmd, expected.get_packed_command());
        // What each decision adds: all but the call's header ("*26" against "*3" when empty).
        let mut empty = Vec::new();
        write_batch(&mut empty, &Script { body: "", sha: [b'0'; 40] }, &[], false);
        assert_eq!(cmd.len(), empty.len() + 1 + 2 * a.wire_len() + b.wire_len());
    }

    #[test]
    fn a_node_batch_declares_the_keys_of_its_first_decision_only() {
        let (a, b) = two_decisions();
        let script = Script { body: "", sha: [b'0'; 40] };
        let mut cmd = Vec::new();
        write_batch(&mut cmd, &script, &[&b, &a, &a], true);
        let mut expected = redis::cmd("EVALSHA");
        expected.arg(&[b'0'; 40][..]).arg(2).arg("rl:ip:b").arg("rl:user:c");
        expected.arg("k2").arg("rl:api:a").arg("rl:api:a");
        expected.arg(42).arg("l").arg(100).arg(60_000).arg(0).arg(0);
        expected.arg("g").arg(100).arg(60_000).arg(1).arg(7);
        expected.arg("").arg("c").arg(100).arg(60_000).arg(2).arg(0);
        expected.arg("").arg("c").arg(100).arg(60_000).arg(2).arg(0);
        assert_eq!(cmd, expected.get_packed_command());
        // A batch of one declares its keys, as ever: no marker.
        let (mut alone, mut plain) = (Vec::new(), Vec::new());
        write_batch(&mut alone, &script, &[&b], true);
        write_batch(&mut plain, &script, &[&b], false);
        assert_eq!(alone, plain);
    }

    #[test]
    fn splits_a_batch_reply() {
        let d = |allowed: i64| ints(&[allowed, allowed, 5, 100]);
        let wrong = Reply::Error(b"WRONGTYPE Operation".to_vec());
        let three = Reply::Array(Some(vec![d(1), wrong.clone(), d(0)]));
        let parts = split_batch(three, 3).unwrap();
        assert_eq!(parts, vec![d(1), wrong.clone(), d(0)]);
        assert!(decode_decision(&parts[0], 1).unwrap().allowed);
        assert_eq!(
            decode_decision(&parts[1], 1),
            Err(ReplyError::Redis("WRONGTYPE Operation".into()))
        );
        assert!(!decode_decision(&parts[2], 1).unwrap().allowed);

        // One decision: the reply is that decision's.
        assert_eq!(split_batch(d(1), 1), Ok(vec![d(1)]));
        let noscript = Reply::Error(b"NOSCRIPT No matching script".to_vec());
        for n in [1, 2] {
            assert_eq!(split_batch(noscript.clone(), n), Err(noscript.clone()));
        }
        // A reply of another shape concerns the whole call; each decision then decodes it as
        // unexpected.
        let short = Reply::Array(Some(vec![d(1)]));
        assert_eq!(split_batch(short.clone(), 2), Err(short.clone()));
        assert_eq!(decode_decision(&short, 1), Err(ReplyError::Unexpected));
        assert_eq!(split_batch(Reply::Int(1), 2), Err(Reply::Int(1)));
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

    #[test]
    fn redis_clock_sends_an_empty_now() {
        let zones = [zone(Key::new(b"", b"z", b"k"), Algorithm::SlidingCounter, 0)];
        let mut cmd = Vec::new();
        let args = EncodedArgs::new(zones.iter().copied(), None);
        write_batch(&mut cmd, &Script { body: "", sha: [b'0'; 40] }, &[&args], false);
        assert!(cmd.windows(6).any(|w| w == b"$0\r\n\r\n"));
    }

    #[test]
    fn algorithms() {
        assert_eq!(Algorithm::parse("gcra"), Some(Algorithm::Gcra));
        assert_eq!(Algorithm::parse("sliding_counter"), Some(Algorithm::SlidingCounter));
        assert_eq!(Algorithm::parse("sliding_log"), Some(Algorithm::SlidingLog));
        assert_eq!(Algorithm::parse("sliding_log_packed"), Some(Algorithm::SlidingLogPacked));
        assert_eq!(Algorithm::SlidingLogPacked.capacity(100, 5), 100);
        assert_eq!(Algorithm::parse("log"), None);
        assert_eq!(Algorithm::Gcra.capacity(100, 5), 5);
        assert_eq!(Algorithm::SlidingLog.capacity(100, 5), 100);
        assert_eq!(Algorithm::SlidingLog.max_limit(), 100_000);
        assert_eq!(Algorithm::SlidingLogPacked.max_limit(), 10_000);
        assert_eq!(Algorithm::Gcra.max_limit(), MAX_LIMIT);
        assert_eq!(Algorithm::parse("balance"), Some(Algorithm::Balance));
        assert_eq!(Algorithm::CalendarQuota.capacity(100, 5), 100);
        assert_eq!(Algorithm::Balance.capacity(100, 5), u64::MAX);
    }

    /// `args` as the one decision of a call: `EVALSHA <sha> <fields>`, as the redis crate packs it.
    fn assert_call(args: &EncodedArgs, fields: &[&str]) {
        let mut expected = redis::cmd("EVALSHA");
        expected.arg(&[b'f'; 40][..]);
        for f in fields {
            expected.arg(*f);
        }
        let mut cmd = Vec::new();
        write_batch(&mut cmd, &Script { body: "return 1", sha: [b'f'; 40] }, &[args], false);
        assert_eq!(cmd, expected.get_packed_command());
    }

    fn ints(v: &[i64]) -> Reply {
        Reply::Array(Some(v.iter().map(|&i| Reply::Int(i)).collect()))
    }

    #[test]
    fn decodes_allow_and_deny() {
        let d = decode_decision(&ints(&[1, 1, 41, 17_000]), 1).unwrap();
        assert_eq!(
            d,
            Decision {
                allowed: true,
                zones: vec![ZoneVerdict {
                    ok: true,
                    remaining: 41,
                    reset_ms: 17_000,
                    grant: Grant::default()
                }]
            }
        );
        let d = decode_decision(&ints(&[0, 1, 5, 100, 0, 0, 900, 0, 0, 1200]), 3).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.deciding_zone(), 2);
        let d = decode_decision(&ints(&[1, 1, 5, 100, 1, 2, 900]), 2).unwrap();
        assert_eq!(d.deciding_zone(), 1);
    }

    #[test]
    fn rejects_bad_replies() {
        assert_eq!(
            decode_decision(&Reply::Error(b"NOSCRIPT No matching script".to_vec()), 1),
            Err(ReplyError::NoScript)
        );
        assert_eq!(
            decode_decision(&Reply::Error(b"WRONGTYPE Operation".to_vec()), 1),
            Err(ReplyError::Redis("WRONGTYPE Operation".into()))
        );
        for bad in
            [ints(&[1, 1, 2]), ints(&[2, 1, 2, 3]), ints(&[1, 0, 2, 3]), ints(&[1, 1, -2, 3])]
        {
            assert_eq!(decode_decision(&bad, 1), Err(ReplyError::Unexpected), "{bad:?}");
        }
        assert_eq!(decode_decision(&Reply::Bulk(None), 1), Err(ReplyError::Unexpected));
    }
}

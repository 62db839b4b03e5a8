//! A decision's arguments as the script reads them, encoded once per decision: a request's
//! zones, and the one-zone decisions a worker sends without a request (give-backs, checks,
//! slot releases and renewals).

use crate::codec::call::Args;
use crate::codec::resp;
use crate::decide::key::Key;
use crate::decide::lease::GiveBack;
use crate::decide::text::StackText;

use super::Algorithm;

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
    /// In a location where some zone has `delay=`: this zone's longest wait in ms (0 for a zone
    /// without it). Every zone of such a decision sends one, as `<field>~<ms>`, and is answered
    /// with seven fields: a delayed request is recorded in each of them, to be given back.
    pub delay: Option<u64>,
    /// Whether the cost goes as a placement even when admitted now, answered with seven fields:
    /// its token and rid name it for a give-back.
    pub place: Place,
    /// The figures above, encoded when the configuration fixed them: copied when they still
    /// match, so a request formats none of its zone's numbers.
    pub figures: Option<&'a EncodedFigures>,
}

/// A zone's limit, window, cost and burst as the script reads them, encoded once for a
/// `ratelimit` line whose figures no variable sets (the common case): four numbers formatted
/// per request were about a tenth of the worker's own cost of an exact decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedFigures {
    limit: u64,
    window_ms: u64,
    cost: u64,
    burst: u64,
    bytes: Box<[u8]>,
    /// Where the limit's digits lie in `bytes`.
    limit_digits: core::ops::Range<usize>,
}

impl EncodedFigures {
    /// `window_ms` as the script reads it (a calendar period's code), `burst` the zone's.
    pub fn new(algorithm: Algorithm, limit: u64, window_ms: u64, cost: u64, burst: u64) -> Self {
        let burst = sent_burst(algorithm, burst);
        let mut bytes = Vec::with_capacity(64);
        put_figures(&mut bytes, limit, window_ms, cost);
        resp::put_bulk_int(&mut bytes, burst);
        // `$<length>\r\n<digits>\r\n` first.
        let start = bytes.iter().position(|&b| b == b'\n').map_or(0, |at| at + 1);
        let end = start + bytes[start..].iter().position(|&b| b == b'\r').unwrap_or(0);
        let bytes = bytes.into_boxed_slice();
        EncodedFigures { limit, window_ms, cost, burst, bytes, limit_digits: start..end }
    }

    /// The limit in decimal, when a request's `limit` is this line's: the legacy
    /// `RateLimit-Limit` value, sent from here rather than written again per request.
    pub fn limit_digits(&self, limit: u64) -> Option<&[u8]> {
        (limit == self.limit).then(|| &self.bytes[self.limit_digits.clone()])
    }

    /// Whether these are `z`'s figures: a request may change its own (`ratelimit_fail local`'s
    /// share), and a member goes in the burst's place.
    fn of(&self, z: &ZoneArgs<'_>) -> bool {
        z.member.is_none()
            && (self.limit, self.window_ms, self.cost) == (z.limit, z.window_ms, z.cost)
            && self.burst == sent_burst(z.algorithm, z.burst)
    }
}

/// The burst a zone sends: gcra's and a balance's; the others read none and are sent 0.
fn sent_burst(algorithm: Algorithm, burst: u64) -> u64 {
    match algorithm {
        Algorithm::Gcra | Algorithm::Balance => burst,
        _ => 0,
    }
}

/// A zone's first three figures; the member or the burst follows.
fn put_figures(bytes: &mut Vec<u8>, limit: u64, window_ms: u64, cost: u64) {
    resp::put_bulk_int(bytes, limit);
    resp::put_bulk_int(bytes, window_ms);
    resp::put_bulk_int(bytes, cost);
}

/// Why a zone's cost is recorded as a placement even when admitted now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Place {
    #[default]
    No,
    /// `settle=` (`<field>!`): the settlement, when the request ends, names it.
    Settle,
    /// A location on several backends (`<field>^`): given back at once when another backend
    /// refuses the request, or never; Redis forgets its name after a few seconds.
    Undo,
}

/// A decision's arguments: its zone keys, then `now (algorithm limit window cost burst)..`, one
/// group of `codec::call::ARGS_PER_ZONE` per zone. The script tells decisions apart by their clocks (numbers
/// or empty, never an algorithm), so a call of one decision is exactly the command it always was.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedArgs {
    call: Args,
    /// Bit i: whether zone i asks for a reservation or may wait (and so is answered with seven
    /// fields). A location names at most [`MAX_ZONES`] zones.
    leased: u64,
}

/// The most zones one decision (a location) may name: `nginx -t` refuses more.
pub const MAX_ZONES: usize = 64;
const _: () = assert!(MAX_ZONES <= u64::BITS as usize);

impl EncodedArgs {
    /// `now_ms` is `None` for `clock=redis`: the script then reads Redis `TIME`. The zones are
    /// walked three times (size, keys, figures), so callers can build them on the fly.
    pub fn new<'a>(
        zones: impl ExactSizeIterator<Item = ZoneArgs<'a>> + Clone,
        now_ms: Option<u64>,
    ) -> Self {
        Self::new_in(Vec::new(), zones, now_ms)
    }

    /// [`EncodedArgs::new`], written in `room` (kept from an earlier decision: no allocation).
    pub fn new_in<'a>(
        room: Vec<u8>,
        zones: impl ExactSizeIterator<Item = ZoneArgs<'a>> + Clone,
        now_ms: Option<u64>,
    ) -> Self {
        let count = zones.len();
        let key_len = |z: &ZoneArgs<'_>| z.key.parts().iter().map(|p| p.len()).sum::<usize>();
        let mut bytes = room;
        bytes.clear();
        bytes.reserve(40 + zones.clone().map(|z| key_len(&z) + 96).sum::<usize>());
        for z in zones.clone() {
            resp::put_bulk_parts(&mut bytes, &z.key.parts());
        }
        let keys_len = bytes.len();
        match now_ms {
            Some(now) => resp::put_bulk_int(&mut bytes, now),
            None => resp::put_bulk(&mut bytes, b""),
        }
        let mut leased = 0u64;
        for (i, z) in zones.enumerate() {
            let code = match z.algorithm {
                Algorithm::SlidingLog if z.member.is_some() => b"r",
                a => a.code(),
            };
            if z.lease.is_none() && z.delay.is_none() && z.place == Place::No {
                resp::put_bulk(&mut bytes, code);
            } else {
                // i < MAX_ZONES: more is refused by `nginx -t`.
                leased |= 1 << i;
                let mut field = StackText::default();
                field.push(code);
                if let Some((want, life_ms)) = z.lease {
                    field.push(b"+").num(want).push(b":").num(life_ms);
                }
                if let Some(ms) = z.delay {
                    field.push(b"~").num(ms);
                }
                let mark: &[u8] = match z.place {
                    Place::Settle => b"!",
                    Place::Undo => b"^",
                    Place::No => b"",
                };
                field.push(mark);
                resp::put_bulk(&mut bytes, field.get().unwrap_or(code));
            }
            match (z.member, z.figures) {
                (None, Some(f)) if f.of(&z) => bytes.extend_from_slice(&f.bytes),
                (member, _) => {
                    put_figures(&mut bytes, z.limit, z.window_ms, z.cost);
                    match member {
                        Some(id) => resp::put_bulk(&mut bytes, id),
                        None => resp::put_bulk_int(&mut bytes, sent_burst(z.algorithm, z.burst)),
                    }
                }
            }
        }
        EncodedArgs { call: Args::new(bytes, keys_len, count), leased }
    }

    /// A decision of its own that returns a reservation's unspent units (`G<letter><rid>`),
    /// written in `room` (each of these builders: a buffer kept from an earlier one, or new).
    /// `window_ms` is `g`'s as the script reads it (a calendar period's code), as the zone's
    /// decisions send it.
    pub fn give_back(room: Vec<u8>, g: &GiveBack, algorithm: Algorithm, window_ms: u64) -> Self {
        let (mut digits, mut op) = ([0u8; 20], [0u8; 22]);
        let token = resp::fmt_u64(g.token, &mut digits);
        let op = rid_op(&mut op, &[b'G', algorithm.code()[0]], g.rid);
        Self::one_zone(room, &[&g.key], op, g.limit, window_ms, g.units, token)
    }

    /// A decision of its own that charges `g.units` more of a placement's key, past its limit
    /// (`C<letter><rid>`): a settled value above the estimate. `window_ms` as for `give_back`,
    /// `burst` as the zone's decisions send it (gcra's, a balance's default).
    pub fn charge(
        room: Vec<u8>,
        g: &GiveBack,
        algorithm: Algorithm,
        window_ms: u64,
        burst: u64,
    ) -> Self {
        let (mut digits, mut op) = ([0u8; 20], [0u8; 22]);
        let burst = resp::fmt_u64(burst, &mut digits);
        let op = rid_op(&mut op, &[b'C', algorithm.code()[0]], g.rid);
        Self::one_zone(room, &[&g.key], op, g.limit, window_ms, g.units, burst)
    }

    /// A decision of its own that asks whether the reservation `rid` is still of the present
    /// life of `key` (`V<rid>`): it reads only.
    pub fn check(room: Vec<u8>, key: &[u8], rid: u64) -> Self {
        let mut op = [0u8; 21];
        let op = rid_op(&mut op, b"V", rid);
        Self::one_zone(room, &[key], op, 1, 1, 0, b"0")
    }

    /// A concurrency slot's release (`Gn`) or renewal (`Rn`), a decision of its own.
    pub fn slot_op(room: Vec<u8>, op: SlotOp, s: &SlotRef<'_>) -> Self {
        let op: &[u8] = if op == SlotOp::Release { b"Gn" } else { b"Rn" };
        Self::one_zone(room, &s.key, op, s.limit, s.life_ms, 1, s.member)
    }

    /// A one-zone decision a worker sends without a request, on its script clock ("").
    fn one_zone(
        mut bytes: Vec<u8>,
        key: &[&[u8]],
        op: &[u8],
        limit: u64,
        window_ms: u64,
        cost: u64,
        last: &[u8],
    ) -> Self {
        bytes.clear();
        bytes.reserve(key.iter().map(|p| p.len()).sum::<usize>() + last.len() + 64);
        resp::put_bulk_parts(&mut bytes, key);
        let keys_len = bytes.len();
        resp::put_bulk(&mut bytes, b"");
        resp::put_bulk(&mut bytes, op);
        resp::put_bulk_int(&mut bytes, limit);
        resp::put_bulk_int(&mut bytes, window_ms);
        resp::put_bulk_int(&mut bytes, cost);
        resp::put_bulk(&mut bytes, last);
        EncodedArgs { call: Args::new(bytes, keys_len, 1), leased: 0 }
    }

    /// Whether zone `i` asked for a reservation.
    pub fn leased(&self, i: usize) -> bool {
        i < MAX_ZONES && self.leased & (1 << i) != 0
    }

    /// The share of a script call that carries it.
    pub fn call(&self) -> &Args {
        &self.call
    }

    /// Its buffer, for [`EncodedArgs::new_in`] to write another decision in.
    pub fn into_room(self) -> Vec<u8> {
        self.call.into_bytes()
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
    /// The whole key, in parts (`Key::parts`, or one part and empty ones).
    pub key: [&'a [u8]; 4],
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

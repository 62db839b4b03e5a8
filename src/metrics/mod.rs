//! Counters shared by every worker, for `ratelimit_metrics`: one array of 64-bit cells in a
//! shared memory zone (`ratelimit_metrics_zone`), updated with relaxed atomic adds where outcomes
//! happen and read whole by the metrics location.
//!
//! The cells are found or allocated when the zone is set up, by zone and Redis backend name
//! ([`store`]), so counting never allocates and a reload keeps the counters of the zones and
//! backends it keeps. A zone too small for them leaves [`Metrics::disabled`], which counts nothing and
//! exports nothing (said once, at start).
//!
//! Pure Rust over the cells' memory, without nginx: the glue sets up the shared zone and serves
//! the page (`crate::glue::metrics_zone`, `crate::glue::metrics_page`) and hands each backend's
//! [`Metrics`] handle ([`Metrics::backend`]) to `crate::redis` when it makes the worker's pool
//! for that backend. Imports
//! `crate::decide::status` (the statuses it counts) and nothing else of the crate.

pub mod format;
pub mod store;

use core::ptr;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::decide::status::Status;
use store::Cells;

/// The statuses counted per zone: every final status of a request that has zones to count in
/// (`SKIPPED` has none, `PENDING` is no decision).
pub const STATUSES: [Status; 9] = [
    Status::Passed,
    Status::PassedLease,
    Status::Rejected,
    Status::RejectedCached,
    Status::RejectedDryRun,
    Status::PassedLocal,
    Status::RejectedLocal,
    Status::FailedOpen,
    Status::FailedClosed,
];

/// Upper bounds of the Redis round-trip histogram, in µs: 0.1 ms to 1 s, as Prometheus's
/// defaults space them (1, 2.5, 5 per decade).
pub const BUCKETS_US: [u64; 13] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000,
];

/// Why a decision could not be had from Redis, other than an error reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Refused,
    Timeout,
    Closed,
    Io,
    Protocol,
    Overloaded,
}

pub const ERROR_KINDS: [(ErrorKind, &str); 6] = [
    (ErrorKind::Refused, "refused"),
    (ErrorKind::Timeout, "timeout"),
    (ErrorKind::Closed, "closed"),
    (ErrorKind::Io, "io"),
    (ErrorKind::Protocol, "protocol"),
    (ErrorKind::Overloaded, "overloaded"),
];

/// Error reply classes (the reply's first word); any other is `other`.
pub const REPLY_CLASSES: [&str; 13] = [
    "NOSCRIPT",
    "LOADING",
    "BUSY",
    "READONLY",
    "OOM",
    "NOAUTH",
    "WRONGPASS",
    "NOPERM",
    "MASTERDOWN",
    "MISCONF",
    "WRONGTYPE",
    "ERR",
    "other",
];

/// Counters of a Redis backend; [`Metrics::count`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    Connects = R_CONNECTS as isize,
    ScriptLoads = R_SCRIPT_LOADS as isize,
    BreakerOpenings = R_BREAKER_OPENINGS as isize,
    Rerouted = R_REROUTED as isize,
}

/// Gauges summed over the workers; [`Metrics::gauge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gauge {
    /// Decisions written to Redis and not answered yet.
    InFlight = R_IN_FLIGHT as isize,
    /// Connections open or opening.
    Connections = R_CONNECTIONS as isize,
    /// Workers whose circuit breaker is open.
    BreakerOpen = R_BREAKER_OPEN as isize,
}

// A snapshot's layout: per zone its statuses and units, then each Redis backend's cells, then
// the worker-summed ones, then each zone's slot events. In the shared zone each zone's cells,
// each backend's and the workers' are separate blocks ([`store`]).
const Z_UNITS: usize = STATUSES.len();
const Z_LEASE: usize = Z_UNITS + 1;
pub const ZONE_CELLS: usize = Z_LEASE + LEASE_EVENTS.len();

/// What happens to reserved units (`lease=`), counted per zone: what Redis reserved, and what
/// went back unspent. Requests admitted from reservations are the decisions counted as
/// `PASSED_LEASE`; what was neither spent nor given back lapsed (revoked by a reset, a
/// give-back that failed, a worker killed). Two cells only: a zone's block stays in nginx's
/// 128-byte slab class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEvent {
    Reserved,
    Returned,
}

pub const LEASE_EVENTS: [(LeaseEvent, &str); 2] =
    [(LeaseEvent::Reserved, "reserved"), (LeaseEvent::Returned, "returned")];

/// What happens to concurrency slots (`algorithm=concurrency`), counted per zone. Slots in
/// flight are not among them: what Redis holds is what `ratelimit_admin` reads, whereas
/// taken − released − lapsed also counts the slots of a worker that died. Only concurrency zones
/// count them, in a block of their own in the shared zone (named `<zone>/slots`, which no zone
/// name can be): the other zones' blocks keep to nginx's 128-byte slab class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotEvent {
    /// Granted to a request.
    Taken,
    /// Given back at its request's end (Redis answered).
    Released,
    /// Renewed while its request ran.
    Renewed,
    /// Found gone by a renewal: its life ran out first (Redis slow or away) or it was reset.
    Lapsed,
}

pub const SLOT_EVENTS: [(SlotEvent, &str); 4] = [
    (SlotEvent::Taken, "taken"),
    (SlotEvent::Released, "released"),
    (SlotEvent::Renewed, "renewed"),
    (SlotEvent::Lapsed, "lapsed"),
];
const R_BUCKETS: usize = 0;
const R_COUNT: usize = R_BUCKETS + BUCKETS_US.len();
const R_SUM_US: usize = R_COUNT + 1;
const R_IN_FLIGHT: usize = R_SUM_US + 1;
const R_CONNECTIONS: usize = R_IN_FLIGHT + 1;
const R_CONNECTS: usize = R_CONNECTIONS + 1;
const R_ERRORS: usize = R_CONNECTS + 1;
const R_REPLIES: usize = R_ERRORS + ERROR_KINDS.len();
const R_SCRIPT_LOADS: usize = R_REPLIES + REPLY_CLASSES.len();
const R_BREAKER_OPENINGS: usize = R_SCRIPT_LOADS + 1;
const R_BREAKER_OPEN: usize = R_BREAKER_OPENINGS + 1;
const R_REROUTED: usize = R_BREAKER_OPEN + 1;
const REDIS_CELLS: usize = R_REROUTED + 1;
const W_DENY_ENTRIES: usize = 0;
/// Requests waiting for their turn (`delay=`), those delayed, and their waits in ms.
const W_WAITING: usize = 1;
const W_DELAYED: usize = 2;
const W_DELAY_MS: usize = 3;
/// Settled units given back and charged, and settlements given up (`settle=`).
const W_SETTLE_RETURNED: usize = 4;
const W_SETTLE_CHARGED: usize = 5;
const W_SETTLE_LOST: usize = 6;
const WORKER_CELLS: usize = 7;

/// The cells of a snapshot of `zones` zones and `backends` Redis backends.
const fn cells(zones: usize, backends: usize) -> usize {
    zones * ZONE_CELLS + backends * REDIS_CELLS + WORKER_CELLS + zones * SLOT_EVENTS.len()
}

/// A handle on the shared cells, copied wherever outcomes happen. Disabled (null) when the
/// configuration has no metrics zone or the zone had no room. Zone and worker events count the
/// same in every copy; Redis events count to the backend the copy was made for
/// ([`Metrics::backend`]; the first one, 0, by default).
#[derive(Debug, Clone, Copy)]
pub struct Metrics {
    cells: *const Cells,
    backend: usize,
}

impl Metrics {
    pub const fn disabled() -> Self {
        Metrics { cells: ptr::null(), backend: 0 }
    }

    /// # Safety
    /// `cells` outlives the handle, and its blocks stay mapped meanwhile.
    pub unsafe fn new(cells: &Cells) -> Self {
        Metrics { cells, backend: 0 }
    }

    /// The same handle, counting Redis events to backend `b` (its index in the configuration,
    /// as `Cells::redis` has its blocks). A backend without a block (none: disabled) counts no
    /// Redis event, and its zones' events as any handle does.
    pub const fn backend(self, b: usize) -> Self {
        Metrics { cells: self.cells, backend: b }
    }

    pub fn enabled(&self) -> bool {
        !self.cells.is_null()
    }

    fn add(block: *const AtomicU64, i: usize, n: u64) {
        // SAFETY: `new`'s contract; every block has the cells its indexes below name.
        unsafe { (*block.add(i)).fetch_add(n, Relaxed) };
    }

    fn zone(&self, zone: usize, i: usize, n: u64) {
        // SAFETY: `new`'s contract.
        if let Some(c) = unsafe { self.cells.as_ref() } {
            Self::add(c.zones[zone], i, n);
        }
    }

    fn redis(&self, i: usize, n: u64) {
        // SAFETY: `new`'s contract.
        if let Some(c) = unsafe { self.cells.as_ref() } {
            if let Some(&block) = c.redis.get(self.backend) {
                Self::add(block, i, n);
            }
        }
    }

    /// A request's final status in each of its zones `(zone, cost)`, and the units it recorded.
    /// A delayed request is admitted, and is counted `PASSED` in its zones; its wait is counted
    /// by [`Metrics::delay`].
    pub fn request(&self, status: Status, zones: impl Iterator<Item = (usize, u64)>) {
        let status = if status == Status::Delayed { Status::Passed } else { status };
        let recorded = matches!(status, Status::Passed | Status::PassedLease | Status::PassedLocal);
        for (zone, cost) in zones {
            self.decision(zone, status, if recorded { cost } else { 0 });
        }
    }

    fn decision(&self, zone: usize, status: Status, units: u64) {
        if let Some(i) = STATUSES.iter().position(|&s| s == status) {
            self.zone(zone, i, 1);
        }
        if units > 0 {
            self.zone(zone, Z_UNITS, units);
        }
    }

    /// Reserved units of `zone` reserved, spent or returned.
    pub fn lease(&self, zone: usize, event: LeaseEvent, units: u64) {
        let i = LEASE_EVENTS.iter().position(|&(e, _)| e == event).unwrap_or(0);
        if units > 0 {
            self.zone(zone, Z_LEASE + i, units);
        }
    }

    /// Concurrency slots of `zone` taken, released, renewed or lapsed.
    pub fn slot(&self, zone: usize, event: SlotEvent) {
        let i = SLOT_EVENTS.iter().position(|&(e, _)| e == event).unwrap_or(0);
        // SAFETY: `new`'s contract.
        if let Some(c) = unsafe { self.cells.as_ref() } {
            if let Some(&block) = c.slots.get(zone).filter(|b| !b.is_null()) {
                Self::add(block, i, 1);
            }
        }
    }

    /// One script call's round trip, from its write to its reply.
    pub fn round_trip(&self, us: u64) {
        if let Some(i) = BUCKETS_US.iter().position(|&b| us <= b) {
            self.redis(R_BUCKETS + i, 1);
        }
        self.redis(R_COUNT, 1);
        self.redis(R_SUM_US, us);
    }

    /// A failed decision; `None` is no Redis failure (an open breaker did not ask).
    pub fn failure(&self, kind: Option<ErrorKind>) {
        if let Some(kind) = kind {
            let i = ERROR_KINDS.iter().position(|&(k, _)| k == kind).unwrap_or(0);
            self.redis(R_ERRORS + i, 1);
        }
    }

    /// An error reply to a whole call, by its class.
    pub fn error_reply(&self, msg: &[u8]) {
        let word = msg.split(|&b| b == b' ').next().unwrap_or_default();
        let last = REPLY_CLASSES.len() - 1;
        let i = REPLY_CLASSES[..last].iter().position(|c| c.as_bytes() == word).unwrap_or(last);
        self.redis(R_REPLIES + i, 1);
    }

    pub fn count(&self, c: Counter) {
        self.redis(c as usize, 1);
    }

    /// Gauges go up and down by wrapping adds; read back as signed.
    pub fn gauge(&self, g: Gauge, delta: i64) {
        self.redis(g as usize, delta as u64);
    }

    fn worker(&self, i: usize, n: u64) {
        // SAFETY: `new`'s contract.
        if let Some(c) = unsafe { self.cells.as_ref() } {
            Self::add(c.worker, i, n);
        }
    }

    pub fn deny_cache_entries(&self, delta: i64) {
        // Most requests change nothing: no add of 0 into the shared zone, whose line every
        // worker writes.
        if delta != 0 {
            self.worker(W_DENY_ENTRIES, delta as u64);
        }
    }

    /// A request starts waiting `ms` for its turn.
    pub fn delay(&self, ms: u64) {
        self.worker(W_DELAYED, 1);
        self.worker(W_DELAY_MS, ms);
        self.worker(W_WAITING, 1);
    }

    /// A settlement Redis applied: `units` given back or charged past the limit.
    pub fn settled(&self, charged: bool, units: u64) {
        self.worker(if charged { W_SETTLE_CHARGED } else { W_SETTLE_RETURNED }, units);
    }

    /// A settlement given up: Redis could not take it within its time, or the queue was full.
    pub fn settlement_lost(&self) {
        self.worker(W_SETTLE_LOST, 1);
    }

    /// A request stops waiting: its turn came, or its client went away.
    pub fn waited(&self) {
        self.worker(W_WAITING, (-1i64) as u64);
    }

    /// Every cell, in the layout [`View`] reads, one by one: counters of different cells may
    /// be a few updates apart. `None` when disabled: nothing is counted, so nothing is shown
    /// (zeros would read as "no traffic").
    pub fn snapshot(&self) -> Option<Vec<u64>> {
        // SAFETY: `new`'s contract.
        let c = unsafe { self.cells.as_ref() }?;
        let read = |block: *const AtomicU64, n: usize| {
            // SAFETY: `new`'s contract.
            (0..n).map(move |i| unsafe { (*block.add(i)).load(Relaxed) })
        };
        let mut out = Vec::with_capacity(cells(c.zones.len(), c.redis.len()));
        for &z in &c.zones {
            out.extend(read(z, ZONE_CELLS));
        }
        for &b in &c.redis {
            out.extend(read(b, REDIS_CELLS));
        }
        out.extend(read(c.worker, WORKER_CELLS));
        // Slot events last, per zone (zeros for the zones without a block).
        for z in 0..c.zones.len() {
            match c.slots.get(z).copied().filter(|b| !b.is_null()) {
                Some(block) => out.extend(read(block, SLOT_EVENTS.len())),
                None => out.extend(core::iter::repeat_n(0, SLOT_EVENTS.len())),
            }
        }
        Some(out)
    }
}

/// Reads a snapshot by meaning, for the formats: `zones` zones and `backends` Redis backends,
/// in the order [`store::Cells`] has their blocks.
pub struct View<'a> {
    pub cells: &'a [u64],
    pub zones: usize,
    pub backends: usize,
}

impl View<'_> {
    pub fn status(&self, zone: usize, i: usize) -> u64 {
        self.cells[zone * ZONE_CELLS + i]
    }
    pub fn units(&self, zone: usize) -> u64 {
        self.cells[zone * ZONE_CELLS + Z_UNITS]
    }
    /// Units of `LEASE_EVENTS[i]`.
    pub fn lease(&self, zone: usize, i: usize) -> u64 {
        self.cells[zone * ZONE_CELLS + Z_LEASE + i]
    }
    /// Slots of `SLOT_EVENTS[i]`.
    pub fn slot(&self, zone: usize, i: usize) -> u64 {
        let at = self.zones * ZONE_CELLS + self.backends * REDIS_CELLS + WORKER_CELLS;
        self.cells[at + zone * SLOT_EVENTS.len() + i]
    }
    /// The cells of Redis backend `b`.
    pub fn server(&self, b: usize) -> Server<'_> {
        let at = self.zones * ZONE_CELLS + b * REDIS_CELLS;
        Server { cells: &self.cells[at..at + REDIS_CELLS] }
    }
    fn worker(&self, i: usize) -> u64 {
        self.cells[self.zones * ZONE_CELLS + self.backends * REDIS_CELLS + i]
    }
    pub fn deny_cache_entries(&self) -> u64 {
        (self.worker(W_DENY_ENTRIES) as i64).max(0) as u64
    }
    pub fn waiting(&self) -> u64 {
        (self.worker(W_WAITING) as i64).max(0) as u64
    }
    /// Settled units given back, charged, and settlements lost.
    pub fn settlements(&self) -> (u64, u64, u64) {
        let w = |i| self.worker(i);
        (w(W_SETTLE_RETURNED), w(W_SETTLE_CHARGED), w(W_SETTLE_LOST))
    }
    /// Requests delayed, and their waits in ms.
    pub fn delayed(&self) -> (u64, u64) {
        (self.worker(W_DELAYED), self.worker(W_DELAY_MS))
    }
}

/// One Redis backend's cells in a snapshot ([`View::server`]).
pub struct Server<'a> {
    cells: &'a [u64],
}

impl Server<'_> {
    /// Cumulative, as Prometheus wants them.
    pub fn buckets(&self) -> impl Iterator<Item = u64> + '_ {
        (0..BUCKETS_US.len()).scan(0, |sum, i| {
            *sum += self.cells[R_BUCKETS + i];
            Some(*sum)
        })
    }
    pub fn round_trips(&self) -> u64 {
        self.cells[R_COUNT]
    }
    pub fn round_trip_sum_us(&self) -> u64 {
        self.cells[R_SUM_US]
    }
    pub fn counter(&self, c: Counter) -> u64 {
        self.cells[c as usize]
    }
    /// Never below 0, even while one worker's decrement is seen before another's increment.
    pub fn gauge(&self, g: Gauge) -> u64 {
        (self.cells[g as usize] as i64).max(0) as u64
    }
    pub fn errors(&self, i: usize) -> u64 {
        self.cells[R_ERRORS + i]
    }
    pub fn replies(&self, i: usize) -> u64 {
        self.cells[R_REPLIES + i]
    }
}

/// Cells on the heap, laid out as the shared zone's blocks, for one Redis backend.
#[cfg(test)]
pub(crate) fn test_metrics(zones: usize) -> Metrics {
    test_backends(zones, 1)
}

/// Cells on the heap for `zones` zones and `backends` Redis backends.
#[cfg(test)]
pub(crate) fn test_backends(zones: usize, backends: usize) -> Metrics {
    let block = |n: usize| -> *const AtomicU64 {
        Box::leak((0..n).map(|_| AtomicU64::new(0)).collect::<Box<[_]>>()).as_ptr()
    };
    let cells = Box::leak(Box::new(Cells {
        zones: (0..zones).map(|_| block(ZONE_CELLS)).collect(),
        redis: (0..backends).map(|_| block(REDIS_CELLS)).collect(),
        worker: block(WORKER_CELLS),
        // Every zone of a test counts slot events.
        slots: (0..zones).map(|_| block(ZONE_CELLS)).collect(),
    }));
    // SAFETY: leaked, so alive for the rest of the test.
    unsafe { Metrics::new(cells) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_and_units_per_zone() {
        let m = test_metrics(2);
        m.decision(1, Status::Passed, 3);
        m.decision(1, Status::Passed, 1);
        m.decision(0, Status::RejectedDryRun, 0);
        m.decision(0, Status::Skipped, 0);
        let cells = m.snapshot().unwrap();
        let v = View { cells: &cells, zones: 2, backends: 1 };
        assert_eq!(v.status(1, 0), 2);
        assert_eq!(v.units(1), 4);
        assert_eq!(v.status(0, 4), 1);
        assert_eq!(v.units(0), 0);
        m.lease(1, LeaseEvent::Returned, 5);
        let cells = m.snapshot().unwrap();
        let v = View { cells: &cells, zones: 2, backends: 1 };
        assert_eq!((v.lease(1, 0), v.lease(1, 1)), (0, 5));
        assert_eq!(cells.iter().sum::<u64>(), 2 + 4 + 1 + 5);
        m.slot(0, SlotEvent::Renewed);
        m.slot(0, SlotEvent::Renewed);
        m.slot(1, SlotEvent::Lapsed);
        let cells = m.snapshot().unwrap();
        let v = View { cells: &cells, zones: 2, backends: 1 };
        assert_eq!((0..4).map(|i| v.slot(0, i)).collect::<Vec<_>>(), [0, 0, 2, 0]);
        assert_eq!(v.slot(1, 3), 1);
        assert_eq!(v.lease(1, 1), 5, "slot events have cells of their own");
        assert_eq!(cells.iter().sum::<u64>(), 2 + 4 + 1 + 5 + 3);
    }

    #[test]
    fn histogram_gauges_and_errors() {
        let m = test_metrics(1);
        for us in [50, 100, 101, 2_000_000] {
            m.round_trip(us);
        }
        m.gauge(Gauge::InFlight, 3);
        m.gauge(Gauge::InFlight, -2);
        m.gauge(Gauge::Connections, -1);
        m.failure(Some(ErrorKind::Timeout));
        m.failure(None);
        m.error_reply(b"LOADING Redis is loading");
        m.error_reply(b"WEIRD thing");
        m.count(Counter::ScriptLoads);
        m.deny_cache_entries(5);
        let cells = m.snapshot().unwrap();
        let v = View { cells: &cells, zones: 1, backends: 1 };
        let s = v.server(0);
        let b: Vec<u64> = s.buckets().collect();
        assert_eq!(&b[..3], &[2, 3, 3]);
        assert_eq!(b[12], 3, "2 s is only in +Inf");
        assert_eq!((s.round_trips(), s.round_trip_sum_us()), (4, 2_000_251));
        assert_eq!((s.gauge(Gauge::InFlight), s.gauge(Gauge::Connections)), (1, 0));
        assert_eq!(s.errors(1), 1);
        assert_eq!((0..ERROR_KINDS.len()).map(|i| s.errors(i)).sum::<u64>(), 1);
        assert_eq!((s.replies(1), s.replies(12)), (1, 1));
        assert_eq!(s.counter(Counter::ScriptLoads), 1);
        assert_eq!(v.deny_cache_entries(), 5);
    }

    /// Issue 34: each backend's handle counts Redis events to its own block; zone and worker
    /// events count the same through any handle, and the snapshot reads them where they were.
    #[test]
    fn two_backends_count_apart() {
        let m = test_backends(2, 2);
        let (a, b) = (m.backend(0), m.backend(1));
        a.round_trip(150);
        b.round_trip(2_000);
        b.round_trip(2_500);
        b.gauge(Gauge::Connections, 2);
        a.gauge(Gauge::Connections, 1);
        b.failure(Some(ErrorKind::Timeout));
        b.count(Counter::BreakerOpenings);
        b.gauge(Gauge::BreakerOpen, 1);
        a.error_reply(b"NOSCRIPT No matching script");
        // Zone, slot and worker events: one set of cells whatever the handle.
        b.decision(0, Status::Passed, 1);
        a.decision(0, Status::Passed, 1);
        b.slot(1, SlotEvent::Taken);
        b.deny_cache_entries(3);
        b.delay(20);
        // A backend the configuration does not have counts no Redis event, and nothing else.
        m.backend(7).round_trip(10);
        m.backend(7).decision(1, Status::Rejected, 0);
        let cells = m.snapshot().unwrap();
        assert_eq!(cells.len(), super::cells(2, 2));
        let v = View { cells: &cells, zones: 2, backends: 2 };
        let (sa, sb) = (v.server(0), v.server(1));
        assert_eq!((sa.round_trips(), sa.round_trip_sum_us()), (1, 150));
        assert_eq!((sb.round_trips(), sb.round_trip_sum_us()), (2, 4_500));
        assert_eq!(sa.buckets().next(), Some(0));
        assert_eq!(sb.buckets().nth(3), Some(0), "neither under 1 ms");
        assert_eq!(sb.buckets().nth(4), Some(2), "both under 2.5 ms");
        assert_eq!((sa.gauge(Gauge::Connections), sb.gauge(Gauge::Connections)), (1, 2));
        assert_eq!((sa.errors(1), sb.errors(1)), (0, 1));
        assert_eq!((sa.replies(0), sb.replies(0)), (1, 0));
        assert_eq!(
            (sa.counter(Counter::BreakerOpenings), sb.counter(Counter::BreakerOpenings)),
            (0, 1)
        );
        assert_eq!((sa.gauge(Gauge::BreakerOpen), sb.gauge(Gauge::BreakerOpen)), (0, 1));
        assert_eq!((v.status(0, 0), v.units(0), v.status(1, 2)), (2, 2, 1));
        assert_eq!((v.slot(1, 0), v.slot(0, 0)), (1, 0));
        assert_eq!((v.deny_cache_entries(), v.waiting(), v.delayed()), (3, 1, (1, 20)));
        // Every event above in exactly one cell: nothing read twice or from another block.
        let redis = 1 + 1 + 150 + 2 + 2 + 4_500 + 2 + 1 + 1 + 1 + 1 + 1;
        let others = 2 + 2 + 1 + 1 + 3 + 1 + 1 + 20;
        assert_eq!(cells.iter().sum::<u64>(), redis + others);
        // The default handle is the first backend's.
        m.round_trip(100);
        let cells = m.snapshot().unwrap();
        let v = View { cells: &cells, zones: 2, backends: 2 };
        assert_eq!((v.server(0).round_trips(), v.server(1).round_trips()), (2, 2));
    }

    #[test]
    fn disabled_counts_and_shows_nothing() {
        let m = Metrics::disabled().backend(1);
        m.decision(0, Status::Passed, 1);
        m.round_trip(5);
        m.deny_cache_entries(1);
        assert_eq!(m.snapshot(), None);
    }
}

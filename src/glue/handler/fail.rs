//! When Redis cannot decide: the location's `ratelimit_fail` policy, the local fallback's
//! decision from this worker's memory (`ratelimit_fail local`), and the failure's log line, at
//! most once a second per kind.

use core::ops::Range;
use core::ptr;

use ngx::ffi::{ngx_current_msec, NGX_LOG_ERR};
use ngx::ngx_log_error;

use crate::decide::lease::Grant;
use crate::decide::local_limit::{LocalLimiter, LocalPart, LocalZone};
use crate::decide::log_throttle::LogThrottle;
use crate::decide::script::{Decision, ReplyError, ZoneVerdict};
use crate::decide::slots::Slots;
use crate::decide::status::Status;
use crate::glue::conf::{worker_processes, FailPolicy, LocConf, MainConf};
use crate::redis::pool::RedisError;

use super::{record, Ctx, ZoneReq};

/// Applies the fail policy; the reason is logged at most once a second per worker.
pub(super) unsafe fn fail(ctx: &mut Ctx, lcf: &LocConf, mcf: &MainConf, failure: Failure) {
    let n = ctx.zones.len();
    let (status, d, no_room) = policy(ctx, lcf, mcf, 0..n, &failure);
    if matches!(status, Status::PassedLocal | Status::RejectedLocal) {
        record(ctx, &d);
    }
    mcf.spare.borrow_mut().keep_verdicts(d.zones);
    ctx.status = status;
    // One backend decides the whole location (its first zone's): its line names no backend.
    let backend = ctx.zones.first().map_or(0, |z| mcf.zones[z.zone].backend);
    log_failure(ctx, status, no_room, &failure, backend, "");
}

/// With several backends, what the policy makes of the zones `range` of `backend`, which could
/// not decide, beside the others' decisions: their verdicts, and the status they stand for.
pub(super) unsafe fn stand_in(
    ctx: &mut Ctx,
    lcf: &LocConf,
    mcf: &MainConf,
    range: Range<usize>,
    backend: usize,
    failure: Failure,
) -> (Status, Decision) {
    let (status, d, no_room) = policy(ctx, lcf, mcf, range, &failure);
    let name = mcf.redis(backend).map_or("", |r| r.backend.as_str());
    log_failure(ctx, status, no_room, &failure, backend, name);
    (status, d)
}

/// The location's `ratelimit_fail` for the zones `range`: its status and its verdicts (an
/// open zone never the one that describes the decision), and whether a local decision had no
/// room for a new key.
unsafe fn policy(
    ctx: &mut Ctx,
    lcf: &LocConf,
    mcf: &MainConf,
    range: Range<usize>,
    failure: &Failure,
) -> (Status, Decision, bool) {
    let stand = |ok: bool| {
        let remaining = if ok { u64::MAX } else { 0 };
        let v = ZoneVerdict { ok, remaining, reset_ms: 0, grant: Grant::default() };
        let mut zones = mcf.spare.borrow_mut().verdicts();
        zones.resize(range.len(), v);
        Decision { allowed: ok, wait_ms: 0, zones }
    };
    match lcf.fail() {
        FailPolicy::Open => (Status::FailedOpen, stand(true), false),
        FailPolicy::Closed => (Status::FailedClosed, stand(false), false),
        // A bad limit or cost leaves nothing to enforce locally: closed, never unlimited.
        FailPolicy::Local if matches!(failure, Failure::BadValue(..)) => {
            (Status::FailedClosed, stand(false), false)
        }
        // A key that cannot be counted is refused: admitting it would leave it unlimited.
        FailPolicy::Local => match decide_locally(ctx, lcf, mcf, range.clone()) {
            Some((status, d)) => (status, d, false),
            None => (Status::FailedClosed, stand(false), true),
        },
    }
}

/// The failure's log line, at most once a second per backend (`backend`, named `name` when it
/// has a name): bad variable values (per figure and zone) and a full local table have their own
/// throttles: an outage must not hide them, nor they it, nor one bad figure another.
unsafe fn log_failure(
    ctx: &Ctx,
    status: Status,
    no_room: bool,
    failure: &Failure,
    backend: usize,
    name: &str,
) {
    let now = ngx_current_msec as u64;
    let logged = match *failure {
        Failure::BadValue(what, zone, ..) => {
            (*ptr::addr_of_mut!(BAD_VALUE_LOG)).allow((what, zone), now)
        }
        _ if no_room => (*ptr::addr_of_mut!(NO_ROOM_LOG)).allow((), now),
        _ => (*ptr::addr_of_mut!(FAILURE_LOG)).allow(backend, now),
    };
    if !logged {
        return;
    }
    let outcome = match status {
        _ if no_room => {
            "rejected by ratelimit_fail local: no room for a new key in \
             ratelimit_fail_local_size"
        }
        Status::FailedOpen => "passed by ratelimit_fail",
        Status::FailedClosed => "rejected by ratelimit_fail",
        _ => "decided by this worker alone by ratelimit_fail",
    };
    let log = (*(*ctx.r).connection).log;
    if name.is_empty() {
        ngx_log_error!(NGX_LOG_ERR, log, "ratelimit: {failure}, request {outcome}");
    } else {
        ngx_log_error!(
            NGX_LOG_ERR,
            log,
            "ratelimit: backend \"{name}\": {failure}, its zones {outcome}"
        );
    }
}

/// `ratelimit_fail local`: this worker's share of each zone, from its own memory: a rate zone's
/// from the local limiter's counters, a concurrency zone's from this worker's requests in flight
/// (a request rejected by one holds nothing and is charged nothing in the others, as with Redis).
/// The share becomes the zones' limit for this request, so headers and variables report what
/// was enforced. `None` when a key is new and the table is full of counters that still count.
unsafe fn decide_locally(
    ctx: &mut Ctx,
    lcf: &LocConf,
    mcf: &MainConf,
    range: Range<usize>,
) -> Option<(Status, Decision)> {
    let share = lcf.fail_local_share().unwrap_or_else(|| worker_processes());
    for z in ctx.zones[range.clone()].iter_mut() {
        z.limit = (z.limit / share).max(1);
    }
    let zones = &mut ctx.zones[range];
    let conc = |z: &ZoneReq| mcf.zones[z.zone].concurrency();
    let mut slots = mcf.slots.borrow_mut();
    let slots = slots.get_or_insert_with(Slots::new);
    let mut local = mcf.local.borrow_mut();
    let local = local.get_or_insert_with(|| LocalLimiter::with_memory(mcf.local_size()));
    let parts = zones.iter().map(|z| match conc(z) {
        true => LocalPart::Concurrency {
            in_flight: slots.local_in_flight(z.table_key.hash),
            limit: z.limit,
        },
        false => LocalPart::Rate(LocalZone {
            hash: z.table_key.hash,
            limit: z.limit,
            window_ms: z.window_ms,
            cost: z.cost,
        }),
    });
    let mut verdicts = mcf.spare.borrow_mut().verdicts();
    let Some(allowed) = local.decide(parts, ngx_current_msec as u64, &mut verdicts) else {
        mcf.spare.borrow_mut().keep_verdicts(verdicts);
        return None;
    };
    if allowed {
        for z in zones.iter_mut().filter(|z| conc(z)) {
            slots.local_take(z.table_key.hash);
            z.held_locally = true;
        }
    }
    let status = if allowed { Status::PassedLocal } else { Status::RejectedLocal };
    Some((status, Decision { allowed, wait_ms: 0, zones: verdicts }))
}

/// Why a decision failed; formatted only when it is logged, not once per request of an outage.
pub(super) enum Failure {
    Redis(RedisError),
    Reply(ReplyError),
    /// A limit, window or cost variable whose value is not a valid number: (what, zone index,
    /// zone name, value).
    BadValue(&'static str, usize, String, String),
    /// One of these keys holds data that is not ours.
    WrongType(String),
    /// The keys of these zones are in different Cluster slots.
    CrossSlot(String),
}

impl core::fmt::Display for Failure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Failure::Redis(e) => write!(f, "redis {e}"),
            Failure::Reply(ReplyError::NoScript) => f.write_str("redis replied NOSCRIPT twice"),
            Failure::Reply(ReplyError::Redis(msg)) => write!(f, "redis replied \"{msg}\""),
            Failure::Reply(ReplyError::Unexpected) => {
                f.write_str("unexpected reply from the script")
            }
            Failure::WrongType(keys) => {
                write!(f, "redis replied WRONGTYPE: one of the keys {keys} holds other data")
            }
            Failure::CrossSlot(zones) => write!(
                f,
                "the keys of zones {zones} are in different redis cluster slots; give them a \
                 common hash tag"
            ),
            Failure::BadValue(what, _, zone, value) => {
                write!(f, "invalid {what} \"{}\" for zone \"{zone}\"", value.escape_debug())
            }
        }
    }
}

/// Failure lines at most once a second per worker and backend (per figure and zone for bad
/// values).
static mut FAILURE_LOG: LogThrottle<usize> = LogThrottle::new();
static mut BAD_VALUE_LOG: LogThrottle<(&'static str, usize)> = LogThrottle::new();
static mut NO_ROOM_LOG: LogThrottle<()> = LogThrottle::new();

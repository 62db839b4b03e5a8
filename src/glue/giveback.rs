//! Returning reservations' unspent units to Redis (`lease=`), without a request: a per-worker
//! timer gives back what expired, and on graceful shutdown or reload everything still held.
//! The same path releases concurrency slots when their requests end, and the same timer renews
//! the slots of requests still running (`crate::decide::slots`), all of them due in one tick together,
//! so that the pool writes them as one script call.
//!
//! Best effort: the guarantee never depends on it (units not given back lapse in Redis at the
//! end of their reservation), only under-admission does. While any reservation is held the
//! timer is not cancelable, so a worker told to quit waits for its next tick, which gives
//! everything back; each give-back's own deadline then keeps the worker until Redis answered or
//! `timeout` passed.

use core::ffi::c_void;
use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_add_timer, ngx_current_msec, ngx_cycle, ngx_del_timer, ngx_delete_posted_event,
    ngx_event_t, ngx_exiting, NGX_LOG_ERR,
};
use ngx::ngx_log_error;

use crate::codec::resp::Head;
use crate::decide::lease::{Check, GiveBack};
use crate::decide::log_throttle::LogThrottle;
use crate::decide::quota::Period;
use crate::decide::script::{self, EncodedArgs, SlotOp, SlotRef};
use crate::decide::settle::{self, Pending, Queue};
use crate::decide::slots::{Release, Renewal, Slots};
use crate::glue::conf::MainConf;
use crate::metrics::{LeaseEvent, SlotEvent};
use crate::redis::follow::{follow, submit, Follow, Retries};
use crate::redis::pool::{Frame, Waiter, WorkerPool};

/// How often expired reservations are looked for: a reservation's units go back at most this
/// long after its end.
const SWEEP_MS: u64 = 100;

/// The worker's sweep timer, for the configuration it serves.
struct Sweep {
    ev: ngx_event_t,
    mcf: *const MainConf,
}

static mut SWEEP: Option<Sweep> = None;

/// Starts the sweep timer if it is not running: a reservation was just granted, a key's
/// demand is being counted, or a slot was taken.
pub fn arm(mcf: &MainConf) {
    // SAFETY: a worker is one thread; the event is this module's own and `SWEEP` lives as long
    // as the process. The configuration outlives the worker's use of it.
    unsafe {
        let sweep = &mut *ptr::addr_of_mut!(SWEEP);
        let s = sweep.get_or_insert_with(|| Sweep { ev: core::mem::zeroed(), mcf });
        s.mcf = mcf;
        if s.ev.timer_set() == 0 {
            s.ev.handler = Some(on_sweep);
            s.ev.log = (*ngx_cycle).log;
            s.ev.data = ptr::null_mut();
            // Not cancelable: a graceful exit waits for the tick that gives everything back.
            s.ev.set_cancelable(0);
            ngx_add_timer(&mut s.ev, SWEEP_MS as _);
        }
    }
}

unsafe extern "C" fn on_sweep(_ev: *mut ngx_event_t) {
    let Some(s) = (*ptr::addr_of_mut!(SWEEP)).as_mut() else { return };
    let mcf = &*s.mcf;
    let now = ngx_current_msec as u64;
    with_kept(&SWEPT, |back| {
        if let Some(leases) = mcf.leases.borrow_mut().as_mut() {
            if ngx_exiting != 0 {
                back.extend(leases.drain());
            } else {
                // Reservations whose key's tracking was lost are checked once it can be had again.
                leases.verify_unverified(now, |zone, key| track(mcf, zone, &[key]));
                // The longest: a check on its way is given up only once no backend can still
                // answer.
                let timeout =
                    mcf.backends.iter().map(|b| b.redis.timeout as u64).max().unwrap_or(0);
                leases.sweep(now, timeout, back);
            }
        }
        send(mcf, back.drain(..));
    });
    renew(mcf, now);
    resettle(mcf, now);
    if ngx_exiting != 0 {
        // The orphans' releases just sent are their last: a worker on its way out waits for
        // its requests, not for decisions that may never run (their slots would lapse).
        if let Some(slots) = mcf.slots.borrow_mut().as_mut() {
            slots.forget_orphans();
        }
    }
    let held = mcf.leases.borrow().as_ref().is_some_and(|l| !l.is_empty());
    // Slots are renewed while their requests run, through a graceful shutdown or a reload too:
    // those requests keep the worker anyway.
    let slots = mcf.slots.borrow().as_ref().is_some_and(|s| s.renewing_any());
    // Settlements are tried again through a reload or a graceful shutdown too, for their time.
    let settling = mcf.settlements.borrow().as_ref().is_some_and(|q| !q.is_empty());
    if (held && ngx_exiting == 0) || slots || settling {
        ngx_add_timer(&mut s.ev, SWEEP_MS as _);
    }
}

/// Sends a renewal for every slot due and a release for every orphan: decisions of their own,
/// queued in this one tick, so that the pool writes them together.
fn renew(mcf: &MainConf, now: u64) {
    // Listed first: sending borrows the table again.
    with_kept(&DUE, |due| {
        if let Some(slots) = mcf.slots.borrow_mut().as_mut() {
            let metrics = mcf.metrics.get();
            slots.due(now, |id, zone| due.push((SlotOp::Renew, id, zone)));
            let lapsed = |zone| metrics.slot(zone, SlotEvent::Lapsed);
            slots.orphans_due(now, lapsed, |id, zone| due.push((SlotOp::Release, id, zone)));
        }
        for &(op, id, zone) in due.iter() {
            submit_slot_op(mcf, op, id, zone);
        }
    });
}

/// Runs `f` with a tick's list, taken out of `kept` (sending borrows the tables again) and
/// put back emptied for the next tick, unless it grew past `DUE_KEPT`.
fn with_kept<T>(
    kept: &'static std::thread::LocalKey<core::cell::RefCell<Vec<T>>>,
    f: impl FnOnce(&mut Vec<T>),
) {
    let mut list = kept.with(|k| core::mem::take(&mut *k.borrow_mut()));
    f(&mut list);
    if list.capacity() <= DUE_KEPT {
        list.clear();
        kept.with(|k| *k.borrow_mut() = list);
    }
}

/// Sends the renewal (`SlotOp::Renew`) of held slot `id` or the release of orphan `id`, its
/// arguments written in a finished give-back's room; one not even queued (Redis known down) is
/// tried again at the next tick.
fn submit_slot_op(mcf: &MainConf, op: SlotOp, id: u64, zone: usize) {
    let what = match op {
        SlotOp::Renew => What::Renew { zone, id },
        SlotOp::Release => What::Orphan { id },
    };
    let args = |room, _: &What| {
        let slots = mcf.slots.borrow();
        let slots = slots.as_ref()?;
        let held = if op == SlotOp::Renew { slots.get(id) } else { slots.orphan_slot(id) }?;
        Some(EncodedArgs::slot_op(room, op, &held.slot_ref()))
    };
    if let Err(what) = submit_one(mcf, what, zone, args) {
        answered(mcf, &what, &[], None);
    }
}

/// Notes the members of a decision Redis may run after its request stopped waiting for it,
/// for the sweep to release: `slots` as the decision named them.
pub fn orphan<'a>(mcf: &MainConf, slots: impl Iterator<Item = (usize, SlotRef<'a>)>, now: u64) {
    let mut any = false;
    {
        let mut table = mcf.slots.borrow_mut();
        let table = table.get_or_insert_with(Slots::new);
        for (zone, slot) in slots {
            any |= table.orphan(zone, slot, now);
        }
    }
    if any {
        arm(mcf);
    }
}

/// Releases the slot `id` of a request that ended, at once; the reply is waited for by no one.
/// A release that fails is sent again by the sweep until Redis answers, for one slot life at
/// most (by then the slot has lapsed in Redis).
pub fn release(mcf: &MainConf, id: u64) {
    let sent = {
        let mut slots = mcf.slots.borrow_mut();
        let Some(slots) = slots.as_mut() else { return };
        // SAFETY: the worker's cached clock, read on its only thread.
        let Some(orphan) = slots.release(id, unsafe { ngx_current_msec } as u64) else { return };
        slots.orphan_slot(orphan).map(|h| (orphan, h.zone))
    };
    let Some((orphan, zone)) = sent else { return };
    submit_slot_op(mcf, SlotOp::Release, orphan, zone);
    arm(mcf);
}

std::thread_local! {
    /// Give-backs on their way, for `exit`: a worker stopped at once (`nginx -s stop`) does not
    /// wait for their replies. A worker is one thread.
    /// A set: a tick of thousands of orphans' releases finishes each one at its reply.
    static IN_FLIGHT: core::cell::RefCell<std::collections::HashSet<NonNull<Returning>>> =
        core::cell::RefCell::new(std::collections::HashSet::new());
    /// Give-backs that finished, kept to be written over by the next ones: a lease's renewal
    /// sends a check, settlements and slots come and go with their requests. Boxes, not the
    /// values: the box is the allocation kept (a give-back's address is its event's data).
    #[allow(clippy::vec_box)]
    static SPARE: core::cell::RefCell<Vec<Box<Returning>>> = const {
        core::cell::RefCell::new(Vec::new())
    };
    /// A tick's renewals and releases, the list kept for the next tick: a sweep that renews
    /// slots allocates nothing once it has grown.
    static DUE: core::cell::RefCell<Vec<(SlotOp, u64, usize)>> = const {
        core::cell::RefCell::new(Vec::new())
    };
    /// The reservations a tick gives back, kept as `DUE` is.
    static SWEPT: core::cell::RefCell<Vec<GiveBack>> = const {
        core::cell::RefCell::new(Vec::new())
    };
}

/// A tick's list kept for the next holds at most this many: a burst of slots or of expired
/// reservations leaves no large list behind.
const DUE_KEPT: usize = 1024;

/// Finished give-backs kept for the next, at most.
const SPARES_KEPT: usize = 64;

/// At worker exit, after the pool has closed its connections: frees the give-backs still on
/// their way (their events are never run again).
pub fn exit() {
    for r in IN_FLIGHT.with(|f| core::mem::take(&mut *f.borrow_mut())) {
        // SAFETY: registered by `send`, not freed yet (`finish` unregisters), and nothing runs
        // its event any more.
        drop(unsafe { Box::from_raw(r.as_ptr()) });
    }
}

/// Sends each settlement (`settle=`) as a decision of its own; one Redis cannot take is kept
/// and sent again by the sweep until its time is up.
pub fn settle(mcf: &MainConf, settlements: impl IntoIterator<Item = Pending>) {
    for p in settlements {
        let zone = p.place.zone;
        // Read where the settlement lies once sent, kept for a retry: its key is not copied.
        let args = |room, what: &What| {
            let What::Settle(p) = what else { return None };
            let (g, z) = (&p.place, &mcf.zones[zone]);
            let window_ms = z.period.map_or(g.window_ms, Period::encode);
            Some(match p.charge {
                true => EncodedArgs::charge(room, g, z.algorithm, window_ms, z.burst),
                false => EncodedArgs::give_back(room, g, z.algorithm, window_ms),
            })
        };
        if let Err(What::Settle(p)) = submit_one(mcf, What::Settle(p), zone, args) {
            keep_settlement(mcf, p);
        }
    }
}

/// A settlement Redis did not take: kept to send again (one given up to make room is lost).
fn keep_settlement(mcf: &MainConf, p: Pending) {
    let dropped = {
        let mut q = mcf.settlements.borrow_mut();
        q.get_or_insert_with(|| Queue::new(SETTLEMENTS_KEPT)).push(p)
    };
    if dropped.is_some() {
        mcf.metrics.get().settlement_lost();
    }
    arm(mcf);
}

/// Settlements kept per worker while Redis cannot take them: an outage under load loses the
/// oldest beyond this, rather than growing the worker.
const SETTLEMENTS_KEPT: usize = 100_000;

/// The sweep's turn for the settlements kept: sent again, or given up once their time is up.
fn resettle(mcf: &MainConf, now: u64) {
    let (again, lost) = match mcf.settlements.borrow_mut().as_mut() {
        Some(q) if !q.is_empty() => q.take(now),
        _ => return,
    };
    let metrics = mcf.metrics.get();
    lost.iter().for_each(|_| metrics.settlement_lost());
    settle(mcf, again);
}

/// What a decision sent without a request does.
enum What {
    /// Returns a reservation's unspent units.
    Units { zone: usize, units: u64 },
    /// Asks whether a reservation of its key (the decision's) is still of the key's life.
    Check(Check),
    /// Renews the slot `id` of this worker's table.
    Renew { zone: usize, id: u64 },
    /// Releases the orphan `id`: a slot a late decision may have granted.
    Orphan { id: u64 },
    /// Settles a request's placement: gives units back or charges more.
    Settle(Pending),
}

/// One give-back, release or renewal on its way.
struct Returning {
    what: What,
    waiter: Waiter,
    ev: ngx_event_t,
    args: EncodedArgs,
    retries: Retries,
    mcf: *const MainConf,
    /// Where it goes: its zone's backend.
    backend: usize,
}

/// Sends each give-back as a decision of its own; replies are not waited for by anyone.
pub fn send(mcf: &MainConf, back: impl IntoIterator<Item = GiveBack>) {
    for g in back {
        let zone = &mcf.zones[g.zone];
        // A calendar quota's window field is its period, as in its decisions.
        let window_ms = zone.period.map_or(g.window_ms, Period::encode);
        let args =
            |room, _: &What| Some(EncodedArgs::give_back(room, &g, zone.algorithm, window_ms));
        // Refused at once (Redis known down): the units lapse, as the guarantee allows.
        let _ = submit_one(mcf, What::Units { zone: g.zone, units: g.units }, g.zone, args);
    }
}

/// Sends the check of a reservation of `key` after Redis said the key changed; an answer that
/// cannot be had leaves the reservation unspent until it expires.
pub fn check(mcf: &MainConf, key: &[u8], c: Check) {
    let args = |room, _: &What| Some(EncodedArgs::check(room, key, c.rid));
    if let Err(what) = submit_one(mcf, What::Check(c), c.zone, args) {
        answered(mcf, &what, key, None);
    }
}

/// Whether the key of `zone` (its parts, or the whole key as one) is tracked on the zone's
/// backend from now on.
pub fn track(mcf: &MainConf, zone: usize, key: &[&[u8]]) -> bool {
    mcf.pool(mcf.zones[zone].backend).is_some_and(|p| p.track(key))
}

/// Queues one decision sent without a request, to `zone`'s backend, its arguments written by
/// `args` in the room it is handed, from `what` (where it lies from now on, kept for a retry)
/// or from what `args` holds; gives `what` back if the pool refused it at once, or if `args`
/// found nothing to send.
fn submit_one(
    mcf: &MainConf,
    what: What,
    zone: usize,
    args: impl FnOnce(Vec<u8>, &What) -> Option<EncodedArgs>,
) -> Result<(), What> {
    let backend = mcf.zones[zone].backend;
    let Some(redis) = mcf.redis(backend) else { return Err(what) };
    // A give-back that finished earlier: its box and its arguments' buffer written over.
    let mut spare = SPARE.with(|s| s.borrow_mut().pop());
    let room = spare.as_mut().map_or_else(Vec::new, |s| core::mem::take(&mut s.args).into_room());
    let Some(args) = args(room, &what) else {
        SPARE.with(|s| s.borrow_mut().extend(spare));
        return Err(what);
    };
    let returning = Returning {
        what,
        waiter: Waiter::new(ptr::null_mut()),
        // SAFETY: all-zero is an idle event.
        ev: unsafe { core::mem::zeroed() },
        args,
        retries: Retries::default(),
        mcf,
        backend,
    };
    let r = Box::into_raw(match spare {
        Some(mut b) => {
            *b = returning;
            b
        }
        None => Box::new(returning),
    });
    // SAFETY: `r` is this function's until handed to the event loop below; it is freed once, by
    // `finish`, after which neither the pool nor a timer holds it.
    unsafe {
        let ret = &mut *r;
        ret.waiter.ev = &mut ret.ev;
        ret.ev.handler = Some(on_reply);
        ret.ev.data = r as *mut c_void;
        ret.ev.log = (*ngx_cycle).log;
        if !submit(mcf.pool(backend), &mut ret.waiter, ret.args.call()) {
            return Err(Box::from_raw(r).what);
        }
        ngx_add_timer(&mut ret.ev, redis.timeout);
        IN_FLIGHT.with(|f| f.borrow_mut().insert(NonNull::new_unchecked(r)));
    }
    Ok(())
}

unsafe extern "C" fn on_reply(ev: *mut ngx_event_t) {
    let r = (*ev).data as *mut Returning;
    let ret = &mut *r;
    let mcf = &*ret.mcf;
    if (*ev).timedout() != 0 {
        if let Some(token) = ret.waiter.token.take() {
            WorkerPool::cancel(token);
        }
        answered(mcf, &ret.what, ret.args.call().first_key(), None);
        return finish(NonNull::new_unchecked(r));
    }
    if ret.waiter.result.is_none() {
        return;
    }
    // NOSCRIPT after a Redis restart, a Cluster redirection: sent again within the deadline.
    if let Follow::Resent =
        follow(|| mcf.pool(ret.backend), &mut ret.waiter, ret.args.call(), &mut ret.retries)
    {
        return;
    }
    answered(mcf, &ret.what, ret.args.call().first_key(), ret.waiter.result.as_ref());
    finish(NonNull::new_unchecked(r));
}

/// Counts what Redis answered (`None`: nothing in time) and tells the slot table of renewals;
/// `key` is the decision's (what a check asked about).
fn answered(
    mcf: &MainConf,
    what: &What,
    key: &[u8],
    result: Option<&Result<Frame, crate::redis::pool::RedisError>>,
) {
    let reply = match result {
        Some(Ok(frame)) => Some(frame.view()).filter(|r| matches!(r.head(), Some(Head::Array(_)))),
        _ => None,
    };
    // Each of these is a decision of one zone: whether it was allowed, and the zone's verdict.
    let verdict = reply.map(script::decode_one);
    let metrics = mcf.metrics.get();
    // SAFETY: the worker's cached clock, read on its only thread.
    let now = unsafe { ngx_current_msec } as u64;
    match *what {
        What::Units { zone, units } => {
            // A give-back answers 1 in its reset field when its reservation was of the key's
            // life; otherwise a reset took the units already.
            if matches!(verdict, Some(Ok((_, z))) if z.reset_ms == 1) {
                metrics.lease(zone, LeaseEvent::Returned, units);
            }
        }
        What::Check(check) => {
            let present = match verdict {
                Some(Ok((_, z))) => Some(z.remaining == 1),
                _ => None,
            };
            let mut leases = mcf.leases.borrow_mut();
            let Some(leases) = leases.as_mut() else { return };
            // A change heard while the check was on its way: checked again, starting with the
            // key's tracking; where that cannot be had, the reservation goes.
            if leases.checked(key, check, present, now) && !track(mcf, check.zone, &[key]) {
                leases.revoke(mcf.zones.len(), key);
            }
        }
        What::Renew { zone, id } => {
            let answer = match verdict {
                Some(Ok((true, _))) => Renewal::Kept,
                Some(Ok(_)) => Renewal::WrittenBack,
                // Redis failed or refused: the next tick tries again, before the slot lapses.
                _ => Renewal::Failed,
            };
            let found_gone = mcf
                .slots
                .borrow_mut()
                .as_mut()
                .is_some_and(|s| s.renewal_answered(id, answer, now));
            if answer != Renewal::Failed {
                metrics.slot(zone, SlotEvent::Renewed);
            }
            if found_gone {
                metrics.slot(zone, SlotEvent::Lapsed);
            }
        }
        What::Settle(ref p) => match verdict {
            // Done: its rid left the ledger now, or had left it already, taken by an earlier
            // attempt whose answer was lost (counted then) or by a reset of the key.
            Some(Ok((_, z))) => {
                if z.reset_ms == 1 || p.tried {
                    metrics.settled(p.charge, p.place.units);
                }
            }
            // Lost on the way or refused: the rid is still in the ledger if it did not run, and
            // leaves it when it does, so sending it again never applies it twice.
            _ => {
                let error = result.and_then(|r| r.as_ref().ok()).and_then(|f| f.view().error());
                if let Some(e) = error.filter(|e| settle::refused(e)) {
                    // Logged first: a scrape that sees the loss finds its line.
                    log_refused(mcf, p, e, now);
                    return metrics.settlement_lost();
                }
                // An error reply ran and wrote nothing; anything else may have been applied.
                let tried = p.tried || error.is_none();
                keep_settlement(mcf, Pending { tried, ..p.clone() });
            }
        },
        What::Orphan { id } => {
            let answer = match verdict {
                // A release answers 1 in its reset field when the member was there.
                Some(Ok((_, z))) if z.reset_ms == 1 => Release::Removed,
                Some(Ok(_)) => Release::NotThere,
                _ => Release::Failed,
            };
            let released =
                mcf.slots.borrow_mut().as_mut().and_then(|s| s.orphan_answered(id, answer, now));
            if let Some(zone) = released {
                metrics.slot(zone, SlotEvent::Released);
            }
        }
    }
}

/// At most one line a second per zone about settlements Redis refused.
static mut REFUSED_LOG: LogThrottle<usize> = LogThrottle::new();

/// A settlement given up because Redis refused it, and would again (`settle::refused`).
fn log_refused(mcf: &MainConf, p: &Pending, error: &[u8], now: u64) {
    let zone = p.place.zone;
    // SAFETY: the throttle is the worker's, used on its only thread.
    if !unsafe { (*ptr::addr_of_mut!(REFUSED_LOG)).allow(zone, now) } {
        return;
    }
    let (name, units, error) =
        (&mcf.zones[zone].name, p.place.units, String::from_utf8_lossy(error));
    let what = if p.charge { "charge" } else { "give-back" };
    // SAFETY: the cycle's log outlives the worker's sweep.
    unsafe {
        ngx_log_error!(
            NGX_LOG_ERR,
            (*ngx_cycle).log,
            "ratelimit: settlement of zone \"{name}\" ({what} of {units} units) given up: \
             redis replied \"{error}\""
        );
    }
}

/// Frees a give-back that nothing holds any more.
unsafe fn finish(r: NonNull<Returning>) {
    let ret = &mut *r.as_ptr();
    if ret.ev.timer_set() != 0 {
        ngx_del_timer(&mut ret.ev);
    }
    if ret.ev.posted() != 0 {
        ngx_delete_posted_event(&mut ret.ev);
    }
    IN_FLIGHT.with(|f| f.borrow_mut().remove(&r));
    let ret = Box::from_raw(r.as_ptr());
    // Not at the worker's exit, once the list is gone.
    let _ = SPARE.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARES_KEPT {
            s.push(ret);
        }
    });
}

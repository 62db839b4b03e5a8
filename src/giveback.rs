//! Returning reservations' unspent units to Redis (`lease=`), without a request: a per-worker
//! timer gives back what expired, and on graceful shutdown or reload everything still held.
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
    ngx_event_t, ngx_exiting,
};

use crate::conf::MainConf;
use crate::lease::GiveBack;
use crate::metrics::LeaseEvent;
use crate::quota::Period;
use crate::redis::follow::{follow, submit, Follow, Retries};
use crate::redis::pool::{Waiter, WorkerPool};
use crate::redis::resp::Reply;
use crate::script::EncodedArgs;

/// How often expired reservations are looked for: a reservation's units go back at most this
/// long after its end.
const SWEEP_MS: u64 = 100;

/// The worker's sweep timer, for the configuration it serves.
struct Sweep {
    ev: ngx_event_t,
    mcf: *const MainConf,
}

static mut SWEEP: Option<Sweep> = None;

/// Starts the sweep timer if it is not running: a reservation was just granted, or a key's
/// demand is being counted.
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
    let back = {
        let mut leases = mcf.leases.borrow_mut();
        let Some(leases) = leases.as_mut() else { return };
        if ngx_exiting != 0 {
            leases.drain()
        } else {
            leases.sweep(ngx_current_msec as u64)
        }
    };
    send(mcf, back);
    let held = mcf.leases.borrow().as_ref().is_some_and(|l| !l.is_empty());
    if held && ngx_exiting == 0 {
        ngx_add_timer(&mut s.ev, SWEEP_MS as _);
    }
}

std::thread_local! {
    /// Give-backs on their way, for `exit`: a worker stopped at once (`nginx -s stop`) does not
    /// wait for their replies. A worker is one thread.
    static IN_FLIGHT: core::cell::RefCell<Vec<NonNull<Returning>>> =
        const { core::cell::RefCell::new(Vec::new()) };
}

/// At worker exit, after the pool has closed its connections: frees the give-backs still on
/// their way (their events are never run again).
pub fn exit() {
    for r in IN_FLIGHT.with(|f| core::mem::take(&mut *f.borrow_mut())) {
        // SAFETY: registered by `send`, not freed yet (`finish` unregisters), and nothing runs
        // its event any more.
        drop(unsafe { Box::from_raw(r.as_ptr()) });
    }
}

/// One give-back on its way.
struct Returning {
    zone: usize,
    units: u64,
    waiter: Waiter,
    ev: ngx_event_t,
    args: EncodedArgs,
    retries: Retries,
    mcf: *const MainConf,
}

/// Sends each give-back as a decision of its own; replies are not waited for by anyone.
pub fn send(mcf: &MainConf, back: impl IntoIterator<Item = GiveBack>) {
    let Some(redis) = mcf.redis.as_ref() else { return };
    for mut g in back {
        let zone = &mcf.zones[g.zone];
        // A calendar quota's window field is its period, as in its decisions.
        g.window_ms = zone.period.map_or(g.window_ms, Period::encode);
        let algorithm = zone.algorithm;
        let r = Box::into_raw(Box::new(Returning {
            zone: g.zone,
            units: g.units,
            waiter: Waiter { result: None, token: None, ev: ptr::null_mut() },
            // SAFETY: all-zero is an idle event.
            ev: unsafe { core::mem::zeroed() },
            args: EncodedArgs::give_back(&g, algorithm),
            retries: Retries::default(),
            mcf,
        }));
        // SAFETY: `r` is this function's until handed to the event loop below; it is freed
        // once, by `finish`, after which neither the pool nor a timer holds it.
        unsafe {
            let ret = &mut *r;
            ret.waiter.ev = &mut ret.ev;
            ret.ev.handler = Some(on_reply);
            ret.ev.data = r as *mut c_void;
            ret.ev.log = (*ngx_cycle).log;
            if !submit(mcf, &mut ret.waiter, &ret.args) {
                drop(Box::from_raw(r));
                continue;
            }
            ngx_add_timer(&mut ret.ev, redis.timeout);
            IN_FLIGHT.with(|f| f.borrow_mut().push(NonNull::new_unchecked(r)));
        }
    }
}

unsafe extern "C" fn on_reply(ev: *mut ngx_event_t) {
    let r = (*ev).data as *mut Returning;
    let ret = &mut *r;
    let mcf = &*ret.mcf;
    if (*ev).timedout() != 0 {
        if let Some(token) = ret.waiter.token.take() {
            WorkerPool::cancel(token);
        }
        return finish(NonNull::new_unchecked(r));
    }
    if ret.waiter.result.is_none() {
        return;
    }
    // NOSCRIPT after a Redis restart, a Cluster redirection: sent again within the deadline.
    if let Follow::Resent = follow(mcf, &mut ret.waiter, &ret.args, &mut ret.retries) {
        return;
    }
    if let Some(Ok(Reply::Array(_))) = ret.waiter.result {
        mcf.metrics.get().lease(ret.zone, LeaseEvent::Returned, ret.units);
    }
    finish(NonNull::new_unchecked(r));
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
    IN_FLIGHT.with(|f| f.borrow_mut().retain(|&p| p != r));
    drop(Box::from_raw(r.as_ptr()));
}

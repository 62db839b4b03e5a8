//! A pending decision's events: each part's reply or deadline (with the pauses `TRYAGAIN` and
//! `CLUSTERDOWN` ask for, and the round trips of `NOSCRIPT` and Cluster redirections), the
//! decision once every backend has answered, and a delayed request's turn; then the phases run
//! again.

use ngx::ffi::ngx_current_msec;
use ngx::ffi::{
    ngx_add_timer, ngx_del_timer, ngx_delete_posted_event, ngx_event_t, ngx_http_block_reading,
    ngx_http_log_ctx_t, ngx_http_request_t, ngx_http_run_posted_requests, ngx_msec_int_t,
    ngx_msec_t, ngx_uint_t, NGX_LOG_DEBUG,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf};
use ngx::ngx_log_error;

use crate::decide::status::Status;
use crate::glue::conf::{LocConf, MainConf};
use crate::glue::module::RateLimit;
use crate::redis::conf::RedisConf;
use crate::redis::follow::{again, asks_again, follow, Follow};
use crate::redis::pool::{RedisError, WorkerPool};

use super::parts::Part;
use super::{decide, leave_waiting_count, Ctx};

/// Completion or deadline of a part of a pending decision, or the end of a delayed request's wait.
pub(super) unsafe extern "C" fn on_event(ev: *mut ngx_event_t) {
    let part = &mut *ngx::ngx_container_of!(ev, Part, ev);
    let ctx = &mut *part.ctx;
    let r = ctx.r;
    let (Some(lcf), Some(mcf)) = (RateLimit::location_conf(&*r), RateLimit::main_conf(&*r)) else {
        return;
    };
    if ctx.waiting {
        if (*ev).timedout() == 0 {
            return;
        }
        (*ev).set_timedout(0);
        ctx.waiting = false;
        leave_waiting_count(ctx, mcf);
        mcf.metrics.get().waited();
        return resume(r);
    }
    let Some(redis) = mcf.redis(part.backend) else { return };
    let b = part.backend;
    if (*ev).timedout() != 0 {
        (*ev).set_timedout(0);
        if core::mem::take(&mut part.retries.waiting) {
            // The pause before asking again is over.
            if let Follow::Resent =
                again(mcf.pool(b), &mut part.waiter, part.args.call(), &part.retries)
            {
                ngx_add_timer(ev, time_left(ctx, redis).max(1) as ngx_msec_t);
                return;
            }
        } else if part.waiter.result.is_none() || asks_again(&part.waiter.result) {
            // The deadline met no reply, or one that would need another round trip (the two
            // can arrive in one event-loop iteration): either way the time is up.
            if let Some(token) = part.waiter.token.take() {
                WorkerPool::timed_out(token);
            }
            part.waiter.result = Some(Err(RedisError::Timeout));
        }
    }
    if part.waiter.result.is_none() {
        return;
    }
    match follow(|| mcf.pool(b), &mut part.waiter, part.args.call(), &mut part.retries) {
        Follow::Resent => return,
        Follow::Later(pause) => {
            if time_left(ctx, redis) > pause as ngx_msec_int_t {
                part.retries.waiting = true;
                if part.ev.posted() != 0 {
                    ngx_delete_posted_event(&mut part.ev);
                }
                // nginx keeps an armed timer that is within 300 ms of the new one.
                ngx_del_timer(&mut part.ev);
                ngx_add_timer(&mut part.ev, pause);
                return;
            }
        }
        Follow::No => {}
    }
    // The reply and the deadline can arrive in the same event-loop iteration.
    if part.ev.timer_set() != 0 {
        ngx_del_timer(&mut part.ev);
    }
    if part.ev.posted() != 0 {
        ngx_delete_posted_event(&mut part.ev);
    }
    part.done = true;
    // Decided once every backend has answered: the slowest one's time.
    if ctx.part.as_ref().is_some_and(|p| !p.done) || ctx.more.iter().any(|p| !p.done) {
        return;
    }
    decide(ctx, lcf, mcf);
    if ctx.status == Status::Delayed {
        // Its turn is recorded in Redis: it waits for it without Redis, still noticing a client
        // that goes away (`ngx_http_test_reading`), as limit_req's delay does.
        ctx.waiting = true;
        mcf.metrics.get().delay(ctx.wait_ms);
        log_delay(ctx, lcf, mcf);
        if let Some(part) = ctx.part.as_mut() {
            ngx_add_timer(&mut part.ev, ctx.wait_ms as ngx_msec_t);
        }
        return;
    }
    leave_waiting_count(ctx, mcf);
    resume(r);
}

/// Runs the phases again, which hands the decision to nginx (`apply`).
pub(super) unsafe fn resume(r: *mut ngx_http_request_t) {
    let c = (*r).connection;
    let log_ctx = (*(*c).log).data as *mut ngx_http_log_ctx_t;
    (*log_ctx).current_request = r;
    (*r).read_event_handler = Some(ngx_http_block_reading);
    if let Some(run_phases) = (*r).write_event_handler {
        run_phases(r);
    }
    // `r` may be freed by now; only the connection is used.
    ngx_http_run_posted_requests(c);
}

/// As limit_req logs its delays: one level below its rejections.
unsafe fn log_delay(ctx: &Ctx, lcf: &LocConf, mcf: &MainConf) {
    let Some((i, ..)) = ctx.quota else { return };
    let z = &ctx.zones[i];
    let (name, wait, limit, window) = (&mcf.zones[z.zone].name, ctx.wait_ms, z.limit, z.window_ms);
    ngx_log_error!(
        (lcf.log_level() + 1).min(NGX_LOG_DEBUG as ngx_uint_t),
        (*(*ctx.r).connection).log,
        "ratelimit: delaying request by {wait}ms, zone \"{name}\", limit {limit} per {window}ms"
    );
}

/// What is left of the decision's `timeout`.
unsafe fn time_left(ctx: &Ctx, redis: &RedisConf) -> ngx_msec_int_t {
    let due = ctx.started.wrapping_add(redis.timeout);
    due.wrapping_sub(ngx_current_msec) as ngx_msec_int_t
}

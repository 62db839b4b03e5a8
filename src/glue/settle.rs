//! Settled costs (`ratelimit ZONE cost=ESTIMATE settle=VALUE`), when the request ends: VALUE is
//! evaluated in the log phase, where `$upstream_http_*`, `$bytes_sent`, `$status` and what Lua
//! set while the body went out are final, and replaces the estimate the request was admitted
//! on (`crate::decide::settle`). The give-back or charge goes to Redis without the request, as
//! reservations' give-backs do (`crate::glue::giveback`).

use core::ptr;

use ngx::ffi::{
    ngx_array_push, ngx_current_msec, ngx_http_core_main_conf_t, ngx_http_handler_pt,
    ngx_http_phases_NGX_HTTP_LOG_PHASE, ngx_http_request_t, ngx_int_t, NGX_ERROR, NGX_LOG_WARN,
    NGX_OK,
};
use ngx::http::HttpModuleMainConf;
use ngx::ngx_log_error;

use crate::decide::log_throttle::LogThrottle;
use crate::decide::settle::{self, Pending, Settlement, RETRY_MS};
use crate::decide::status::Status;
use crate::glue::giveback;
use crate::glue::handler::{find_ctx, Ctx};
use crate::glue::module::RateLimit;

/// Registers the log-phase handler first among the phase's handlers, so that the access log's
/// `$ratelimit_settled` reads the settlement it has made.
pub unsafe fn register(cmcf: &mut ngx_http_core_main_conf_t) -> ngx_int_t {
    let handlers = &mut cmcf.phases[ngx_http_phases_NGX_HTTP_LOG_PHASE as usize].handlers;
    let h = ngx_array_push(handlers) as *mut ngx_http_handler_pt;
    if h.is_null() {
        return NGX_ERROR as ngx_int_t;
    }
    // SAFETY: the array holds `nelts` handlers, the last just pushed; moving the others one up
    // stays within it.
    let first = handlers.elts as *mut ngx_http_handler_pt;
    ptr::copy(first, first.add(1), handlers.nelts - 1);
    *first = Some(log_handler);
    NGX_OK as ngx_int_t
}

/// At most one line a second per zone about a `settle=` value that is not a number of units.
static mut BAD_SETTLE_LOG: LogThrottle<usize> = LogThrottle::new();

unsafe extern "C" fn log_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    if r == (*r).main {
        if let Some(ctx) = find_ctx(r) {
            settle_request(&mut *ctx.as_ptr());
        }
    }
    NGX_OK as ngx_int_t
}

/// Settles each zone with `settle=` the request was placed in: once (the request's context is
/// found again after an internal redirect, and the log phase runs once per main request). An
/// admitted request whose other backend failed (`FAILED_OPEN`, `PASSED_LOCAL`) is settled in
/// the zones a backend that answered placed it in.
unsafe fn settle_request(ctx: &mut Ctx) {
    let admitted = matches!(
        ctx.status,
        Status::Passed | Status::Delayed | Status::FailedOpen | Status::PassedLocal
    );
    if !admitted || ctx.settled.is_some() {
        return;
    }
    let r = ctx.r;
    let Some(mcf) = RateLimit::main_conf(&*r) else { return };
    let now = ngx_current_msec as u64;
    let settled = &mut ctx.settled;
    // Each settlement goes as its zone is read: no list of them is made.
    let sends = ctx.zones.iter().filter_map(|z| {
        let (Some(cv), estimate) = (z.settle, z.placed.units) else { return None };
        if estimate == 0 || z.placed.rid == 0 {
            return None;
        }
        // Parsed at once: the variable's own bytes.
        let value = cv.peek(r);
        let text = value.as_ref().map_or(&[][..], |v| v.as_bytes());
        let (value, s) = settle::settle(estimate, text);
        if value.is_none() && (*ptr::addr_of_mut!(BAD_SETTLE_LOG)).allow(z.zone, now) {
            let (name, shown) = (&mcf.zones[z.zone].name, String::from_utf8_lossy(text));
            ngx_log_error!(
                NGX_LOG_WARN,
                (*(*r).connection).log,
                "ratelimit: settle= of zone \"{name}\" is \"{shown}\", not a number of units \
                 (0 to 1000000000): the estimate {estimate} stays"
            );
        }
        settled.get_or_insert(value.unwrap_or(estimate));
        let (units, charge) = match s {
            Settlement::Keep => return None,
            Settlement::Return(u) => (u, false),
            Settlement::Charge(u) => (u, true),
        };
        let until_ms = now + RETRY_MS;
        Some(Pending { place: z.give_back(units), charge, until_ms, tried: false })
    });
    giveback::settle(mcf, sends);
}

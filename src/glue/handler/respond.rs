//! The decision handed back to the phase engine: the status code, the RateLimit and Retry-After
//! headers, the rejection's log line and the metrics of the request's zones.

use core::ptr;

use ngx::ffi::{
    ngx_http_request_t, ngx_int_t, ngx_list_push, ngx_pnalloc, ngx_str_t, ngx_table_elt_t,
    NGX_DECLINED, NGX_ERROR, NGX_HTTP_SERVICE_UNAVAILABLE,
};
use ngx::ngx_log_error;

use crate::decide::headers::{self, HeaderMode, Name, Policy, Quota};
use crate::decide::script::Algorithm;
use crate::decide::status::Status;
use crate::glue::conf::{LocConf, MainConf};

use super::{Ctx, ZoneReq};

/// Returns the decision to the phase engine, with its headers.
pub(super) unsafe fn apply(ctx: &mut Ctx, lcf: &LocConf, mcf: &MainConf) -> ngx_int_t {
    ctx.applied = true;
    let r = ctx.r;
    // A cost beyond the zone's capacity was logged as such already.
    let decided_by_redis = ctx.status == Status::Rejected && !ctx.beyond_capacity;
    if lcf.dry_run() && matches!(ctx.status, Status::Rejected | Status::RejectedLocal) {
        ctx.status = Status::RejectedDryRun;
    }
    mcf.metrics.get().request(ctx.status, ctx.zones.iter().map(|z| (z.zone, z.cost)));
    let rejected =
        matches!(ctx.status, Status::Rejected | Status::RejectedCached | Status::RejectedLocal);
    // A dry run must not change what clients see: headers only when configured explicitly.
    // A cost beyond capacity gets none: no wait admits it, and no figure would say so.
    let headers = (lcf.headers.is_some() || !lcf.dry_run()) && !ctx.beyond_capacity;
    if let Some((i, remaining, reset_ms)) = ctx.quota {
        let z = &ctx.zones[i];
        let name = mcf.zones[z.zone].name.as_str();
        let (limit, window_ms) = (z.limit, z.window_ms);
        let concurrency = mcf.zones[z.zone].concurrency();
        let quota = Quota {
            zone: name,
            limit,
            limit_digits: z.figures.and_then(|f| f.limit_digits(limit)),
            // A concurrency zone announces no window, yet waiting does free slots: its
            // rejection says when to retry.
            window_ms: if concurrency { window_ms } else { policy_window(mcf, z) },
            remaining,
            reset_ms,
            rejected,
        };
        let policies = ctx.zones.iter().map(|z| Policy {
            zone: &mcf.zones[z.zone].name,
            limit: z.limit,
            window_ms: policy_window(mcf, z),
        });
        if headers && (rejected || lcf.headers() != HeaderMode::Off) {
            // Every value of the request in the room made with its context, written where it
            // stays; a location other than the one it started in may need more.
            let room = headers::room(lcf.headers(), ctx.zones.len());
            let out = match ctx.values {
                (out, len) if len >= room => out,
                _ => ngx_pnalloc((*r).pool, room) as *mut u8,
            };
            if out.is_null() {
                return NGX_ERROR as ngx_int_t;
            }
            let out = core::slice::from_raw_parts_mut(out, room);
            if headers::format(lcf.headers(), &quota, policies, out, |name, value| {
                add_header(r, name, value)
            })
            .is_none()
            {
                return NGX_ERROR as ngx_int_t;
            }
        }
        // A rejection from memory repeats one already logged; local ones are the outage's.
        if decided_by_redis {
            let dry_run = if rejected { "" } else { ", dry run," };
            let log = (*(*r).connection).log;
            if mcf.zones[z.zone].algorithm == Algorithm::Balance {
                // No window and no wait: what is left against what was asked is the story.
                let cost = z.cost;
                ngx_log_error!(
                    lcf.log_level(),
                    log,
                    "ratelimit: limiting requests{dry_run} by zone \"{name}\", balance \
                     {remaining} of {limit} left, cost {cost}"
                );
            } else {
                let per =
                    if concurrency { "in flight".into() } else { format!("per {window_ms}ms") };
                ngx_log_error!(
                    lcf.log_level(),
                    log,
                    "ratelimit: limiting requests{dry_run} by zone \"{name}\", limit {limit} \
                     {per}, retry in {reset_ms}ms"
                );
            }
        }
    }
    match ctx.status {
        _ if rejected => {
            let zone_status = ctx.quota.and_then(|(i, ..)| mcf.zones[ctx.zones[i].zone].status);
            zone_status.map_or(lcf.status() as ngx_int_t, |s| s as ngx_int_t)
        }
        Status::FailedClosed => NGX_HTTP_SERVICE_UNAVAILABLE as ngx_int_t,
        _ => NGX_DECLINED as ngx_int_t,
    }
}

/// The window the headers announce: none for a balance, which only an operator refills, nor for
/// a concurrency zone, whose slots are held as long as their requests run.
fn policy_window(mcf: &MainConf, z: &ZoneReq) -> u64 {
    if matches!(mcf.zones[z.zone].algorithm, Algorithm::Balance | Algorithm::Concurrency) {
        0
    } else {
        z.window_ms
    }
}

/// Adds a response header; it is sent with an allowed response and with the rejection alike.
/// `value` lies in the request's pool or in the configuration.
unsafe fn add_header(r: *mut ngx_http_request_t, name: &'static Name, value: &[u8]) -> Option<()> {
    let h = ngx_list_push(&mut (*r).headers_out.headers) as *mut ngx_table_elt_t;
    if h.is_null() {
        return None;
    }
    // Zeroed first: newer nginx versions chain headers through fields older ones lack.
    ptr::write_bytes(h, 0, 1);
    (*h).hash = 1;
    (*h).key = ngx_str_t { len: name.text.len(), data: name.text.as_ptr() as *mut u8 };
    (*h).value = ngx_str_t { len: value.len(), data: value.as_ptr() as *mut u8 };
    // The name's written-out lower case, which nginx only reads: not copied per request.
    (*h).lowcase_key = name.lower.as_ptr() as *mut u8;
    Some(())
}

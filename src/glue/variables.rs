//! `$ratelimit_status`, `$ratelimit_zone`, `$ratelimit_limit`, `$ratelimit_remaining`,
//! `$ratelimit_reset`, `$ratelimit_time`, `$ratelimit_delay`, `$ratelimit_settled`.
//!
//! Not cacheable, so the access log sees the final value; read from the main request's context,
//! which survives internal redirects.

use core::ptr::addr_of_mut;

use ngx::ffi::{
    ngx_conf_t, ngx_http_add_variable, ngx_http_request_t, ngx_http_variable_t, ngx_int_t,
    ngx_pnalloc, ngx_str_t, ngx_variable_value_t, NGX_ERROR, NGX_HTTP_VAR_NOCACHEABLE, NGX_OK,
};
use ngx::http::HttpModuleMainConf;
use ngx::ngx_string;

use crate::decide::text::StackText;
use crate::glue::handler::{find_ctx, quota_figures};
use crate::glue::module::RateLimit;

const STATUS: usize = 0;
const LIMIT: usize = 1;
const REMAINING: usize = 2;
const RESET: usize = 3;
const ZONE: usize = 4;
/// When the decision was asked for (sent to Redis, or made from this worker's memory), on the
/// wall clock, as `$msec` writes it: the access log's `$msec` trails it by the request's life.
const TIME: usize = 5;
/// How long the request waited for its turn (`delay=`), in ms: 0 when it did not.
const DELAY: usize = 6;
/// The units a request with `settle=` was charged in the end (`crate::glue::settle`): its
/// settled value, or its estimate when the value was not a number; empty before the log phase
/// and for a request that was not admitted.
const SETTLED: usize = 7;

const fn var(name: ngx_str_t, data: usize) -> ngx_http_variable_t {
    ngx_http_variable_t {
        name,
        set_handler: None,
        get_handler: Some(get),
        data,
        flags: NGX_HTTP_VAR_NOCACHEABLE as _,
        index: 0,
    }
}

static mut VARIABLES: [ngx_http_variable_t; 8] = [
    var(ngx_string!("ratelimit_status"), STATUS),
    var(ngx_string!("ratelimit_limit"), LIMIT),
    var(ngx_string!("ratelimit_remaining"), REMAINING),
    var(ngx_string!("ratelimit_reset"), RESET),
    var(ngx_string!("ratelimit_zone"), ZONE),
    var(ngx_string!("ratelimit_time"), TIME),
    var(ngx_string!("ratelimit_delay"), DELAY),
    var(ngx_string!("ratelimit_settled"), SETTLED),
];

/// # Safety
/// Called from preconfiguration with the configuration being parsed.
pub unsafe fn register(cf: *mut ngx_conf_t) -> ngx_int_t {
    for v in (*addr_of_mut!(VARIABLES)).iter_mut() {
        let var = ngx_http_add_variable(cf, &mut v.name, v.flags);
        if var.is_null() {
            return NGX_ERROR as ngx_int_t;
        }
        (*var).get_handler = v.get_handler;
        (*var).data = v.data;
    }
    NGX_OK as ngx_int_t
}

unsafe extern "C" fn get(
    r: *mut ngx_http_request_t,
    v: *mut ngx_variable_value_t,
    data: usize,
) -> ngx_int_t {
    let v = &mut *v;
    v.set_not_found(1);
    let (Some(ctx), Some(mcf)) = (find_ctx(r), RateLimit::main_conf(&*r)) else {
        return NGX_OK as ngx_int_t;
    };
    let ctx = ctx.as_ref();
    if data == STATUS {
        return set(v, ctx.status.as_bytes().as_ptr() as *mut u8, ctx.status.as_bytes().len());
    }
    let mut text = StackText::default();
    if data == DELAY || data == SETTLED {
        let n = if data == DELAY { Some(ctx.wait_ms) } else { ctx.settled };
        let Some(n) = n else { return NGX_OK as ngx_int_t };
        text.num(n);
        return text.get().map_or(NGX_ERROR as ngx_int_t, |t| copy(r, v, t));
    }
    if data == TIME {
        if ctx.asked_ms == 0 {
            return NGX_OK as ngx_int_t;
        }
        text.num(ctx.asked_ms / 1000).push(b".").num_padded(ctx.asked_ms % 1000, 3);
        return text.get().map_or(NGX_ERROR as ngx_int_t, |t| copy(r, v, t));
    }
    let Some((zone, limit, remaining, reset)) = quota_figures(ctx, mcf) else {
        return NGX_OK as ngx_int_t;
    };
    if data == ZONE {
        // The name lives in the configuration, which outlives the request.
        return set(v, zone.as_ptr() as *mut u8, zone.len());
    }
    let n = match data {
        LIMIT => limit,
        REMAINING => remaining,
        _ => reset,
    };
    text.num(n);
    text.get().map_or(NGX_ERROR as ngx_int_t, |t| copy(r, v, t))
}

/// `text` copied into the request's pool as the variable's value.
unsafe fn copy(r: *mut ngx_http_request_t, v: &mut ngx_variable_value_t, text: &[u8]) -> ngx_int_t {
    let p = ngx_pnalloc((*r).pool, text.len()) as *mut u8;
    if p.is_null() {
        return NGX_ERROR as ngx_int_t;
    }
    core::ptr::copy_nonoverlapping(text.as_ptr(), p, text.len());
    set(v, p, text.len())
}

fn set(v: &mut ngx_variable_value_t, data: *mut u8, len: usize) -> ngx_int_t {
    v.data = data;
    v.set_len(len as u32);
    v.set_valid(1);
    v.set_no_cacheable(0);
    v.set_not_found(0);
    NGX_OK as ngx_int_t
}

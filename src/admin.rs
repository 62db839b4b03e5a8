//! `ratelimit_admin zone;`: a location that reads, sets or tops up the credit balances of a
//! balance zone and answers JSON. Its Redis call is a decision of its own (`"B"` to write, `"b"`
//! at cost 0 to read) through the worker's pool, so the worker never blocks on Redis.

use core::ffi::c_void;
use core::ptr::{self, NonNull};

use ngx::core::Pool;
use ngx::ffi::{
    ngx_add_timer, ngx_chain_t, ngx_create_temp_buf, ngx_event_t, ngx_http_arg,
    ngx_http_cleanup_add, ngx_http_discard_request_body, ngx_http_finalize_request,
    ngx_http_output_filter, ngx_http_request_t, ngx_http_run_posted_requests, ngx_http_send_header,
    ngx_int_t, ngx_str_t, ngx_uint_t, NGX_DONE, NGX_ERROR, NGX_HTTP_BAD_GATEWAY,
    NGX_HTTP_BAD_REQUEST, NGX_HTTP_NOT_ALLOWED, NGX_HTTP_OK, NGX_HTTP_POST, NGX_HTTP_PUT, NGX_OK,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf};

use crate::handler::{attach, detach, follow, pool_copy, submit, zone_key, Follow, Retries};
use crate::key::{percent_decode, substitute};
use crate::module::RateLimit;
use crate::params::parse_cost;
use crate::redis::pool::{RedisError, Waiter, WorkerPool};
use crate::script::{self, Algorithm, EncodedArgs, ReplyError, ZoneArgs};

struct AdminCtx {
    r: *mut ngx_http_request_t,
    waiter: Waiter,
    ev: ngx_event_t,
    args: EncodedArgs,
    retries: Retries,
}

/// `key=K` reads the balance, `&set=N` sets it, `&add=N` adds to it (N ≥ 0, at most 10⁹; by
/// POST or PUT only). `K` is the value of the zone key's variable, percent-decoded.
pub unsafe extern "C" fn content_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    let (Some(lcf), Some(mcf)) = (RateLimit::location_conf(&*r), RateLimit::main_conf(&*r)) else {
        return NGX_ERROR as ngx_int_t;
    };
    let (Some(zi), Some(redis)) = (lcf.admin_zone, mcf.redis.as_ref()) else {
        return NGX_ERROR as ngx_int_t;
    };
    let rc = ngx_http_discard_request_body(r);
    if rc != NGX_OK as ngx_int_t {
        return rc;
    }
    let arg = |name: &[u8]| -> Option<&'static [u8]> {
        let mut v = ngx_str_t { len: 0, data: ptr::null_mut() };
        let found = ngx_http_arg(r, name.as_ptr() as *mut u8, name.len(), &mut v) == 0;
        // The value lives in the request's pool, as long as the decision.
        found.then(|| if v.len == 0 { &[][..] } else { core::slice::from_raw_parts(v.data, v.len) })
    };
    let number = |v: &[u8]| core::str::from_utf8(v).ok().and_then(parse_cost);
    let (algorithm, mode, amount) = match (arg(b"set"), arg(b"add")) {
        (None, None) => (Algorithm::Balance, 1, Some(0)),
        (Some(v), None) => (Algorithm::BalanceAdmin, 1, number(v)),
        (None, Some(v)) => (Algorithm::BalanceAdmin, 2, number(v)),
        (Some(_), Some(_)) => (Algorithm::BalanceAdmin, 0, None),
    };
    let (Some(value), Some(amount)) = (arg(b"key").filter(|k| !k.is_empty()), amount) else {
        let msg = b"{\"error\":\"key= is required, with at most one of set= or add=, \
                    a whole number from 0 to 1000000000\"}\n";
        return respond(r, NGX_HTTP_BAD_REQUEST as ngx_uint_t, msg);
    };
    if algorithm == Algorithm::BalanceAdmin
        && (*r).method & (NGX_HTTP_POST | NGX_HTTP_PUT) as ngx_uint_t == 0
    {
        // A change by GET could be made by any page an operator's browser opens (CSRF).
        let msg = b"{\"error\":\"set= and add= need POST or PUT\"}\n";
        return respond(r, NGX_HTTP_NOT_ALLOWED as ngx_uint_t, msg);
    }
    let zone = &mcf.zones[zi];
    // The key a request would use whose key variable is `key=`: exact keys, Cluster tags and
    // long values alike.
    let escape = redis.cluster && !zone.exact_key;
    let Some(value) = substitute(&zone.key_text, &percent_decode(value), escape) else {
        return NGX_ERROR as ngx_int_t;
    };
    let Some(key) = pool_copy(r, &value).and_then(|v| zone_key(r, redis, zone, v)) else {
        return NGX_ERROR as ngx_int_t;
    };
    let za = ZoneArgs {
        key,
        algorithm,
        limit: 1,
        window_ms: mode,
        cost: amount,
        burst: 0,
        member: None,
    };

    let pool = Pool::from_ngx_pool((*r).pool);
    let Some(ctx) = NonNull::new(pool.allocate(AdminCtx {
        r,
        waiter: Waiter { result: None, token: None, ev: ptr::null_mut() },
        ev: core::mem::zeroed(),
        args: EncodedArgs::new(core::iter::once(za), None),
        retries: Retries::default(),
    })) else {
        return NGX_ERROR as ngx_int_t;
    };
    let cln = ngx_http_cleanup_add(r, 0);
    if cln.is_null() {
        return NGX_ERROR as ngx_int_t;
    }
    (*cln).handler = Some(cleanup);
    (*cln).data = ctx.as_ptr() as *mut c_void;
    let c = &mut *ctx.as_ptr();
    attach(&mut c.waiter, &mut c.ev, on_event, r);
    if !submit(mcf, &mut c.waiter, &c.args) {
        return finish(c);
    }
    ngx_add_timer(&mut c.ev, redis.timeout);
    let main = (*r).main;
    (*main).set_count((*main).count() + 1);
    NGX_DONE as ngx_int_t
}

unsafe extern "C" fn cleanup(data: *mut c_void) {
    let ctx = &mut *(data as *mut AdminCtx);
    detach(&mut ctx.waiter, &mut ctx.ev);
}

unsafe extern "C" fn on_event(ev: *mut ngx_event_t) {
    let ctx = &mut *ngx::ngx_container_of!(ev, AdminCtx, ev);
    let r = ctx.r;
    let Some(mcf) = RateLimit::main_conf(&*r) else { return };
    if (*ev).timedout() != 0 {
        (*ev).set_timedout(0);
        if let Some(token) = ctx.waiter.token.take() {
            WorkerPool::cancel(token);
        }
        ctx.waiter.result = Some(Err(RedisError::Timeout));
    }
    if ctx.waiter.result.is_none() {
        return;
    }
    // An operator's write is retried by the operator: no pause for TRYAGAIN.
    if let Follow::Resent = follow(mcf, &mut ctx.waiter, &ctx.args, &mut ctx.retries) {
        return;
    }
    detach(&mut ctx.waiter, &mut ctx.ev);
    let c = (*r).connection;
    ngx_http_finalize_request(r, finish(ctx));
    ngx_http_run_posted_requests(c);
}

/// Answers the result: `{"balance":N}`, or 502 with what went wrong.
unsafe fn finish(ctx: &mut AdminCtx) -> ngx_int_t {
    let reply = ctx.waiter.result.take();
    let decision = reply.map(|res| res.map(|reply| script::decode_decision(&reply, 1)));
    let mut body = Vec::with_capacity(64);
    let status = match decision {
        Some(Ok(Ok(d))) => {
            body.extend_from_slice(
                format!("{{\"balance\":{}}}\n", d.zones[0].remaining).as_bytes(),
            );
            NGX_HTTP_OK
        }
        Some(Ok(Err(ReplyError::Redis(msg)))) => {
            error_json(&mut body, &format!("redis replied {msg}"));
            NGX_HTTP_BAD_GATEWAY
        }
        Some(Ok(Err(_))) => {
            error_json(&mut body, "unexpected reply from the script");
            NGX_HTTP_BAD_GATEWAY
        }
        Some(Err(e)) => {
            error_json(&mut body, &format!("redis {e}"));
            NGX_HTTP_BAD_GATEWAY
        }
        None => return NGX_ERROR as ngx_int_t,
    };
    respond(ctx.r, status as ngx_uint_t, &body)
}

/// `{"error":"..."}` with the text escaped for JSON.
fn error_json(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(b"{\"error\":\"");
    for ch in text.chars() {
        match ch {
            '"' | '\\' => out.extend_from_slice(&[b'\\', ch as u8]),
            c if (c as u32) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes())
            }
            c => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out.extend_from_slice(b"\"}\n");
}

unsafe fn respond(r: *mut ngx_http_request_t, status: ngx_uint_t, body: &[u8]) -> ngx_int_t {
    const JSON: &[u8] = b"application/json";
    (*r).headers_out.status = status;
    (*r).headers_out.content_length_n = body.len() as _;
    (*r).headers_out.content_type = ngx_str_t { len: JSON.len(), data: JSON.as_ptr() as *mut u8 };
    (*r).headers_out.content_type_len = JSON.len();
    let rc = ngx_http_send_header(r);
    if rc == NGX_ERROR as ngx_int_t || rc > NGX_OK as ngx_int_t || (*r).header_only() != 0 {
        return rc;
    }
    let b = ngx_create_temp_buf((*r).pool, body.len());
    if b.is_null() {
        return NGX_ERROR as ngx_int_t;
    }
    ptr::copy_nonoverlapping(body.as_ptr(), (*b).last, body.len());
    (*b).last = (*b).last.add(body.len());
    (*b).set_last_buf(1);
    (*b).set_last_in_chain(1);
    let mut out = ngx_chain_t { buf: b, next: ptr::null_mut() };
    ngx_http_output_filter(r, &mut out)
}

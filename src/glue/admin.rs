//! `ratelimit_admin zone;`: a location that reads or resets what a zone holds for one key, and
//! sets or tops up a balance zone's credits, answering JSON. Its Redis call is a decision of its
//! own (the zone's algorithm at cost 0 to read, `"D"` to reset, `"B"` to write a balance) through
//! the worker's pool, so the worker never blocks on Redis.

use core::ffi::c_void;
use core::ptr::{self, NonNull};

use ngx::core::Pool;
use ngx::ffi::{
    ngx_add_timer, ngx_chain_t, ngx_create_temp_buf, ngx_event_t, ngx_http_arg,
    ngx_http_cleanup_add, ngx_http_discard_request_body, ngx_http_finalize_request,
    ngx_http_output_filter, ngx_http_request_t, ngx_http_run_posted_requests, ngx_http_send_header,
    ngx_int_t, ngx_str_t, ngx_uint_t, NGX_DONE, NGX_ERROR, NGX_HTTP_BAD_GATEWAY,
    NGX_HTTP_BAD_REQUEST, NGX_HTTP_DELETE, NGX_HTTP_GET, NGX_HTTP_HEAD, NGX_HTTP_NOT_ALLOWED,
    NGX_HTTP_OK, NGX_HTTP_POST, NGX_HTTP_PUT, NGX_OK,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf};

use crate::decide::key::{percent_decode, substitute};
use crate::decide::params::{parse_cost, parse_limit, parse_window};
use crate::decide::script::{self, Algorithm, EncodedArgs, Place, ReplyError, ZoneArgs};
use crate::glue::conf::{Param, Zone};
use crate::glue::module::RateLimit;
use crate::glue::request::{attach, detach, pool_copy, wall_ms, zone_key};
use crate::redis::follow::{follow, submit, Follow, Retries};
use crate::redis::invalidation;
use crate::redis::pool::{RedisError, Waiter, WorkerPool};

/// What an admin request asks of its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// GET: the zone's figures, changing nothing.
    Read,
    /// DELETE: the key removed, as if the consumer had never come.
    Reset,
    /// POST or PUT with `set=N`: a balance set to N.
    Set(u64),
    /// POST or PUT with `add=N`: N added to a balance.
    Add(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Other,
}

/// The operation, or the status and message that refuse it.
fn op(method: Method, set: Option<&[u8]>, add: Option<&[u8]>) -> Result<Op, (u32, &'static str)> {
    let number = |v: &[u8]| core::str::from_utf8(v).ok().and_then(parse_cost);
    let bad = (NGX_HTTP_BAD_REQUEST, "set= or add= needs a whole number from 0 to 1000000000");
    match (method, set, add) {
        // A change by GET could be made by any page an operator's browser opens (CSRF).
        (Method::Get | Method::Head, None, None) => Ok(Op::Read),
        (Method::Get | Method::Head, ..) => {
            Err((NGX_HTTP_NOT_ALLOWED, "set= and add= need POST or PUT"))
        }
        (Method::Delete, None, None) => Ok(Op::Reset),
        (Method::Delete, ..) => Err((NGX_HTTP_BAD_REQUEST, "DELETE takes key= alone")),
        (Method::Post | Method::Put, Some(v), None) => number(v).map(Op::Set).ok_or(bad),
        (Method::Post | Method::Put, None, Some(v)) => number(v).map(Op::Add).ok_or(bad),
        (Method::Post | Method::Put, ..) => {
            Err((NGX_HTTP_BAD_REQUEST, "POST and PUT take one of set= or add="))
        }
        (Method::Other, ..) => Err((NGX_HTTP_NOT_ALLOWED, "GET, DELETE, POST or PUT")),
    }
}

struct AdminCtx {
    r: *mut ngx_http_request_t,
    waiter: Waiter,
    ev: ngx_event_t,
    args: EncodedArgs,
    retries: Retries,
    op: Op,
    /// The zone's index and the key as given, for the answer.
    zone: usize,
    given: Vec<u8>,
    /// The key as Redis names it, which a change makes this worker forget what it remembers of.
    key: Vec<u8>,
    limit: u64,
    window_ms: u64,
}

/// `GET ?key=K` reads what the zone holds for `K`, `DELETE ?key=K` resets it, and on a balance
/// zone `POST ?key=K&set=N` or `&add=N` changes the balance. `K` is the value of the zone key's
/// variable, percent-decoded.
pub unsafe extern "C" fn content_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    let (Some(lcf), Some(mcf)) = (RateLimit::location_conf(&*r), RateLimit::main_conf(&*r)) else {
        return NGX_ERROR as ngx_int_t;
    };
    let Some(zi) = lcf.admin_zone else { return NGX_ERROR as ngx_int_t };
    // The zone's backend: one `merge_loc_conf` never checked when no line uses the zone.
    let Some(redis) = mcf.zone_redis(zi) else {
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
    let method = match (*r).method as u32 {
        NGX_HTTP_GET => Method::Get,
        NGX_HTTP_HEAD => Method::Head,
        NGX_HTTP_POST => Method::Post,
        NGX_HTTP_PUT => Method::Put,
        NGX_HTTP_DELETE => Method::Delete,
        _ => Method::Other,
    };
    let zone = &mcf.zones[zi];
    let balance = zone.algorithm == Algorithm::Balance;
    let op = match op(method, arg(b"set"), arg(b"add")) {
        Ok(Op::Set(_) | Op::Add(_)) if !balance => {
            Err((NGX_HTTP_BAD_REQUEST, "set= and add= are for balance zones"))
        }
        op => op,
    };
    let Some(given) = arg(b"key").filter(|k| !k.is_empty()).map(percent_decode) else {
        return refuse(r, NGX_HTTP_BAD_REQUEST, "key= is required");
    };
    let op = match op {
        Ok(op) => op,
        Err((status, why)) => return refuse(r, status, why),
    };
    // A limit or window from a request variable has no value here: the caller gives it.
    let figure = |p: Param, name: &[u8], parse: fn(&str) -> Option<u64>| match p {
        Param::Fixed(n) => Some(n),
        Param::Var(_) => arg(name).and_then(|v| core::str::from_utf8(v).ok()).and_then(parse),
    };
    let (Some(limit), Some(window)) =
        (figure(zone.limit, b"limit", parse_limit), figure(zone.window, b"window", parse_window))
    else {
        return refuse(
            r,
            NGX_HTTP_BAD_REQUEST,
            "the zone's limit or window is a variable: give limit= and window=",
        );
    };
    // The key a request would use whose key variable is `key=`: exact keys, Cluster tags and
    // long values alike.
    let escape = redis.cluster && !zone.exact_key;
    let Some(value) = substitute(&zone.key_text, &given, escape) else {
        return NGX_ERROR as ngx_int_t;
    };
    let Some(key) = pool_copy(r, &value).and_then(|v| zone_key(r, redis, zone, v)) else {
        return NGX_ERROR as ngx_int_t;
    };
    let (algorithm, window_ms, cost) = match op {
        Op::Read => (zone.algorithm, zone.period.map_or(window, |p| p.encode()), 0),
        Op::Reset => (Algorithm::Reset, 1, 0),
        Op::Set(n) => (Algorithm::BalanceAdmin, 1, n),
        Op::Add(n) => (Algorithm::BalanceAdmin, 2, n),
    };
    let redis_key = key.parts().concat();
    let za = ZoneArgs {
        key,
        algorithm,
        limit,
        window_ms,
        cost,
        burst: zone.burst,
        // A concurrency read names a member no request has (ids are hex): it counts the slots
        // held, lapsed ones pruned, and takes none.
        member: zone.concurrency().then_some(&b"admin"[..]),
        lease: None,
        delay: None,
        place: Place::No,
        figures: None,
    };

    let pool = Pool::from_ngx_pool((*r).pool);
    let Some(ctx) = NonNull::new(pool.allocate(AdminCtx {
        r,
        waiter: Waiter::new(ptr::null_mut()),
        ev: core::mem::zeroed(),
        args: EncodedArgs::new(core::iter::once(za), None),
        retries: Retries::default(),
        op,
        zone: zi,
        given,
        key: redis_key,
        limit,
        window_ms: zone.period.map_or(window, |p| p.length_ms(wall_ms())),
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
    if !submit(mcf.pool(zone.backend), &mut c.waiter, c.args.call()) {
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
    if let Follow::Resent = follow(
        || mcf.pool(mcf.zones[ctx.zone].backend),
        &mut ctx.waiter,
        ctx.args.call(),
        &mut ctx.retries,
    ) {
        return;
    }
    detach(&mut ctx.waiter, &mut ctx.ev);
    let c = (*r).connection;
    ngx_http_finalize_request(r, finish(ctx));
    ngx_http_run_posted_requests(c);
}

/// Answers the result as JSON, or 502 with what went wrong.
unsafe fn finish(ctx: &mut AdminCtx) -> ngx_int_t {
    let reply = ctx.waiter.result.take();
    let decision = reply.map(|res| res.map(|reply| script::decode_one(reply.view())));
    let Some(mcf) = RateLimit::main_conf(&*ctx.r) else { return NGX_ERROR as ngx_int_t };
    let zone = &mcf.zones[ctx.zone];
    let (status, body) = match decision {
        Some(Ok(Ok((_, z)))) => {
            if ctx.op != Op::Read {
                // Heard now, not only when Redis's notice comes, which may be after the next
                // request this worker takes: that one must not be answered from its memory.
                invalidation::forget(&ctx.key);
            }
            (
                NGX_HTTP_OK,
                answer(zone, &ctx.given, ctx.op, z.remaining, z.reset_ms, ctx.limit, ctx.window_ms),
            )
        }
        Some(Ok(Err(ReplyError::Redis(msg)))) => {
            (NGX_HTTP_BAD_GATEWAY, error_json(&format!("redis replied {msg}")))
        }
        Some(Ok(Err(_))) => (NGX_HTTP_BAD_GATEWAY, error_json("unexpected reply from the script")),
        Some(Err(e)) => (NGX_HTTP_BAD_GATEWAY, error_json(&format!("redis {e}"))),
        None => return NGX_ERROR as ngx_int_t,
    };
    respond(ctx.r, status as ngx_uint_t, &body)
}

/// The answer to a successful operation: the zone, the key as given, and what it holds now.
fn answer(
    zone: &Zone,
    given: &[u8],
    op: Op,
    remaining: u64,
    reset_ms: u64,
    limit: u64,
    window_ms: u64,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    out.extend_from_slice(b"{\"zone\":");
    json_str(&mut out, &zone.name);
    out.extend_from_slice(b",\"key\":");
    json_str(&mut out, &String::from_utf8_lossy(given));
    let balance = zone.algorithm == Algorithm::Balance;
    let rest = match op {
        Op::Read if zone.concurrency() => {
            // What Redis holds: the slots of requests in flight on every gateway.
            let in_flight = limit.saturating_sub(remaining);
            format!(
                ",\"limit\":{limit},\"in_flight\":{in_flight},\"remaining\":{remaining},\
                 \"lease_time_ms\":{window_ms}}}\n"
            )
        }
        Op::Reset => format!(",\"deleted\":{}}}\n", remaining > 0),
        Op::Set(_) | Op::Add(_) => format!(",\"balance\":{remaining}}}\n"),
        Op::Read if balance => format!(",\"balance\":{remaining},\"limit\":{limit}}}\n"),
        Op::Read => {
            let span = match zone.period {
                Some(p) => format!("\"period\":\"{}\",\"period_ms\":{window_ms}", p.kind.name()),
                None => format!("\"window_ms\":{window_ms}"),
            };
            format!(
                ",\"limit\":{limit},\"remaining\":{remaining},\"reset_ms\":{reset_ms},{span}}}\n"
            )
        }
    };
    out.extend_from_slice(rest.as_bytes());
    out
}

/// A refusal before anything is asked of Redis.
unsafe fn refuse(r: *mut ngx_http_request_t, status: u32, why: &str) -> ngx_int_t {
    respond(r, status as ngx_uint_t, &error_json(why))
}

/// `{"error":"..."}`.
fn error_json(text: &str) -> Vec<u8> {
    let mut out = b"{\"error\":".to_vec();
    json_str(&mut out, text);
    out.extend_from_slice(b"}\n");
    out
}

/// A JSON string of `text`, quoted and escaped.
fn json_str(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    for ch in text.chars() {
        match ch {
            '"' | '\\' => out.extend_from_slice(&[b'\\', ch as u8]),
            c if (c as u32) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes())
            }
            c => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out.push(b'"');
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_and_arguments() {
        use Method::*;
        assert_eq!(op(Get, None, None), Ok(Op::Read));
        assert_eq!(op(Head, None, None), Ok(Op::Read));
        assert_eq!(op(Delete, None, None), Ok(Op::Reset));
        assert_eq!(op(Post, Some(b"5"), None), Ok(Op::Set(5)));
        assert_eq!(op(Put, None, Some(b"7")), Ok(Op::Add(7)));
        // Writes by GET are refused: a link could make them.
        assert_eq!(op(Get, Some(b"5"), None).unwrap_err().0, NGX_HTTP_NOT_ALLOWED);
        assert_eq!(op(Other, None, None).unwrap_err().0, NGX_HTTP_NOT_ALLOWED);
        for bad in [
            op(Post, None, None),
            op(Post, Some(b"1"), Some(b"1")),
            op(Post, Some(b"-1"), None),
            op(Post, Some(b"1000000001"), None),
            op(Delete, Some(b"1"), None),
        ] {
            assert_eq!(bad.unwrap_err().0, NGX_HTTP_BAD_REQUEST);
        }
    }

    #[test]
    fn json_strings_are_escaped() {
        let mut out = Vec::new();
        json_str(&mut out, "a\"b\\c\nd");
        assert_eq!(out, b"\"a\\\"b\\\\c\\u000ad\"");
        assert_eq!(error_json("x"), b"{\"error\":\"x\"}\n");
    }
}

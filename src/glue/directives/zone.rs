//! `ratelimit_zone`: a zone's key, figures, algorithm and options, checked together, into
//! `crate::glue::conf::Zone`.

use core::cell::OnceCell;
use core::ffi::{c_char, c_void};

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{ngx_command_t, ngx_conf_t, ngx_str_t, NGX_LOG_EMERG};
use ngx::ngx_conf_log_error;

use super::{args, invalid, invalid_because, number_or_variable, text, unknown};
use crate::codec::values::{parse_msec, parse_switch, parse_uint, split_param};
use crate::decide::key::{split_braces, tag_template, Piece};
use crate::decide::lease::{LeaseConf, LeaseSize, DEFAULT_LEASE_MS};
use crate::decide::params::{
    limit_req_rate, parse_limit, parse_window, valid_zone_name, MAX_LEASE_MS, MAX_WINDOW_MS,
};
use crate::decide::quota::{parse_offset, Period, PeriodKind};
use crate::decide::script::Algorithm;
use crate::decide::slots::MIN_SLOT_MS;
use crate::glue::conf::{Clock, KeyPiece, MainConf, Param, Zone, NO_BACKEND};
use crate::glue::value::Value;

pub(super) unsafe extern "C" fn cmd_zone(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    let mcf = &mut *(conf as *mut MainConf);
    let args = args(cf);
    let name = text(&args[1]);
    if !valid_zone_name(name) {
        return invalid(cf, "zone name", name);
    }
    if mcf.zones.iter().any(|z| z.name == name) {
        ngx_conf_log_error!(
            NGX_LOG_EMERG,
            cf,
            "duplicate zone \"{name}\" in \"ratelimit_zone\" directive"
        );
        return NGX_CONF_ERROR as _;
    }
    let (mut key, mut limit, mut window, mut clock) = (None, None, None, Clock::Redis);
    let (mut key_pieces, mut tag, mut key_text) = (Vec::new(), None, Vec::new());
    let (mut algorithm, mut burst, mut exact_key) = (None, None, false);
    let (mut period, mut offset_min, mut missing, mut status) = (None, None, None, None);
    let (mut member, mut redis_name) = (None, None);
    let (mut lease, mut lease_time, mut lease_time_text) = (None, None, "");
    for (i, arg) in args.iter().enumerate().skip(2) {
        let s = text(arg);
        let Some((param, value)) = split_param(s) else { return unknown(cf, s, i) };
        let ok = match param {
            "key" => Value::compile(cf, arg, "key=".len()).and_then(|cv| {
                key = Some(cv);
                key_text = value.as_bytes().to_vec();
                key_pieces = compile_key_pieces(cf, value)?;
                tag = tag_template(value.as_bytes());
                Some(())
            }),
            "limit" => number_or_variable(cf, arg, param, parse_limit).map(|p| limit = Some(p)),
            "window" => number_or_variable(cf, arg, param, parse_window).map(|p| window = Some(p)),
            "algorithm" => Algorithm::parse(value).map(|a| algorithm = Some(a)),
            "period" => PeriodKind::parse(value).map(|k| period = Some(k)),
            "utc_offset" => parse_offset(value).map(|m| offset_min = Some(m)),
            "missing" => match value {
                "reject" => Some(0),
                _ => parse_limit(value),
            }
            .map(|n| missing = Some(n)),
            "status" => parse_uint(value, 400, 599).map(|n| status = Some(n)),
            "burst" => parse_limit(value).map(|b| burst = Some(b)),
            "clock" => match value {
                "redis" => Some(Clock::Redis),
                "nginx" => Some(Clock::Nginx),
                _ => None,
            }
            .map(|c| clock = c),
            "exact_key" => parse_switch(value).map(|e| exact_key = e),
            // Checked against the backends once the whole `http{}` block is read.
            "redis" => (!value.is_empty()).then(|| redis_name = Some(value.to_owned())),
            "member" => match value {
                "request_id" => {
                    let id = ngx_str_t { len: 11, data: c"$request_id".as_ptr() as *mut u8 };
                    Value::compile(cf, &id, 0).map(|cv| member = Some(cv))
                }
                "integer" => {
                    member = None;
                    Some(())
                }
                _ => None,
            },
            "lease" => match value {
                "off" => Some(None),
                "auto" => Some(Some(LeaseSize::Auto)),
                _ => parse_limit(value).map(|n| Some(LeaseSize::Fixed(n))),
            }
            .map(|l| lease = Some(l)),
            "lease_time" => parse_msec(value).filter(|&t| t > 0).map(|t| {
                lease_time = Some(t);
                lease_time_text = s;
            }),
            _ => return unknown(cf, s, i),
        };
        if ok.is_none() {
            let hint = match limit_req_rate(value).filter(|_| param == "limit") {
                Some((n, w)) => format!(": limit= is a count, write \"limit={n} window={w}\""),
                None => String::new(),
            };
            return invalid_because(cf, "value", s, &hint);
        }
    }
    if lease_time.is_some_and(|t| t > MAX_LEASE_MS) {
        return zone_error(
            cf,
            name,
            &format!(
                "\"{lease_time_text}\" is too long, 1h at most: a worker that dies holding \
                 units or slots keeps them from everyone for that long"
            ),
        );
    }
    // A calendar period or a balance stands for the window.
    let algorithm = match (algorithm, period) {
        (Some(Algorithm::Concurrency), _) => {
            // A slot has no window: it lasts as long as its request, renewed meanwhile.
            let refused = [
                (
                    window.is_some(),
                    "\"window=\" is not for algorithm=concurrency: a slot is held \
                 as long as its request runs",
                ),
                (period.is_some(), "\"period=\" is not for algorithm=concurrency"),
                (
                    burst.is_some(),
                    "\"burst=\" is not for algorithm=concurrency: \"limit=\" is how many \
                 requests may run at once",
                ),
                (
                    lease.is_some(),
                    "\"lease=\" is not for algorithm=concurrency: each slot is a \
                 lease of its own, whose life \"lease_time=\" sets",
                ),
            ];
            if let Some((_, what)) = refused.iter().find(|(bad, _)| *bad) {
                return zone_error(cf, name, what);
            }
            // 0: not given, resolved once `ratelimit_redis`'s timeout is known (init_main_conf).
            let life = lease_time.unwrap_or(0);
            if lease_time.is_some() && life < MIN_SLOT_MS {
                return zone_error(
                    cf,
                    name,
                    &format!(
                        "\"lease_time={life}ms\" is too short for algorithm=concurrency, \
                         {MIN_SLOT_MS}ms at least: a slot is renewed every third of it"
                    ),
                );
            }
            window = Some(Param::Fixed(life));
            lease_time = None;
            if member.is_some() {
                return zone_error(cf, name, "\"member=\" is not for algorithm=concurrency");
            }
            // The slot's member: the request's own id, unique across gateways.
            let id = ngx_str_t { len: 11, data: c"$request_id".as_ptr() as *mut u8 };
            let Some(cv) = Value::compile(cf, &id, 0) else { return NGX_CONF_ERROR as _ };
            member = Some(cv);
            Algorithm::Concurrency
        }
        (None, Some(_)) => Algorithm::CalendarQuota,
        (Some(a), None) => a,
        (None, None) => Algorithm::SlidingLog,
        (Some(_), Some(_)) => {
            return zone_error(
                cf,
                name,
                "\"period=\" makes a calendar quota, without \"algorithm=\"",
            )
        }
    };
    if algorithm == Algorithm::Balance && window.is_none() {
        window = Some(Param::Fixed(MAX_WINDOW_MS));
    } else if algorithm == Algorithm::CalendarQuota && window.is_none() {
        // Each request takes the length of its period (the script gets the period itself).
        window = Some(Param::Fixed(1));
    } else if algorithm == Algorithm::CalendarQuota || algorithm == Algorithm::Balance {
        return zone_error(cf, name, "\"window=\" is not for a calendar quota or a balance");
    }
    if offset_min.is_some() && period.is_none() {
        return zone_error(cf, name, "\"utc_offset=\" needs \"period=\"");
    }
    if missing.is_some() && algorithm != Algorithm::Balance {
        return zone_error(cf, name, "\"missing=\" needs \"algorithm=balance\"");
    }
    let absent = match (key.is_some(), limit.is_some(), window.is_some()) {
        (false, ..) => "key=, the value each client is counted under (key=$binary_remote_addr)",
        (_, false, _) => "limit=, how many requests it admits (limit=10 window=1s)",
        (.., false) => {
            "window=, the rolling window of limit= (window=1s); or period=hour|day|week|month \
             for a calendar quota, or algorithm=balance|concurrency, which have no window"
        }
        _ => "",
    };
    let (Some(key), Some(limit), Some(window)) = (key, limit, window) else {
        return zone_error(cf, name, &format!("needs {absent}"));
    };
    if burst.is_some() && algorithm != Algorithm::Gcra {
        ngx_conf_log_error!(
            NGX_LOG_EMERG,
            cf,
            "\"burst=\" of \"ratelimit_zone\" directive \"{name}\" needs algorithm=gcra"
        );
        return NGX_CONF_ERROR as _;
    }
    if member.is_some() && !matches!(algorithm, Algorithm::SlidingLog | Algorithm::Concurrency) {
        ngx_conf_log_error!(
            NGX_LOG_EMERG,
            cf,
            "\"member=request_id\" of \"ratelimit_zone\" directive \"{name}\" needs \
             algorithm=sliding_log"
        );
        return NGX_CONF_ERROR as _;
    }
    let lease = match (lease.flatten(), lease_time) {
        (Some(size), time) => Some(LeaseConf { size, time_ms: time.unwrap_or(DEFAULT_LEASE_MS) }),
        (None, None) => None,
        (None, Some(_)) => return zone_error(cf, name, "\"lease_time=\" needs \"lease=\""),
    };
    if lease.is_some() && member.is_some() {
        return zone_error(
            cf,
            name,
            "\"lease=\" cannot reserve with \"member=request_id\": a reserved unit has no request",
        );
    }
    if let (Param::Fixed(n), Algorithm::Concurrency) = (limit, algorithm) {
        let max = algorithm.max_limit();
        if n > max {
            return zone_error(
                cf,
                name,
                &format!(
                    "\"limit={n}\" is more than algorithm=concurrency holds, {max} requests \
                     in flight per key"
                ),
            );
        }
    }
    // A default lease_time is shortened to fit a short window; one written out must fit it.
    if let (Some(t), Param::Fixed(w)) = (lease_time.filter(|_| lease.is_some()), window) {
        let rolling = !matches!(algorithm, Algorithm::CalendarQuota | Algorithm::Balance);
        if rolling && t > w / 4 {
            return zone_error(
                cf,
                name,
                &format!(
                    "\"{lease_time_text}\" is more than a quarter of the window ({w}ms): \
                     reserved units would hold it for most of its length, write \
                     lease_time={}ms or less",
                    w / 4
                ),
            );
        }
    }
    if let Param::Fixed(n) = limit {
        if n > algorithm.max_limit() {
            ngx_conf_log_error!(
                NGX_LOG_EMERG,
                cf,
                "limit={n} of \"ratelimit_zone\" directive \"{name}\" is more than its \
                 algorithm keeps exactly ({} entries per key), use algorithm=sliding_counter \
                 or algorithm=gcra",
                algorithm.max_limit()
            );
            return NGX_CONF_ERROR as _;
        }
    }
    mcf.zones.push(Zone {
        name: name.to_owned(),
        key,
        key_text,
        key_pieces,
        tag,
        algorithm,
        limit,
        window,
        // Without a burst, GCRA spaces requests evenly, as limit_req does without one.
        burst: if algorithm == Algorithm::Balance {
            missing.unwrap_or(0)
        } else {
            burst.unwrap_or(1)
        },
        clock,
        period: period.map(|kind| Period { kind, offset_min: offset_min.unwrap_or(0) }),
        status,
        exact_key,
        member,
        lease,
        at: (text(&(*(*cf).conf_file).file.name).to_owned(), (*(*cf).conf_file).line),
        table_head: OnceCell::new(),
        redis_name,
        backend: NO_BACKEND,
    });
    NGX_CONF_OK
}

/// Logs `"ratelimit_zone" directive "<name>": <what>` and fails the configuration.
unsafe fn zone_error(cf: *mut ngx_conf_t, name: &str, what: &str) -> *mut c_char {
    ngx_conf_log_error!(NGX_LOG_EMERG, cf, "\"ratelimit_zone\" directive \"{name}\": {what}");
    NGX_CONF_ERROR as _
}

/// The pieces of a key template with literal braces (`crate::decide::key::split_braces`), each text
/// compiled on its own; empty without literal braces.
unsafe fn compile_key_pieces(cf: *mut ngx_conf_t, template: &str) -> Option<Vec<KeyPiece>> {
    let Some(pieces) = split_braces(template.as_bytes()) else { return Some(Vec::new()) };
    let mut out = Vec::with_capacity(pieces.len());
    for piece in pieces {
        out.push(match piece {
            Piece::Brace(b) => KeyPiece::Brace(b),
            // The text points into the configuration's pool, as the whole template does.
            Piece::Text(t) => {
                let s = ngx_str_t { len: t.len(), data: t.as_ptr() as *mut u8 };
                KeyPiece::Value(Value::compile(cf, &s, 0)?)
            }
        });
    }
    Some(out)
}

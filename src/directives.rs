//! The directive table and its handlers. Values are parsed by `crate::params`; errors name the
//! directive and the bad value, and nginx appends the file and line.

use core::ffi::{c_char, c_void};
use core::ptr;

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_compile_complex_value, ngx_http_compile_complex_value_t,
    ngx_http_complex_value_t, ngx_parse_url, ngx_pcalloc, ngx_str_t, ngx_uint_t, ngx_url_t,
    AF_UNIX, NGX_CONF_1MORE, NGX_CONF_FLAG, NGX_CONF_NOARGS, NGX_CONF_TAKE1, NGX_HTTP_LOC_CONF,
    NGX_HTTP_LOC_CONF_OFFSET, NGX_HTTP_MAIN_CONF, NGX_HTTP_MAIN_CONF_OFFSET, NGX_HTTP_SRV_CONF,
    NGX_LOG_EMERG, NGX_LOG_ERR, NGX_LOG_INFO, NGX_LOG_NOTICE, NGX_LOG_WARN,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule};
use ngx::{ngx_conf_log_error, ngx_string};

use crate::conf::{
    Clock, FailPolicy, KeyPiece, LimitRef, LocConf, MainConf, Param, RedisConf, SeedAddr,
    SentinelConf, Zone,
};
use crate::headers::HeaderMode;
use crate::key::{split_braces, tag_template, Piece};
use crate::lease::{LeaseConf, LeaseSize, DEFAULT_LEASE_MS};
use crate::metrics;
use crate::module::RateLimit;
use crate::params::{
    limit_req_hint, limit_req_rate, parse_cost, parse_limit, parse_msec, parse_size, parse_switch,
    parse_uint, parse_window, shown_address, split_param, unknown_param, valid_zone_name,
    MAX_LEASE_MS, MAX_WINDOW_MS,
};
use crate::quota::{parse_offset, Period, PeriodKind};
use crate::redis::resp;
use crate::redis::tls;
use crate::redis::tls_params::{Taken, TlsParams, PARAM_NAMES as TLS_PARAM_NAMES};
use crate::script::Algorithm;
use crate::slots::MIN_SLOT_MS;

const LOC_CONTEXTS: u32 = NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF;

const fn command(
    name: ngx_str_t,
    type_: u32,
    set: unsafe extern "C" fn(*mut ngx_conf_t, *mut ngx_command_t, *mut c_void) -> *mut c_char,
    conf: usize,
) -> ngx_command_t {
    ngx_command_t {
        name,
        type_: type_ as ngx_uint_t,
        set: Some(set),
        conf,
        offset: 0,
        post: ptr::null_mut(),
    }
}

pub static mut COMMANDS: [ngx_command_t; 15] = [
    command(
        ngx_string!("ratelimit_redis"),
        NGX_HTTP_MAIN_CONF | NGX_CONF_1MORE,
        cmd_redis,
        NGX_HTTP_MAIN_CONF_OFFSET,
    ),
    command(
        ngx_string!("ratelimit_zone"),
        NGX_HTTP_MAIN_CONF | NGX_CONF_1MORE,
        cmd_zone,
        NGX_HTTP_MAIN_CONF_OFFSET,
    ),
    command(
        ngx_string!("ratelimit"),
        // More than one parameter is never valid, but limit_req's `burst=5 nodelay` deserves
        // its own answer rather than nginx's "invalid number of arguments".
        LOC_CONTEXTS | NGX_CONF_1MORE,
        cmd_ratelimit,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("ratelimit_fail"),
        LOC_CONTEXTS | NGX_CONF_TAKE1,
        cmd_fail,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("ratelimit_status"),
        LOC_CONTEXTS | NGX_CONF_TAKE1,
        cmd_status,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("ratelimit_headers"),
        LOC_CONTEXTS | NGX_CONF_TAKE1,
        cmd_headers,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("ratelimit_log_level"),
        LOC_CONTEXTS | NGX_CONF_TAKE1,
        cmd_log_level,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("ratelimit_fail_local_share"),
        LOC_CONTEXTS | NGX_CONF_TAKE1,
        cmd_fail_local_share,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("ratelimit_fail_local_size"),
        NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1,
        cmd_fail_local_size,
        NGX_HTTP_MAIN_CONF_OFFSET,
    ),
    command(
        ngx_string!("ratelimit_deny_cache"),
        LOC_CONTEXTS | NGX_CONF_FLAG,
        cmd_deny_cache,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("ratelimit_admin"),
        NGX_HTTP_LOC_CONF | NGX_CONF_TAKE1,
        cmd_admin,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("ratelimit_dry_run"),
        LOC_CONTEXTS | NGX_CONF_FLAG,
        cmd_dry_run,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    command(
        ngx_string!("ratelimit_metrics_zone"),
        NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1,
        cmd_metrics_zone,
        NGX_HTTP_MAIN_CONF_OFFSET,
    ),
    command(
        ngx_string!("ratelimit_metrics"),
        NGX_HTTP_LOC_CONF | NGX_CONF_NOARGS,
        cmd_metrics,
        NGX_HTTP_LOC_CONF_OFFSET,
    ),
    ngx_command_t::empty(),
];

const IS_DUPLICATE: *mut c_char = c"is duplicate".as_ptr() as *mut c_char;

/// The directive's arguments, `args[0]` being its name.
///
/// # Safety
/// `cf` is the configuration being parsed; the slice lives as long as this directive's handler.
unsafe fn args<'a>(cf: *mut ngx_conf_t) -> &'a [ngx_str_t] {
    (*(*cf).args).as_slice()
}

fn text(s: &ngx_str_t) -> &str {
    // Directive arguments that are not UTF-8 can only be invalid values; "" never matches.
    core::str::from_utf8(s.as_bytes()).unwrap_or("\u{fffd}")
}

/// Logs `invalid <what> "<value>" in "<directive>" directive` and fails the configuration.
unsafe fn invalid(cf: *mut ngx_conf_t, what: &str, value: &str) -> *mut c_char {
    invalid_because(cf, what, value, "")
}

/// [`invalid`], followed by `hint`: what to write instead.
unsafe fn invalid_because(cf: *mut ngx_conf_t, what: &str, value: &str, hint: &str) -> *mut c_char {
    let directive = text(&args(cf)[0]);
    ngx_conf_log_error!(
        NGX_LOG_EMERG,
        cf,
        "invalid {what} \"{value}\" in \"{directive}\" directive{hint}"
    );
    NGX_CONF_ERROR as _
}

/// The parameter names of `ratelimit_redis` (TLS aside), for naming a lone word in errors.
const REDIS_PARAMS: [&str; 14] = [
    "pool_size",
    "timeout",
    "connect_timeout",
    "keepalive_timeout",
    "fail_threshold",
    "fail_backoff",
    "prefix",
    "cluster",
    "user",
    "password",
    "db",
    "sentinel",
    "sentinel_user",
    "sentinel_password",
];
fn is_redis_param(word: &str) -> bool {
    word == "ssl" || REDIS_PARAMS.contains(&word) || TLS_PARAM_NAMES.contains(&word)
}

/// Logs `invalid parameter <arg> in "<directive>" directive`, with what to write instead when
/// it is a `limit_req` habit. `ratelimit_redis` takes secrets, so there the parameter is named
/// without its value ([`unknown_param`]); `position` counts the directive's arguments from 1.
unsafe fn unknown(cf: *mut ngx_conf_t, arg: &str, position: usize) -> *mut c_char {
    let directive = text(&args(cf)[0]);
    let shown = match directive {
        "ratelimit_redis" => unknown_param(arg, position, is_redis_param),
        _ if split_param(arg).is_some() => format!("\"{arg}\""),
        _ => format!("\"{arg}\" (not name=value)"),
    };
    let hint = match limit_req_hint(directive, arg) {
        Some(hint) => hint,
        None if directive == "ratelimit_zone" && Algorithm::parse(arg).is_some() => {
            format!(": write \"algorithm={arg}\"")
        }
        None => String::new(),
    };
    ngx_conf_log_error!(
        NGX_LOG_EMERG,
        cf,
        "invalid parameter {shown} in \"{directive}\" directive{hint}"
    );
    NGX_CONF_ERROR as _
}

unsafe extern "C" fn cmd_redis(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    let mcf = &mut *(conf as *mut MainConf);
    if mcf.redis.is_some() {
        return IS_DUPLICATE;
    }
    let args = args(cf);
    // Addresses first (seeds of a Cluster, sentinels), then `name=value` parameters.
    let addrs = args[1..].iter().take_while(|a| split_param(text(a)).is_none()).count();
    if addrs == 0 {
        let shown = unknown_param(text(&args[1]), 1, is_redis_param);
        ngx_conf_log_error!(
            NGX_LOG_EMERG,
            cf,
            "no address before {shown} in \"ratelimit_redis\" directive"
        );
        return NGX_CONF_ERROR as _;
    }
    let mut seeds = Vec::with_capacity(addrs);
    for arg in &args[1..=addrs] {
        match parse_address(cf, arg) {
            Some(seed) => seeds.push(seed),
            None => return NGX_CONF_ERROR as _,
        }
    }
    let first = &seeds[0];
    let mut redis = RedisConf {
        sockaddr: first.sockaddr,
        socklen: first.socklen,
        name: first.name.clone(),
        is_unix: first.is_unix,
        seeds: Vec::new(),
        cluster: false,
        pool_size: 4,
        timeout: 200,
        connect_timeout: 0,
        keepalive_timeout: 60_000,
        prefix: b"rl:".to_vec(),
        auth: None,
        select: None,
        sentinel: None,
        fail_threshold: 3,
        fail_backoff: 1000,
        tls: None,
    };
    redis.seeds = seeds;
    let mut tls_params = TlsParams::default();
    let mut connect_timeout = None;
    let (mut user, mut password) = (None, None);
    let mut sentinel = SentinelParams::default();
    for (i, arg) in args.iter().enumerate().skip(1 + addrs) {
        let s = text(arg);
        let Some((name, value)) = split_param(s) else { return unknown(cf, s, i) };
        match sentinel.parse(name, value) {
            Some(Ok(Some(()))) => continue,
            Some(Ok(None)) => return invalid_because(cf, "value", s, redis_range(name)),
            Some(Err(())) => return invalid(cf, "empty parameter", name),
            None => {}
        }
        let ok = match name {
            "pool_size" => parse_uint(value, 1, 4096).map(|n| redis.pool_size = n as usize),
            "timeout" => parse_msec(value).filter(|&t| t > 0).map(|t| redis.timeout = t as _),
            "connect_timeout" => {
                parse_msec(value).filter(|&t| t > 0).map(|t| connect_timeout = Some(t as _))
            }
            "keepalive_timeout" => parse_msec(value).map(|t| redis.keepalive_timeout = t as _),
            "fail_threshold" => {
                parse_uint(value, 1, 1_000_000).map(|n| redis.fail_threshold = n as u32)
            }
            "fail_backoff" => {
                parse_msec(value).filter(|&t| t > 0).map(|t| redis.fail_backoff = t as _)
            }
            "prefix" => {
                redis.prefix = value.as_bytes().to_vec();
                Some(())
            }
            "cluster" => parse_switch(value).map(|on| redis.cluster = on),
            "user" if !value.is_empty() => {
                user = Some(value);
                Some(())
            }
            "password" if !value.is_empty() => {
                password = Some(value);
                Some(())
            }
            // The value is a secret: name the parameter, never echo it.
            "user" | "password" => return invalid(cf, "empty parameter", name),
            _ => match tls_params.param(name, value) {
                Taken::Yes => Some(()),
                Taken::NotTls => return unknown(cf, s, i),
                Taken::Invalid => None,
            },
        };
        if ok.is_none() {
            return invalid_because(cf, "value", s, redis_range(name));
        }
    }
    match (user, password) {
        (_, Some(password)) => redis.auth = Some(resp::auth_command(user, password)),
        (Some(_), None) => {
            ngx_conf_log_error!(
                NGX_LOG_EMERG,
                cf,
                "\"user=\" of the \"ratelimit_redis\" directive needs \"password=\""
            );
            return NGX_CONF_ERROR as _;
        }
        (None, None) => {}
    }
    if let Err(e) = sentinel.finish(cf, &mut redis) {
        return e;
    }
    if let Some(why) = topology_error(&redis) {
        ngx_conf_log_error!(NGX_LOG_EMERG, cf, "\"ratelimit_redis\" {why}");
        return NGX_CONF_ERROR as _;
    }
    match tls::configure(cf, &tls_params, &redis.name, redis.is_unix) {
        Ok(t) => redis.tls = t,
        Err(tls::Logged) => return NGX_CONF_ERROR as _,
    }
    // The whole decision must fit in `timeout`, so connecting can never take longer.
    redis.connect_timeout = connect_timeout.unwrap_or(redis.timeout).min(redis.timeout);
    mcf.redis = Some(redis);
    NGX_CONF_OK
}

/// The range of a number parameter of `ratelimit_redis`, for its error.
fn redis_range(name: &str) -> &'static str {
    match name {
        "db" => {
            ", it must be 0..65535 (Redis itself has 16 databases, 0..15, unless its \
             \"databases\" says more)"
        }
        "pool_size" => ", it must be 1..4096",
        "fail_threshold" => ", it must be 1..1000000",
        _ => "",
    }
}

/// What is wrong with the addresses and the mode asked, if anything.
fn topology_error(redis: &RedisConf) -> Option<String> {
    let unix = redis.seeds.iter().find(|s| s.is_unix).map(|s| s.name.as_str());
    let sentinel = redis.sentinel.is_some();
    match (redis.cluster, unix) {
        (true, _) if sentinel => Some("cannot use \"sentinel=\" with \"cluster=on\"".into()),
        (true, _) if redis.select.is_some() => {
            Some("cannot use \"db=\" with \"cluster=on\": a cluster has one database".into())
        }
        (true, Some(addr)) => Some(format!("cannot use \"{addr}\" with \"cluster=on\"")),
        (false, _) if redis.seeds.len() > 1 && !sentinel => Some(format!(
            "has {} addresses: several need \"cluster=on\" or \"sentinel=\"",
            redis.seeds.len()
        )),
        _ => None,
    }
}

/// `db=` and Sentinel mode's parameters of `ratelimit_redis`.
#[derive(Default)]
struct SentinelParams<'a> {
    db: Option<u64>,
    name: Option<&'a str>,
    user: Option<&'a str>,
    password: Option<&'a str>,
}

impl<'a> SentinelParams<'a> {
    /// `None` for a parameter not of this group; `Some(Err(()))` for an empty secret, which
    /// must be named, never echoed; `Some(Ok(None))` for a bad value.
    fn parse(&mut self, name: &str, value: &'a str) -> Option<Result<Option<()>, ()>> {
        let ok = match name {
            // Redis' own limit (`databases`, 16 by default) is checked by `SELECT` itself.
            "db" => parse_uint(value, 0, 65535).map(|n| self.db = Some(n)),
            "sentinel" => (!value.is_empty()).then(|| self.name = Some(value)),
            "sentinel_user" | "sentinel_password" if value.is_empty() => return Some(Err(())),
            "sentinel_user" => {
                self.user = Some(value);
                Some(())
            }
            "sentinel_password" => {
                self.password = Some(value);
                Some(())
            }
            _ => return None,
        };
        Some(Ok(ok))
    }

    unsafe fn finish(self, cf: *mut ngx_conf_t, redis: &mut RedisConf) -> Result<(), *mut c_char> {
        let fail = |msg: &str| {
            ngx_conf_log_error!(NGX_LOG_EMERG, cf, "{msg} of the \"ratelimit_redis\" directive");
            NGX_CONF_ERROR as *mut c_char
        };
        if let Some(db) = self.db {
            redis.select = Some(resp::command(&[b"SELECT", db.to_string().as_bytes()]));
        }
        let Some(name) = self.name else {
            return match (self.user, self.password) {
                (None, None) => Ok(()),
                _ => Err(fail("\"sentinel_user=\" and \"sentinel_password=\" need \"sentinel=\"")),
            };
        };
        if redis.seeds.iter().any(|s| s.is_unix) {
            return Err(fail("\"sentinel=\" takes sentinels' host:port, not unix: sockets"));
        }
        let auth = match (self.user, self.password) {
            (user, Some(password)) => Some(resp::auth_command(user, password)),
            (Some(_), None) => {
                return Err(fail("\"sentinel_user=\" needs \"sentinel_password=\""));
            }
            (None, None) => None,
        };
        redis.sentinel = Some(SentinelConf { name: name.to_owned(), auth });
        Ok(())
    }
}

/// One address of `ratelimit_redis`, resolved now: the worker never waits for DNS.
unsafe fn parse_address(cf: *mut ngx_conf_t, arg: &ngx_str_t) -> Option<SeedAddr> {
    let written = text(arg);
    if written.contains('@') && !written.starts_with("unix:") {
        // `user:password@host:port`, as in a Redis URL: nginx would blame the port.
        let addr = shown_address(written);
        ngx_conf_log_error!(
            NGX_LOG_EMERG,
            cf,
            "credentials in the address \"{addr}\" of the \"ratelimit_redis\" directive: \
             write the address alone, and the credentials as \"user=\" and \"password=\""
        );
        return None;
    }
    let mut url: ngx_url_t = core::mem::zeroed();
    url.url = *arg;
    url.default_port = 6379;
    if ngx_parse_url((*cf).pool, &mut url) != 0 || url.naddrs == 0 {
        let reason = if url.err.is_null() {
            "host not found"
        } else {
            core::ffi::CStr::from_ptr(url.err).to_str().unwrap_or("invalid address")
        };
        let addr = shown_address(text(arg));
        ngx_conf_log_error!(
            NGX_LOG_EMERG,
            cf,
            "{reason} in \"{addr}\" of the \"ratelimit_redis\" directive"
        );
        return None;
    }
    let addr = &*url.addrs;
    Some(SeedAddr {
        sockaddr: addr.sockaddr,
        socklen: addr.socklen,
        name: text(arg).to_owned(),
        is_unix: url.family == AF_UNIX as i32,
    })
}

unsafe extern "C" fn cmd_zone(
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
    let mut member = None;
    let (mut lease, mut lease_time, mut lease_time_text) = (None, None, "");
    for (i, arg) in args.iter().enumerate().skip(2) {
        let s = text(arg);
        let Some((param, value)) = split_param(s) else { return unknown(cf, s, i) };
        let ok = match param {
            "key" => compile_complex_value(cf, arg, "key=".len()).and_then(|cv| {
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
            "member" => match value {
                "request_id" => {
                    let id = ngx_str_t { len: 11, data: c"$request_id".as_ptr() as *mut u8 };
                    compile_complex_value(cf, &id, 0).map(|cv| member = Some(cv))
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
            let Some(cv) = compile_complex_value(cf, &id, 0) else { return NGX_CONF_ERROR as _ };
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
    });
    NGX_CONF_OK
}

/// The location's content: reading and writing a balance zone's credits (`crate::admin`).
unsafe extern "C" fn cmd_admin(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    let lcf = &mut *(conf as *mut LocConf);
    if lcf.admin_zone.is_some() {
        return IS_DUPLICATE;
    }
    let name = text(&args(cf)[1]);
    let (Some(mcf), Some(clcf)) =
        (RateLimit::main_conf(&*cf), NgxHttpCoreModule::location_conf_mut(&*cf))
    else {
        return NGX_CONF_ERROR as _;
    };
    let zone = mcf.zones.iter().position(|z| z.name == name);
    let (Some(zone), Some(_)) = (zone, mcf.redis.as_ref()) else {
        ngx_conf_log_error!(
            NGX_LOG_EMERG,
            cf,
            "\"ratelimit_admin\" needs \"ratelimit_redis\" and a zone \"{name}\" declared \
             before it"
        );
        return NGX_CONF_ERROR as _;
    };
    let template = &mcf.zones[zone].key_text;
    if crate::key::one_variable(template).is_none() {
        let template = String::from_utf8_lossy(template);
        ngx_conf_log_error!(
            NGX_LOG_EMERG,
            cf,
            "\"ratelimit_admin\" needs the key of zone \"{name}\" to hold exactly one \
             variable, whose value key= gives; it is \"{template}\""
        );
        return NGX_CONF_ERROR as _;
    }
    lcf.admin_zone = Some(zone);
    clcf.handler = Some(crate::admin::content_handler);
    NGX_CONF_OK
}

/// Logs `"ratelimit_zone" directive "<name>": <what>` and fails the configuration.
unsafe fn zone_error(cf: *mut ngx_conf_t, name: &str, what: &str) -> *mut c_char {
    ngx_conf_log_error!(NGX_LOG_EMERG, cf, "\"ratelimit_zone\" directive \"{name}\": {what}");
    NGX_CONF_ERROR as _
}

/// `name=123` parsed now, or `name=$variable` compiled to be evaluated and parsed per request.
unsafe fn number_or_variable(
    cf: *mut ngx_conf_t,
    arg: &ngx_str_t,
    name: &str,
    parse: fn(&str) -> Option<u64>,
) -> Option<Param> {
    let value = &text(arg)[name.len() + 1..];
    if value.contains('$') {
        compile_complex_value(cf, arg, name.len() + 1).map(Param::Var)
    } else {
        parse(value).map(Param::Fixed)
    }
}

/// Compiles the part of `arg` after `skip` bytes as a complex value (`$binary_remote_addr`,
/// `"$host:$arg_k"`), in the configuration pool.
/// The pieces of a key template with literal braces (`crate::key::split_braces`), each text
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
                KeyPiece::Value(compile_complex_value(cf, &s, 0)?)
            }
        });
    }
    Some(out)
}

unsafe fn compile_complex_value(
    cf: *mut ngx_conf_t,
    arg: &ngx_str_t,
    skip: usize,
) -> Option<*mut ngx_http_complex_value_t> {
    let mut value = ngx_str_t { len: arg.len - skip, data: arg.data.add(skip) };
    let cv = ngx_pcalloc((*cf).pool, size_of::<ngx_http_complex_value_t>())
        as *mut ngx_http_complex_value_t;
    if cv.is_null() {
        return None;
    }
    let mut ccv: ngx_http_compile_complex_value_t = core::mem::zeroed();
    ccv.cf = cf;
    ccv.value = &mut value;
    ccv.complex_value = cv;
    (ngx_http_compile_complex_value(&mut ccv) == 0).then_some(cv)
}

unsafe extern "C" fn cmd_ratelimit(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    let lcf = &mut *(conf as *mut LocConf);
    let args = args(cf);
    let name = text(&args[1]);
    if let Some(("zone", zone)) = split_param(name) {
        ngx_conf_log_error!(
            NGX_LOG_EMERG,
            cf,
            "invalid zone \"{name}\" in \"ratelimit\" directive: the zone is named bare, \
             write \"ratelimit {zone};\""
        );
        return NGX_CONF_ERROR as _;
    }
    let limits = lcf.limits.get_or_insert_with(Vec::new);
    // `off` stands alone at its level, and each zone is named once, as with limit_req.
    if lcf.limits_off || (name == "off" && !limits.is_empty()) {
        return IS_DUPLICATE;
    }
    if name == "off" {
        if args.len() > 2 {
            return unknown(cf, text(&args[2]), 2);
        }
        lcf.limits_off = true;
        return NGX_CONF_OK;
    }
    if limits.iter().any(|l| l.name == name) {
        return IS_DUPLICATE;
    }
    let mut cost = None;
    for (i, arg) in args.iter().enumerate().skip(2) {
        let s = text(arg);
        let parsed = match split_param(s) {
            Some(("cost", _)) if cost.is_none() => number_or_variable(cf, arg, "cost", parse_cost),
            Some(("cost", _)) => return invalid(cf, "duplicate parameter", s),
            _ => return unknown(cf, s, i),
        };
        match parsed {
            Some(p) => cost = Some(p),
            None => return invalid(cf, "value", s),
        }
    }
    let cost = cost.unwrap_or(Param::Fixed(1));
    let file = &(*(*cf).conf_file).file;
    limits.push(LimitRef {
        name: name.to_owned(),
        zone: usize::MAX,
        cost,
        file: text(&file.name).to_owned(),
        line: (*(*cf).conf_file).line,
    });
    NGX_CONF_OK
}

/// Sets a keyword-valued directive once.
unsafe fn set_keyword<T: Copy>(
    cf: *mut ngx_conf_t,
    slot: &mut Option<T>,
    table: &[(&str, T)],
) -> *mut c_char {
    if slot.is_some() {
        return IS_DUPLICATE;
    }
    let value = text(&args(cf)[1]);
    match table.iter().find(|(k, _)| *k == value) {
        Some((_, v)) => {
            *slot = Some(*v);
            NGX_CONF_OK
        }
        None => {
            let allowed: Vec<&str> = table.iter().map(|(k, _)| *k).collect();
            let directive = text(&args(cf)[0]);
            ngx_conf_log_error!(
                NGX_LOG_EMERG,
                cf,
                "invalid value \"{value}\" in \"{directive}\" directive, it must be \"{}\"",
                allowed.join("\" or \"")
            );
            NGX_CONF_ERROR as _
        }
    }
}

unsafe extern "C" fn cmd_fail(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    let lcf = &mut *(conf as *mut LocConf);
    let table =
        [("open", FailPolicy::Open), ("closed", FailPolicy::Closed), ("local", FailPolicy::Local)];
    set_keyword(cf, &mut lcf.fail, &table)
}

unsafe extern "C" fn cmd_headers(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    let lcf = &mut *(conf as *mut LocConf);
    let table =
        [("legacy", HeaderMode::Legacy), ("draft", HeaderMode::Draft), ("off", HeaderMode::Off)];
    set_keyword(cf, &mut lcf.headers, &table)
}

unsafe extern "C" fn cmd_log_level(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    let lcf = &mut *(conf as *mut LocConf);
    let table = [
        ("info", NGX_LOG_INFO as ngx_uint_t),
        ("notice", NGX_LOG_NOTICE as ngx_uint_t),
        ("warn", NGX_LOG_WARN as ngx_uint_t),
        ("error", NGX_LOG_ERR as ngx_uint_t),
    ];
    set_keyword(cf, &mut lcf.log_level, &table)
}

unsafe extern "C" fn cmd_status(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    let lcf = &mut *(conf as *mut LocConf);
    set_number(cf, &mut lcf.status, 400, 599)
}

/// Sets a number directive once, within `min..=max`.
unsafe fn set_number(
    cf: *mut ngx_conf_t,
    slot: &mut Option<u64>,
    min: u64,
    max: u64,
) -> *mut c_char {
    if slot.is_some() {
        return IS_DUPLICATE;
    }
    let value = text(&args(cf)[1]);
    match parse_uint(value, min, max) {
        Some(n) => {
            *slot = Some(n);
            NGX_CONF_OK
        }
        None => {
            let directive = text(&args(cf)[0]);
            ngx_conf_log_error!(
                NGX_LOG_EMERG,
                cf,
                "invalid value \"{value}\" in \"{directive}\" directive, it must be {min}..{max}"
            );
            NGX_CONF_ERROR as _
        }
    }
}

unsafe extern "C" fn cmd_deny_cache(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    let lcf = &mut *(conf as *mut LocConf);
    set_keyword(cf, &mut lcf.deny_cache, &[("on", true), ("off", false)])
}

unsafe extern "C" fn cmd_dry_run(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    let lcf = &mut *(conf as *mut LocConf);
    set_keyword(cf, &mut lcf.dry_run, &[("on", true), ("off", false)])
}

unsafe extern "C" fn cmd_fail_local_share(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    let lcf = &mut *(conf as *mut LocConf);
    set_number(cf, &mut lcf.fail_local_share, 1, 1_000_000)
}

unsafe extern "C" fn cmd_fail_local_size(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    let mcf = &mut *(conf as *mut MainConf);
    if mcf.local_size.is_some() {
        return IS_DUPLICATE;
    }
    let value = text(&args(cf)[1]);
    // Below 16k the table holds too few keys to be of use; above 1g it is surely a typo.
    match parse_size(value).filter(|n| (16 << 10..=1 << 30).contains(n)) {
        Some(n) => {
            mcf.local_size = Some(n);
            NGX_CONF_OK
        }
        None => invalid(cf, "size (16k..1g)", value),
    }
}

unsafe extern "C" fn cmd_metrics_zone(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    let mcf = &mut *(conf as *mut MainConf);
    if mcf.metrics_size.is_some() {
        return IS_DUPLICATE;
    }
    let value = text(&args(cf)[1]);
    // nginx's slab allocator needs 8 pages; the counters of a thousand zones fit in 128k.
    match parse_size(value).filter(|n| (32 << 10..=1 << 30).contains(n)) {
        Some(n) if metrics::shm::add(cf, mcf, n as usize) => {
            mcf.metrics_size = Some(n);
            NGX_CONF_OK
        }
        Some(_) => NGX_CONF_ERROR as _,
        None => invalid(cf, "size (32k..1g)", value),
    }
}

/// Makes this location answer the metrics, as `stub_status` does.
unsafe extern "C" fn cmd_metrics(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    let (Some(clcf), Some(mcf)) =
        (NgxHttpCoreModule::location_conf_mut(&*cf), RateLimit::main_conf_mut(&*cf))
    else {
        return NGX_CONF_ERROR as _;
    };
    clcf.handler = Some(metrics::page::handler);
    if mcf.metrics_used.is_none() {
        let file = &(*(*cf).conf_file).file;
        mcf.metrics_used = Some((text(&file.name).to_owned(), (*(*cf).conf_file).line));
    }
    NGX_CONF_OK
}

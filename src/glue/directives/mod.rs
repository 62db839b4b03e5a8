//! The directive table and the handlers of the directives that set one value; `ratelimit_redis`
//! ([`redis`]) and `ratelimit_zone` ([`zone`]) have files of their own. Values are parsed by
//! `crate::codec::values` and `crate::decide::params`; errors name the directive and the bad
//! value, and nginx appends the file and line.

use core::ffi::{c_char, c_void};
use core::ptr;

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_str_t, ngx_uint_t, NGX_CONF_1MORE, NGX_CONF_FLAG,
    NGX_CONF_NOARGS, NGX_CONF_TAKE1, NGX_HTTP_LOC_CONF, NGX_HTTP_LOC_CONF_OFFSET,
    NGX_HTTP_MAIN_CONF, NGX_HTTP_MAIN_CONF_OFFSET, NGX_HTTP_SRV_CONF, NGX_LOG_EMERG, NGX_LOG_ERR,
    NGX_LOG_INFO, NGX_LOG_NOTICE, NGX_LOG_WARN,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule};
use ngx::{ngx_conf_log_error, ngx_string};

use crate::codec::values::{one_variable, parse_size, parse_uint, split_param, unknown_param};
use crate::decide::headers::HeaderMode;
use crate::decide::params::{limit_req_hint, parse_cost, parse_delay};
use crate::decide::script::Algorithm;
use crate::glue::conf::{FailPolicy, LimitRef, LocConf, MainConf, Param};
use crate::glue::module::RateLimit;
use crate::glue::value::Value;
use crate::glue::{metrics_page, metrics_zone};
use crate::redis::conf::is_param as is_redis_param;

mod redis;
mod zone;

use redis::cmd_redis;
use zone::cmd_zone;

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

/// The location's content: reading and writing a balance zone's credits (`crate::glue::admin`).
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
    let (Some(zone), false) = (zone, mcf.backends.is_empty()) else {
        ngx_conf_log_error!(
            NGX_LOG_EMERG,
            cf,
            "\"ratelimit_admin\" needs \"ratelimit_redis\" and a zone \"{name}\" declared \
             before it"
        );
        return NGX_CONF_ERROR as _;
    };
    let template = &mcf.zones[zone].key_text;
    if one_variable(template).is_none() {
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
    clcf.handler = Some(crate::glue::admin::content_handler);
    NGX_CONF_OK
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
        Value::compile(cf, arg, name.len() + 1).map(Param::Var)
    } else {
        parse(value).map(Param::Fixed)
    }
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
    let (mut cost, mut delay_ms, mut settle) = (None, None, None);
    for (i, arg) in args.iter().enumerate().skip(2) {
        let s = text(arg);
        match split_param(s) {
            Some(("cost", _)) if cost.is_none() => {
                match number_or_variable(cf, arg, "cost", parse_cost) {
                    Some(p) => cost = Some(p),
                    None => return invalid(cf, "value", s),
                }
            }
            Some(("delay", value)) if delay_ms.is_none() => match parse_delay(value) {
                Ok(ms) => delay_ms = Some(ms),
                Err(hint) => {
                    ngx_conf_log_error!(
                        NGX_LOG_EMERG,
                        cf,
                        "invalid value \"{s}\" in \"ratelimit\" directive: {hint}"
                    );
                    return NGX_CONF_ERROR as _;
                }
            },
            Some(("settle", value)) if settle.is_none() => {
                match (!value.is_empty()).then(|| Value::compile(cf, arg, "settle=".len())) {
                    Some(Some(cv)) => settle = Some(cv),
                    _ => return invalid(cf, "value", s),
                }
            }
            Some(("cost" | "delay" | "settle", _)) => return invalid(cf, "duplicate parameter", s),
            _ => return unknown(cf, s, i),
        }
    }
    let cost = cost.unwrap_or(Param::Fixed(1));
    if delay_ms.is_some_and(|ms| ms > 0) {
        let Some(mcf) = RateLimit::main_conf(&*cf) else { return NGX_CONF_ERROR as _ };
        mcf.delayed_zones.borrow_mut().push(name.to_owned());
    }
    let file = &(*(*cf).conf_file).file;
    limits.push(LimitRef {
        name: name.to_owned(),
        zone: usize::MAX,
        cost,
        delay_ms: delay_ms.unwrap_or(0),
        settle,
        figures: None,
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
        Some(n) if metrics_zone::add(cf, mcf, n as usize) => {
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
    clcf.handler = Some(metrics_page::handler);
    if mcf.metrics_used.is_none() {
        let file = &(*(*cf).conf_file).file;
        mcf.metrics_used = Some((text(&file.name).to_owned(), (*(*cf).conf_file).line));
    }
    NGX_CONF_OK
}

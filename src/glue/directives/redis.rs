//! `ratelimit_redis`: its addresses, resolved with nginx's parser now (the worker never waits
//! for DNS), and its parameters, which `crate::redis::conf` reads and checks; the TLS context
//! made from them. Errors are worded here, as nginx words its own.

use core::cell::Cell;
use core::ffi::{c_char, c_void};
use core::ptr;

use ngx::core::{NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_parse_url, ngx_str_t, ngx_url_t, AF_UNIX, NGX_LOG_EMERG,
};
use ngx::ngx_conf_log_error;

use super::{args, invalid, invalid_because, text, unknown, IS_DUPLICATE};
use crate::codec::values::{split_param, unknown_param};
use crate::decide::params::shown_address;
use crate::decide::script;
use crate::glue::conf::{Backend, MainConf};
use crate::redis::conf::{self as redis_conf, Builder, ParamError, SeedAddr};
use crate::redis::tls;

pub(super) unsafe extern "C" fn cmd_redis(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    let mcf = &mut *(conf as *mut MainConf);
    let args = args(cf);
    // Addresses first (seeds of a Cluster, sentinels), then `name=value` parameters.
    let addrs = args[1..].iter().take_while(|a| split_param(text(a)).is_none()).count();
    if addrs == 0 {
        let shown = unknown_param(text(&args[1]), 1, redis_conf::is_param);
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
    let mut redis = Builder::new(seeds, script::script());
    for (i, arg) in args.iter().enumerate().skip(1 + addrs) {
        let s = text(arg);
        let Some((name, value)) = split_param(s) else { return unknown(cf, s, i) };
        match redis.param(name, value) {
            Ok(()) => {}
            Err(ParamError::Unknown) => return unknown(cf, s, i),
            Err(ParamError::Invalid(range)) => return invalid_because(cf, "value", s, range),
            Err(ParamError::Empty) => return invalid(cf, "empty parameter", name),
        }
    }
    let (mut redis, tls_params) = match redis.finish() {
        Ok(done) => done,
        Err(msg) => {
            ngx_conf_log_error!(NGX_LOG_EMERG, cf, "{msg}");
            return NGX_CONF_ERROR as _;
        }
    };
    match tls::configure(cf, &tls_params, &redis.name, redis.is_unix) {
        Ok(t) => redis.tls = t,
        Err(tls::Logged) => return NGX_CONF_ERROR as _,
    }
    if let Some(first) = mcf.backends.iter().find(|b| b.redis.backend == redis.backend) {
        if redis.backend.is_empty() {
            return IS_DUPLICATE;
        }
        let (file, line) = &first.at;
        ngx_conf_log_error!(
            NGX_LOG_EMERG,
            cf,
            "\"ratelimit_redis\" name=\"{}\" is declared twice, first in {file}:{line}; give \
             each backend a name of its own",
            redis.backend
        );
        return NGX_CONF_ERROR as _;
    }
    let at = (text(&(*(*cf).conf_file).file.name).to_owned(), (*(*cf).conf_file).line);
    mcf.backends.push(Backend { redis, pool: Cell::new(ptr::null_mut()), at });
    NGX_CONF_OK
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

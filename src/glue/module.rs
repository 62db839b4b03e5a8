//! Module registration: the nginx module tables, the access-phase hook and the worker hooks.

use core::ffi::{c_char, c_void};
use core::ptr::{addr_of, addr_of_mut};

use ngx::core::{Status, NGX_CONF_ERROR};
use ngx::ffi::{
    ngx_array_push, ngx_conf_t, ngx_cycle_t, ngx_http_handler_pt, ngx_http_module_t,
    ngx_http_phases_NGX_HTTP_ACCESS_PHASE, ngx_int_t, ngx_module_t, NGX_HTTP_MODULE, NGX_LOG_EMERG,
};
use ngx::http::{HttpModule, HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule};
use ngx::ngx_log_error;

use crate::decide::script;
use crate::glue::conf::{merge_loc_conf, LocConf, MainConf, Param};
use crate::glue::{auth_target, directives, handler, settle, variables};
use crate::redis::pool::WorkerPool;

pub struct RateLimit;

impl HttpModule for RateLimit {
    fn module() -> &'static ngx_module_t {
        // SAFETY: nginx writes the module's indexes once, before any worker runs.
        unsafe { &*addr_of!(ngx_http_ratelimit_module) }
    }

    unsafe extern "C" fn preconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
        variables::register(cf)
    }

    unsafe extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
        let Some(cmcf) = NgxHttpCoreModule::main_conf_mut(&*cf) else {
            return Status::NGX_ERROR.into();
        };
        // Access-phase handlers run in reverse order of registration, and dynamic modules
        // register after the built-in ones: this handler runs before allow/deny, auth_basic and
        // auth_request (docs/access-phase.md).
        let handlers = &mut cmcf.phases[ngx_http_phases_NGX_HTTP_ACCESS_PHASE as usize].handlers;
        let h = ngx_array_push(handlers) as *mut ngx_http_handler_pt;
        if h.is_null() {
            return Status::NGX_ERROR.into();
        }
        *h = Some(handler::access_handler);
        // Locations are merged by now: whether any line settles is known.
        let settling = RateLimit::main_conf(&*cf).is_some_and(|m| m.settling.get());
        if settling && settle::register(cmcf) != Status::NGX_OK.into() {
            return Status::NGX_ERROR.into();
        }
        auth_target::warn(cf, cmcf);
        Status::NGX_OK.into()
    }
}

unsafe impl HttpModuleMainConf for RateLimit {
    type MainConf = MainConf;
}

unsafe impl HttpModuleLocationConf for RateLimit {
    type LocationConf = LocConf;
}

unsafe extern "C" fn init_main_conf(cf: *mut ngx_conf_t, conf: *mut c_void) -> *mut c_char {
    // Hash the script once, in the master: every worker inherits it.
    script::script();
    let mcf = &mut *(conf as *mut MainConf);
    if let (Some((file, line)), None) = (&mcf.metrics_used, mcf.metrics_size) {
        ngx_log_error!(
            NGX_LOG_EMERG,
            (*cf).log,
            "\"ratelimit_metrics\" needs \"ratelimit_metrics_zone\" in {file}:{line}"
        );
        return NGX_CONF_ERROR as _;
    }
    // Zones find their backends, declared before or after them.
    for z in mcf.zones.iter_mut() {
        let name = z.redis_name.as_deref().unwrap_or("");
        match mcf.backends.iter().position(|b| b.redis.backend == name) {
            Some(b) => z.backend = b,
            // A zone no line uses needs no backend: `merge_loc_conf` says so of one that is used.
            None if z.redis_name.is_none() => {}
            None => {
                let (file, line) = &z.at;
                ngx_log_error!(
                    NGX_LOG_EMERG,
                    (*cf).log,
                    "\"ratelimit_zone\" directive \"{}\": unknown \"redis={name}\": no \
                     \"ratelimit_redis\" has \"name={name}\" in {file}:{line}",
                    z.name
                );
                return NGX_CONF_ERROR as _;
            }
        }
    }
    // A slot must outlive a renewal that times out, and the next one: checked once both
    // `ratelimit_redis` and the zones are read, whatever their order.
    for z in mcf.zones.iter_mut().filter(|z| z.concurrency()) {
        let timeout = mcf.backends.get(z.backend).map_or(0, |b| b.redis.timeout as u64);
        let least = crate::decide::slots::min_life_for(timeout);
        // No lease_time=: the default, or longer if the timeout asks for it.
        if let Param::Fixed(0) = z.window {
            z.window = Param::Fixed(crate::decide::slots::DEFAULT_SLOT_MS.max(least));
        }
        let (Param::Fixed(life), (file, line)) = (z.window, &z.at) else { continue };
        if life < least {
            ngx_log_error!(
                NGX_LOG_EMERG,
                (*cf).log,
                "\"ratelimit_zone\" directive \"{}\": \"lease_time={life}ms\" is too short for \
                 \"timeout={timeout}ms\" of \"ratelimit_redis\": a slot is renewed every third of \
                 its life and a renewal may take the whole timeout, use {least}ms or more in \
                 {file}:{line}",
                z.name
            );
            return NGX_CONF_ERROR as _;
        }
    }
    core::ptr::null_mut()
}

static NGX_HTTP_RATELIMIT_MODULE_CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: Some(RateLimit::preconfiguration),
    postconfiguration: Some(RateLimit::postconfiguration),
    create_main_conf: Some(RateLimit::create_main_conf),
    init_main_conf: Some(init_main_conf),
    create_srv_conf: None,
    merge_srv_conf: None,
    create_loc_conf: Some(RateLimit::create_loc_conf),
    merge_loc_conf: Some(merge_loc_conf),
};

#[cfg(feature = "export-modules")]
ngx::ngx_modules!(ngx_http_ratelimit_module);

#[used]
#[allow(non_upper_case_globals)]
#[cfg_attr(not(feature = "export-modules"), no_mangle)]
pub static mut ngx_http_ratelimit_module: ngx_module_t = ngx_module_t {
    ctx: addr_of!(NGX_HTTP_RATELIMIT_MODULE_CTX) as _,
    commands: unsafe { addr_of_mut!(directives::COMMANDS[0]) },
    type_: NGX_HTTP_MODULE as _,
    init_process: Some(init_process),
    exit_process: Some(exit_process),
    ..ngx_module_t::default()
};

/// In Sentinel mode, asks the sentinels as soon as the worker starts: until one has named the
/// primary, decisions follow `ratelimit_fail`, so the first requests should not have to wait
/// for it. (A single server needs nothing ahead: its first connection opens with the first
/// decision.)
unsafe extern "C" fn init_process(cycle: *mut ngx_cycle_t) -> ngx_int_t {
    if let Some(mcf) = RateLimit::main_conf(&*cycle) {
        for (b, backend) in mcf.backends.iter().enumerate() {
            if backend.redis.sentinel.is_some() {
                mcf.pool(b);
            }
        }
    }
    Status::NGX_OK.into()
}

/// Closes this worker's Redis connections before nginx looks for sockets left open, so a
/// graceful exit or reload logs no "open socket left" alert.
unsafe extern "C" fn exit_process(cycle: *mut ngx_cycle_t) {
    if let Some(mcf) = RateLimit::main_conf(&*cycle) {
        for backend in &mcf.backends {
            WorkerPool::destroy(&backend.pool);
        }
        crate::glue::giveback::exit();
        // The gauge sums the workers' caches: this one's entries go with it.
        let entries = mcf.deny_cache.borrow().as_ref().map_or(0, |c| c.len());
        mcf.metrics.get().deny_cache_entries(-(entries as i64));
    }
}

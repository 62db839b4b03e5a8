//! `nginx -t` warns where a `ratelimit` line can never run because its location is the target
//! of an `auth_request` in the same server: subrequests skip the access phase, so the line
//! neither counts nor rejects those requests (docs/openresty.md, surprise 3). A location reached
//! only as some other subrequest (`ngx.location.capture`, SSI) cannot be known from the
//! configuration and is not warned about.
//!
//! The `auth_request` URI lives in that module's location configuration, `{ ngx_str_t uri;
//! ngx_array_t *vars; }` since nginx 1.5.4; its first field is read, and only when a module of
//! that name is present.

use core::ffi::{c_void, CStr};

use ngx::ffi::{
    ngx_conf_t, ngx_http_core_loc_conf_t, ngx_http_core_main_conf_t, ngx_http_core_module,
    ngx_http_core_srv_conf_t, ngx_http_location_tree_node_t, ngx_str_t, ngx_uint_t, NGX_LOG_WARN,
};
use ngx::http::HttpModule;
use ngx::ngx_log_error;

use crate::glue::conf::{LimitRef, LocConf};
use crate::glue::module::RateLimit;

/// Called from postconfiguration, when every server's locations are merged and in their trees.
pub unsafe fn warn(cf: *mut ngx_conf_t, cmcf: &ngx_http_core_main_conf_t) {
    let Some(auth_index) = module_ctx_index((*cf).cycle, c"ngx_http_auth_request_module") else {
        return;
    };
    let own_index = RateLimit::module().ctx_index;
    let core_index = ngx_http_core_module.ctx_index;
    let servers = cmcf.servers.elts as *const *mut ngx_http_core_srv_conf_t;
    for s in 0..cmcf.servers.nelts {
        let cscf = *servers.add(s);
        // The server level's clcf has no loc_conf of its own: its configurations are the ctx's.
        let srv_conf = (*(*cscf).ctx).loc_conf;
        let srv_clcf = *srv_conf.add(core_index) as *mut ngx_http_core_loc_conf_t;
        let mut locs = Vec::new();
        collect(srv_clcf, srv_conf, &[], own_index, &mut locs);
        let named = (*cscf).named_locations;
        if !named.is_null() {
            let mut i = 0;
            while !(*named.add(i)).is_null() {
                collect(*named.add(i), (**named.add(i)).loc_conf, &[], own_index, &mut locs);
                i += 1;
            }
        }
        // Each auth_request's URI (without its arguments), with the location it is set in.
        let mut auths: Vec<(&[u8], &[u8])> = Vec::new();
        for from in &locs {
            let uri = bytes(&*(*from.loc_conf.add(auth_index) as *const ngx_str_t));
            if !uri.is_empty() {
                let path = uri.split(|&c| c == b'?').next().unwrap_or(uri);
                auths.push((path, bytes(&(*from.clcf).name)));
            }
        }
        for to in locs.iter().filter(|t| !t.own_limits.is_empty()) {
            let name = bytes(&(*to.clcf).name);
            let from: Vec<String> = auths
                .iter()
                .filter(|(path, _)| *path == name)
                .map(|(_, f)| match *f {
                    b"" => "the server".to_string(),
                    f => format!("\"{}\"", String::from_utf8_lossy(f)),
                })
                .collect();
            if from.is_empty() {
                continue;
            }
            // An auth_request at server level is inherited by every location: name a few.
            let mut sources = from.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
            if from.len() > 3 {
                sources.push_str(&format!(" and {} more", from.len() - 3));
            }
            for limit in &to.own_limits {
                ngx_log_error!(
                    NGX_LOG_WARN,
                    (*cf).log,
                    "ratelimit \"{}\" in location \"{}\" never applies to the auth_request \
                     subrequests of {} (subrequests are not limited: limit the requests that \
                     make them), in {}:{}",
                    limit.name,
                    String::from_utf8_lossy(name),
                    sources,
                    limit.file,
                    limit.line
                );
            }
        }
    }
}

struct Loc {
    clcf: *mut ngx_http_core_loc_conf_t,
    loc_conf: *mut *mut c_void,
    /// The `ratelimit` lines written in this location, not inherited from the enclosing one.
    own_limits: Vec<LimitRef>,
}

unsafe fn collect(
    clcf: *mut ngx_http_core_loc_conf_t,
    loc_conf: *mut *mut c_void,
    outer: &[LimitRef],
    own_index: ngx_uint_t,
    out: &mut Vec<Loc>,
) {
    if clcf.is_null() || loc_conf.is_null() || out.iter().any(|l| l.clcf == clcf) {
        return;
    }
    let lc = &*(*loc_conf.add(own_index) as *const LocConf);
    let limits = lc.limits();
    let own_limits = limits
        .iter()
        .filter(|l| !outer.iter().any(|o| o.file == l.file && o.line == l.line))
        .cloned()
        .collect();
    out.push(Loc { clcf, loc_conf, own_limits });
    walk_tree((*clcf).static_locations, limits, own_index, out);
    #[cfg(ngx_pcre)]
    {
        let regex = (*clcf).regex_locations;
        if !regex.is_null() {
            let mut i = 0;
            while !(*regex.add(i)).is_null() {
                collect(*regex.add(i), (**regex.add(i)).loc_conf, limits, own_index, out);
                i += 1;
            }
        }
    }
}

unsafe fn walk_tree(
    node: *mut ngx_http_location_tree_node_t,
    outer: &[LimitRef],
    own_index: ngx_uint_t,
    out: &mut Vec<Loc>,
) {
    if node.is_null() {
        return;
    }
    for clcf in [(*node).exact, (*node).inclusive] {
        if !clcf.is_null() {
            collect(clcf, (*clcf).loc_conf, outer, own_index, out);
        }
    }
    walk_tree((*node).left, outer, own_index, out);
    walk_tree((*node).right, outer, own_index, out);
    walk_tree((*node).tree, outer, own_index, out);
}

unsafe fn module_ctx_index(cycle: *mut ngx::ffi::ngx_cycle_t, name: &CStr) -> Option<ngx_uint_t> {
    let modules = (*cycle).modules;
    let mut i = 0;
    while !(*modules.add(i)).is_null() {
        let m = *modules.add(i);
        if !(*m).name.is_null() && CStr::from_ptr((*m).name) == name {
            return Some((*m).ctx_index);
        }
        i += 1;
    }
    None
}

unsafe fn bytes(s: &ngx_str_t) -> &[u8] {
    if s.len == 0 {
        &[]
    } else {
        core::slice::from_raw_parts(s.data, s.len)
    }
}

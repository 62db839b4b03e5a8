//! The `ratelimit_metrics` content handler: the counters of every worker, as Prometheus text or
//! (`?format=json`) JSON, like stub_status answers its own page.

use core::ptr;

use ngx::ffi::{
    ngx_buf_t, ngx_chain_t, ngx_create_temp_buf, ngx_http_arg, ngx_http_discard_request_body,
    ngx_http_output_filter, ngx_http_request_t, ngx_http_send_header, ngx_int_t, ngx_str_t,
    NGX_ERROR, NGX_HTTP_GET, NGX_HTTP_HEAD, NGX_HTTP_INTERNAL_SERVER_ERROR, NGX_HTTP_NOT_ALLOWED,
    NGX_HTTP_OK, NGX_OK,
};
use ngx::http::HttpModuleMainConf;

use crate::glue::metrics_zone;
use crate::glue::module::RateLimit;
use crate::metrics::format::{self, Labels};
use crate::metrics::View;

const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";
const JSON: &str = "application/json";

/// # Safety
/// Called by nginx's content phase with a live request.
pub unsafe extern "C" fn handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    if (*r).method & (NGX_HTTP_GET | NGX_HTTP_HEAD) as usize == 0 {
        return NGX_HTTP_NOT_ALLOWED as ngx_int_t;
    }
    let rc = ngx_http_discard_request_body(r);
    if rc != NGX_OK as ngx_int_t {
        return rc;
    }
    let Some(mcf) = RateLimit::main_conf(&*r) else {
        return NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
    };
    let mut arg = ngx_str_t { len: 0, data: ptr::null_mut() };
    let json = ngx_http_arg(r, c"format".as_ptr() as *mut u8, 6, &mut arg) == NGX_OK as ngx_int_t
        && arg.as_bytes() == b"json";
    let zones: Vec<&str> = mcf.zones.iter().map(|z| z.name.as_str()).collect();
    let backends = metrics_zone::backends(mcf);
    let labels = Labels { zones: &zones, backends: &backends };
    let body = match mcf.metrics.get().snapshot() {
        Some(cells) => {
            let view = View { cells: &cells, zones: zones.len(), backends: backends.len() };
            if json {
                format::json(&view, &labels)
            } else {
                format::prometheus(&view, &labels)
            }
        }
        None => format::disabled(json),
    };
    let content_type = if json { JSON } else { PROMETHEUS };

    let out = &mut (*r).headers_out;
    out.status = NGX_HTTP_OK as _;
    out.content_length_n = body.len() as _;
    out.content_type =
        ngx_str_t { len: content_type.len(), data: content_type.as_ptr() as *mut u8 };
    out.content_type_len = content_type.len();
    let rc = ngx_http_send_header(r);
    if rc == NGX_ERROR as ngx_int_t || rc > NGX_OK as ngx_int_t || (*r).header_only() != 0 {
        return rc;
    }
    let b: *mut ngx_buf_t = ngx_create_temp_buf((*r).pool, body.len());
    if b.is_null() {
        return NGX_ERROR as ngx_int_t;
    }
    ptr::copy_nonoverlapping(body.as_ptr(), (*b).last, body.len());
    (*b).last = (*b).last.add(body.len());
    (*b).set_last_buf(u32::from(r == (*r).main));
    (*b).set_last_in_chain(1);
    let mut chain = ngx_chain_t { buf: b, next: ptr::null_mut() };
    ngx_http_output_filter(r, &mut chain)
}

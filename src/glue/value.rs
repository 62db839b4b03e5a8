//! A directive's value that may hold variables (`key=`, `limit=$plan`, `member=`, `settle=`):
//! compiled in the configuration, evaluated per request into the request's pool.
//!
//! A value that is one variable alone, as most keys are (`$binary_remote_addr`,
//! `$http_x_api_key`), is read by the variable's index. nginx's script engine would give the
//! same bytes after sizing them in one pass and copying them in another, about 140
//! instructions more a value on every request (bench/instructions.md).

use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_conf_t, ngx_http_compile_complex_value, ngx_http_compile_complex_value_t,
    ngx_http_complex_value, ngx_http_complex_value_t, ngx_http_get_flushed_variable,
    ngx_http_get_variable_index, ngx_http_request_t, ngx_int_t, ngx_pcalloc, ngx_pnalloc,
    ngx_str_t, ngx_uint_t, NGX_ERROR,
};

use crate::codec::values::lone_variable;

/// Lives in the configuration pool, which outlives every request; copied freely.
#[derive(Clone, Copy)]
pub struct Value {
    cv: *mut ngx_http_complex_value_t,
    /// The variable's index, when the value is that variable alone.
    var: Option<ngx_uint_t>,
}

impl Value {
    /// Compiles the part of `arg` after `skip` bytes (`$binary_remote_addr`, `"$host:$arg_k"`).
    pub unsafe fn compile(cf: *mut ngx_conf_t, arg: &ngx_str_t, skip: usize) -> Option<Value> {
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
        if ngx_http_compile_complex_value(&mut ccv) != 0 {
            return None;
        }
        // Compiled by nginx first, which reported any error: the index is the one its script
        // engine would read.
        let var = lone_variable(value.as_bytes()).and_then(|name| {
            let mut name = ngx_str_t { len: name.len(), data: name.as_ptr() as *mut u8 };
            let index = ngx_http_get_variable_index(cf, &mut name);
            (index != NGX_ERROR as ngx_int_t).then_some(index as ngx_uint_t)
        });
        Some(Value { cv, var })
    }

    /// The request's value, in its pool: what `ngx_http_complex_value` gives, a variable that is
    /// not found (or fails) as an empty value; `None` when nginx cannot evaluate or allocate.
    // Inlined where a key is read, on every request: a call of its own cost about 100
    // instructions a request more (bench/instructions.py).
    #[inline(always)]
    pub unsafe fn eval(&self, r: *mut ngx_http_request_t) -> Option<ngx_str_t> {
        let Some(index) = self.var else { return self.complex(r) };
        let v = variable(r, index);
        if v.len == 0 {
            return Some(v);
        }
        // Copied, as the script engine copies it: a variable's own storage may change while
        // the request keeps its value (a cached time string, a later `set`).
        let data = ngx_pnalloc((*r).pool, v.len) as *mut u8;
        if data.is_null() {
            return None;
        }
        // SAFETY: the variable's `len` bytes, into as many just allocated.
        ptr::copy_nonoverlapping(v.data, data, v.len);
        Some(ngx_str_t { len: v.len, data })
    }

    /// The request's value for use at once (a figure, parsed right away): a lone variable's own
    /// bytes, not copied.
    pub unsafe fn peek(&self, r: *mut ngx_http_request_t) -> Option<ngx_str_t> {
        match self.var {
            Some(index) => Some(variable(r, index)),
            None => self.complex(r),
        }
    }

    unsafe fn complex(&self, r: *mut ngx_http_request_t) -> Option<ngx_str_t> {
        let mut value = ngx_str_t { len: 0, data: ptr::null_mut() };
        (ngx_http_complex_value(r, self.cv, &mut value) == 0).then_some(value)
    }
}

/// Variable `index`'s value where nginx keeps it; one not found (or failing) is empty.
#[inline(always)]
unsafe fn variable(r: *mut ngx_http_request_t, index: ngx_uint_t) -> ngx_str_t {
    let v = ngx_http_get_flushed_variable(r, index);
    if v.is_null() || (*v).not_found() != 0 || (*v).len() == 0 {
        return ngx_str_t { len: 0, data: NonNull::dangling().as_ptr() };
    }
    ngx_str_t { len: (*v).len() as usize, data: (*v).data }
}

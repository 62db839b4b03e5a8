//! The shared memory zone that holds the counters (`ratelimit_metrics_zone`), as limit_req and
//! stub_status keep theirs: added while the configuration is read, set up by nginx's cycle
//! before the workers fork, so every worker maps the same cells.

use core::ffi::c_void;
use core::ptr;
use core::sync::atomic::AtomicU64;

use ngx::ffi::{
    ngx_conf_t, ngx_int_t, ngx_shared_memory_add, ngx_shm_zone_t, ngx_slab_calloc, ngx_slab_pool_t,
    ngx_str_t, NGX_LOG_WARN, NGX_OK,
};
use ngx::ngx_log_error;

use super::{cells, Metrics};
use crate::conf::MainConf;
use crate::module::ngx_http_ratelimit_module;

const NAME: &str = "ratelimit_metrics";

/// Adds the zone of `size` bytes for the configuration `mcf`; its counters are allocated in
/// [`init_zone`], once the whole configuration (every zone) is known.
///
/// # Safety
/// `cf` is the configuration being parsed and `mcf` its main configuration, which lives as long
/// as the cycle (nginx hands it back to the next cycle's `init_zone` as the old data).
pub unsafe fn add(cf: *mut ngx_conf_t, mcf: &mut MainConf, size: usize) -> bool {
    let mut name = ngx_str_t { len: NAME.len(), data: NAME.as_ptr() as *mut u8 };
    let tag = ptr::addr_of_mut!(ngx_http_ratelimit_module) as *mut c_void;
    let zone = ngx_shared_memory_add(cf, &mut name, size, tag);
    if zone.is_null() {
        return false;
    }
    (*zone).init = Some(init_zone);
    (*zone).data = ptr::from_mut(mcf) as *mut c_void;
    true
}

/// Allocates the counters, or keeps the previous cycle's across a reload when the layout (the
/// zones, in order, and the Redis server) is unchanged, so counters never go back. A zone too
/// small leaves the metrics disabled: nginx works as usual, counting nothing, and says so once.
unsafe extern "C" fn init_zone(zone: *mut ngx_shm_zone_t, old: *mut c_void) -> ngx_int_t {
    // SAFETY: `data` is the MainConf set by `add`, for this cycle and (`old`) the previous one,
    // both alive while the new cycle is set up.
    let mcf = &*((*zone).data as *const MainConf);
    let zones = mcf.zones.len();
    if let Some(old) = (old as *const MainConf).as_ref() {
        let same = old.zones.iter().map(|z| &z.name).eq(mcf.zones.iter().map(|z| &z.name))
            && old.redis.as_ref().map(|r| &r.name) == mcf.redis.as_ref().map(|r| &r.name);
        if same && old.metrics.get().enabled() {
            mcf.metrics.set(old.metrics.get());
            return NGX_OK as ngx_int_t;
        }
    }
    // The slab pool nginx put at the start of every shared zone. A layout change allocates
    // anew: the previous cycle's workers may still be counting in the old cells.
    let pool = (*zone).shm.addr as *mut ngx_slab_pool_t;
    // A full zone is reported below, once, at `warn`: not by the allocator, at `crit`.
    (*pool).set_log_nomem(0);
    let p = ngx_slab_calloc(pool, cells(zones) * size_of::<AtomicU64>()) as *const AtomicU64;
    if p.is_null() {
        ngx_log_error!(
            NGX_LOG_WARN,
            (*zone).shm.log,
            "ratelimit: ratelimit_metrics_zone of {} bytes is full, metrics are not counted",
            (*zone).shm.size
        );
    }
    // SAFETY: `cells(zones)` zeroed cells, mapped in every worker for the life of the zone;
    // AtomicU64 has the size and alignment of u64 and slab blocks are 8-byte aligned.
    mcf.metrics.set(Metrics::new(p, zones));
    NGX_OK as ngx_int_t
}

//! The shared memory zone that holds the counters (`ratelimit_metrics_zone`), as limit_req and
//! stub_status keep theirs: added while the configuration is read, set up by nginx's cycle
//! before the workers fork, so every worker maps the same cells.

use core::ffi::c_void;
use core::ptr;

use ngx::ffi::{
    ngx_conf_t, ngx_int_t, ngx_shared_memory_add, ngx_shm_zone_t, ngx_slab_calloc, ngx_slab_free,
    ngx_slab_pool_t, ngx_str_t, NGX_LOG_WARN, NGX_OK,
};
use ngx::ngx_log_error;

use crate::glue::conf::MainConf;
use crate::glue::module::ngx_http_ratelimit_module;
use crate::metrics::format::Backend;
use crate::metrics::store::{self, Directory, Slab};
use crate::metrics::Metrics;

const NAME: &str = "ratelimit_metrics";

/// Adds the zone of `size` bytes for the configuration `mcf`; its counters are found or
/// allocated in [`init_zone`], once the whole configuration (every zone) is known.
///
/// # Safety
/// `cf` is the configuration being parsed and `mcf` its main configuration, which lives as long
/// as the cycle.
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

struct Pool(*mut ngx_slab_pool_t);

impl Slab for Pool {
    fn calloc(&mut self, size: usize) -> *mut u8 {
        // SAFETY: the zone's slab pool, set up by nginx.
        unsafe { ngx_slab_calloc(self.0, size) as *mut u8 }
    }
    unsafe fn free(&mut self, p: *mut u8) {
        ngx_slab_free(self.0, p as *mut c_void);
    }
}

/// The Redis backends counted, in the order of `MainConf::backends` (the index
/// `Metrics::backend` and the page's `View` take), by name and server. Without any
/// `ratelimit_redis`, one unnamed backend of no server, as before backends had names: its series
/// (all 0) stay on the page.
pub fn backends(mcf: &MainConf) -> Vec<Backend<'_>> {
    if mcf.backends.is_empty() {
        return vec![Backend { name: "", server: "" }];
    }
    mcf.backends.iter().map(|b| Backend { name: &b.redis.backend, server: &b.redis.name }).collect()
}

/// Finds this configuration's counters by zone and backend name in the zone, allocating only
/// for new names (`store`), so a reload keeps every kept zone's counters and the zone does not
/// fill up over reloads. A zone too small leaves the metrics disabled: nginx works as usual,
/// counting and showing nothing, and says so once.
unsafe extern "C" fn init_zone(zone: *mut ngx_shm_zone_t, old: *mut c_void) -> ngx_int_t {
    // SAFETY: `data` is the MainConf set by `add`, alive while the cycle is set up.
    let mcf = &*((*zone).data as *const MainConf);
    // The slab pool nginx put at the start of every shared zone.
    let pool = (*zone).shm.addr as *mut ngx_slab_pool_t;
    // A full zone is reported below, once, at `warn`: not by the allocator, at `crit`.
    (*pool).set_log_nomem(0);
    let mut slab = Pool(pool);
    // `old` is set when nginx kept the zone's memory (same name and size): the directory the
    // previous cycle left in the pool's `data`. Otherwise the memory is new.
    let mut dir = (*pool).data as *mut Directory;
    if old.is_null() || dir.is_null() {
        dir = store::create(&mut slab);
        (*pool).data = dir as *mut c_void;
    }
    // Concurrency zones count their slot events in a block of their own, found by a name no
    // zone can have ('/' is not allowed in zone names), so that it is kept across reloads too.
    let slot_names: Vec<String> =
        mcf.zones.iter().filter(|z| z.concurrency()).map(|z| format!("{}/slots", z.name)).collect();
    let mut zones: Vec<&str> = mcf.zones.iter().map(|z| z.name.as_str()).collect();
    zones.extend(slot_names.iter().map(String::as_str));
    // A block per backend, found again by its name and server (`store::server_block`).
    let servers: Vec<String> =
        backends(mcf).iter().map(|b| store::server_block(b.name, b.server)).collect();
    let servers: Vec<&str> = servers.iter().map(String::as_str).collect();
    // SAFETY: the master alone sets up cycles, one at a time.
    let cells = if dir.is_null() { None } else { store::attach(dir, &mut slab, &zones, &servers) };
    match cells {
        Some(mut cells) => {
            let mut slot_blocks = cells.zones.split_off(mcf.zones.len()).into_iter();
            cells.slots = mcf
                .zones
                .iter()
                .map(|z| if z.concurrency() { slot_blocks.next() } else { None })
                .map(|b| b.unwrap_or(ptr::null()))
                .collect();
            let cells = mcf.metrics_cells.get_or_init(|| cells);
            // SAFETY: the cells live in `mcf`, as long as every handle of this cycle; their
            // blocks stay in the zone, mapped in every worker, for the life of the zone.
            mcf.metrics.set(Metrics::new(cells));
        }
        None => {
            ngx_log_error!(
                NGX_LOG_WARN,
                (*zone).shm.log,
                "ratelimit: ratelimit_metrics_zone of {} bytes is full, metrics are not counted",
                (*zone).shm.size
            );
        }
    }
    NGX_OK as ngx_int_t
}

//! Configuration structures and their merging.

use core::cell::{Cell, OnceCell, RefCell};
use core::ffi::c_char;
use core::ffi::c_void;
use core::ptr;

use ngx::core::NGX_CONF_ERROR;
use ngx::ffi::{
    ngx_conf_t, ngx_core_conf_t, ngx_core_module, ngx_cycle, ngx_uint_t, NGX_LOG_EMERG,
    NGX_LOG_ERR, NGX_LOG_WARN,
};
use ngx::http::HttpModuleMainConf;
use ngx::ngx_log_error;

use crate::decide::deny_cache::DenyCache;
use crate::decide::headers::HeaderMode;
use crate::decide::key::prefix_tag;
use crate::decide::lease::{LeaseConf, Leases};
use crate::decide::local_limit::LocalLimiter;
use crate::decide::quota::Period;
use crate::decide::script::{Algorithm, EncodedFigures, Spare, MAX_ZONES};
use crate::decide::settle;
use crate::decide::slots::Slots;
use crate::decide::table_key::TableHead;
use crate::glue::module::RateLimit;
use crate::glue::value::Value;
use crate::metrics::store::Cells;
use crate::metrics::Metrics;
use crate::redis::conf::RedisConf;
use crate::redis::pool::WorkerPool;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// Redis `TIME`: every gateway judged by one clock.
    Redis,
    /// The gateway's own millisecond clock, passed to the script.
    Nginx,
}

/// A number written in the configuration, or a variable (a `map` from consumer to plan)
/// evaluated and checked per request.
#[derive(Clone, Copy)]
pub enum Param {
    Fixed(u64),
    /// Compiled in the configuration pool.
    Var(Value),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailPolicy {
    Open,
    Closed,
    /// Each worker enforces its share of every zone from memory.
    Local,
}

pub enum KeyPiece {
    /// Compiled in the configuration pool.
    Value(Value),
    Brace(u8),
}

pub struct Zone {
    pub name: String,
    /// Compiled in the configuration pool.
    pub key: Value,
    /// The template as written: a shortened value keeps its literal head, and
    /// `ratelimit_admin` puts its `key=` where the variable is.
    pub key_text: Vec<u8>,
    /// The same template split at its literal braces, for Redis Cluster; empty without any.
    pub key_pieces: Vec<KeyPiece>,
    /// `crate::decide::key::tag_template` of the key.
    pub tag: Option<Vec<u8>>,
    pub algorithm: Algorithm,
    pub limit: Param,
    pub window: Param,
    pub burst: u64,
    pub clock: Clock,
    /// Calendar quotas: the period, whose length the headers announce as the window.
    pub period: Option<Period>,
    /// The status of a rejection this zone decides, before `ratelimit_status`.
    pub status: Option<u64>,
    /// `exact_key=on`: the key value is the whole Redis key (the article's `rl:sw:<id>`), so
    /// that gateways still running the Lua block count in the same keys.
    pub exact_key: bool,
    /// `member=request_id`: `$request_id`, compiled in the configuration pool; each admitted
    /// unit of the log is stored under the request's id instead of a compact integer.
    pub member: Option<Value>,
    /// `lease=` and `lease_time=` (`crate::decide::lease`); `None` for `lease=off`.
    pub lease: Option<LeaseConf>,
    /// Where it was declared, for errors found once the whole `http{}` block is read.
    pub at: (String, ngx_uint_t),
    /// Its keys' common head hashed for this worker's tables, on the first request.
    pub table_head: OnceCell<TableHead>,
    /// `redis=`: the name of the backend its keys live on, as written (`None`: the unnamed one)
    /// ...
    pub redis_name: Option<String>,
    /// ... and its index in `MainConf::backends`, once the whole `http{}` block is read
    /// ([`NO_BACKEND`] while there is none to name).
    pub backend: usize,
}

/// The backend of a zone that names none while no `ratelimit_redis` is unnamed.
pub const NO_BACKEND: usize = usize::MAX;

impl Zone {
    /// `algorithm=concurrency`: its window field is the slot's life (`lease_time=`), its member
    /// the request's `$request_id`.
    pub fn concurrency(&self) -> bool {
        self.algorithm == Algorithm::Concurrency
    }

    /// Whether a request's cost can be recorded as a place to give back (with several backends):
    /// not a slot, not request ids, not what a reservation admitted.
    pub fn undoable(&self) -> bool {
        !self.concurrency() && self.member.is_none() && self.lease.is_none()
    }
}

/// One `ratelimit_redis`: a Redis deployment and this worker's way to it.
pub struct Backend {
    pub redis: RedisConf,
    /// This worker's connections; created on first use, because a single-process reload builds
    /// a new cycle without running `init_process` again.
    pub pool: Cell<*mut WorkerPool>,
    /// Where it was declared, for the error of a name declared twice.
    pub at: (String, ngx_uint_t),
}

pub struct MainConf {
    /// Every `ratelimit_redis`, in the order written.
    pub backends: Vec<Backend>,
    pub zones: Vec<Zone>,
    /// This worker's remembered rejections, created on the first one. Indexed by zone, so it
    /// belongs to this configuration and goes with it on reload.
    pub deny_cache: RefCell<Option<DenyCache>>,
    /// This worker's reservations, created on the first zone that asks for one; given back at
    /// worker exit (`crate::glue::giveback`).
    pub leases: RefCell<Option<Leases>>,
    /// The concurrency slots this worker's requests hold, created on the first one; renewed by
    /// the sweep of `crate::glue::giveback` and released when their requests end.
    pub slots: RefCell<Option<Slots>>,
    /// This worker's counters for `ratelimit_fail local`, created on the first local decision.
    pub local: RefCell<Option<LocalLimiter>>,
    /// Room this worker keeps between decisions for their arguments and verdicts.
    pub spare: RefCell<Spare>,
    /// `ratelimit_fail_local_size`: the bytes those counters may take per worker.
    pub local_size: Option<u64>,
    /// Requests of this worker waiting for their turn (`delay=`), and those whose decision is
    /// on its way with a wait allowed: each may end up waiting.
    pub waiting: Cell<u64>,
    /// Settlements Redis could not take yet, sent again by the sweep (`settle=`).
    pub settlements: RefCell<Option<settle::Queue>>,
    /// Some `ratelimit` line has `settle=`: only then does the log phase run a handler of this
    /// module (every request paid for it, in every location, before).
    pub settling: Cell<bool>,
    /// The zones some `ratelimit` line gives `delay=`, by name: every decision of theirs says
    /// so to Redis (a wait of 0 where the line has none), so that no plain write shortens the
    /// life of places recorded ahead of now.
    pub delayed_zones: RefCell<Vec<String>>,
    /// `ratelimit_metrics_zone`: its size; the counters it holds once nginx has set it up.
    pub metrics_size: Option<u64>,
    pub metrics: Cell<Metrics>,
    /// Where `metrics` counts: this configuration's blocks in the zone.
    pub metrics_cells: OnceCell<Cells>,
    /// Where `ratelimit_metrics` was first used, to name it when the zone is missing.
    pub metrics_used: Option<(String, ngx_uint_t)>,
}

impl MainConf {
    pub fn local_size(&self) -> usize {
        self.local_size.unwrap_or(16 << 20) as usize
    }

    /// This worker's way to backend `b`, made on first use; `None` for a zone without one.
    pub fn pool(&self, b: usize) -> Option<&'static mut WorkerPool> {
        let backend = self.backends.get(b)?;
        WorkerPool::get(&backend.pool, &backend.redis, self.metrics.get().backend(b))
    }

    /// What `ratelimit_redis` says of backend `b`.
    pub fn redis(&self, b: usize) -> Option<&RedisConf> {
        self.backends.get(b).map(|x| &x.redis)
    }

    /// The backend of zone `zone`.
    pub fn zone_redis(&self, zone: usize) -> Option<&RedisConf> {
        self.redis(self.zones[zone].backend)
    }
}

impl Default for MainConf {
    fn default() -> Self {
        MainConf {
            backends: Vec::new(),
            zones: Vec::new(),
            deny_cache: RefCell::new(None),
            leases: RefCell::new(None),
            slots: RefCell::new(None),
            local: RefCell::new(None),
            spare: RefCell::new(Spare::default()),
            local_size: None,
            waiting: Cell::new(0),
            settlements: RefCell::new(None),
            settling: Cell::new(false),
            delayed_zones: RefCell::new(Vec::new()),
            metrics_size: None,
            metrics: Cell::new(Metrics::disabled()),
            metrics_cells: OnceCell::new(),
            metrics_used: None,
        }
    }
}

/// A `ratelimit` line, resolved to its zone once the whole `http{}` block is read.
#[derive(Clone)]
pub struct LimitRef {
    pub name: String,
    pub zone: usize,
    pub cost: Param,
    /// `delay=`: how long a request this zone cannot admit now may wait for its turn, in ms
    /// (0: none, rejected at once).
    pub delay_ms: u64,
    /// `settle=`: the value, evaluated when the request ends, that replaces the cost.
    pub settle: Option<Value>,
    /// The zone's figures with this line's cost, encoded once when no variable sets them.
    pub figures: Option<EncodedFigures>,
    /// Where the line was, for errors found after parsing.
    pub file: String,
    pub line: ngx_uint_t,
}

#[derive(Default)]
pub struct LocConf {
    /// `None`: not set here, inherit the parent's set, as `limit_req` does. `Some(empty)`:
    /// `ratelimit off`.
    pub limits: Option<Vec<LimitRef>>,
    /// `ratelimit off` was written at this level; only for checking the lines that follow.
    pub limits_off: bool,
    pub fail: Option<FailPolicy>,
    pub status: Option<u64>,
    pub headers: Option<HeaderMode>,
    pub log_level: Option<ngx_uint_t>,
    pub deny_cache: Option<bool>,
    pub fail_local_share: Option<u64>,
    /// `ratelimit_admin`: the balance zone this location administers; not inherited.
    pub admin_zone: Option<usize>,
    /// `ratelimit_dry_run`: decide as usual, reject nothing.
    pub dry_run: Option<bool>,
    /// Some zone of the location is one a request may wait for (`delay=` on any of its lines):
    /// its decisions carry every zone's longest wait.
    pub delaying: bool,
    /// Its zones live on several backends: a decision is asked of each, all at once, and the
    /// lines are kept grouped by backend, in the order written otherwise.
    pub several: bool,
    /// Some zone of the location reserves (`lease=`) and the location is no dry run: its
    /// requests look for reservations first.
    pub leasing: bool,
}

impl LocConf {
    pub fn limits(&self) -> &[LimitRef] {
        self.limits.as_deref().unwrap_or(&[])
    }
    pub fn fail(&self) -> FailPolicy {
        self.fail.unwrap_or(FailPolicy::Open)
    }
    pub fn status(&self) -> ngx_uint_t {
        self.status.unwrap_or(429) as ngx_uint_t
    }
    pub fn headers(&self) -> HeaderMode {
        self.headers.unwrap_or(HeaderMode::Legacy)
    }
    pub fn log_level(&self) -> ngx_uint_t {
        self.log_level.unwrap_or(NGX_LOG_ERR as ngx_uint_t)
    }
    /// `None`: the default, this nginx's `worker_processes`.
    pub fn fail_local_share(&self) -> Option<u64> {
        self.fail_local_share
    }
    pub fn deny_cache(&self) -> bool {
        self.deny_cache.unwrap_or(true)
    }
    pub fn dry_run(&self) -> bool {
        self.dry_run.unwrap_or(false)
    }
}

/// Inherits unset values like `ngx_conf_merge_*_value`, then resolves zone names: zones may be
/// declared after the `ratelimit` lines that use them, as with `limit_req`.
///
/// # Safety
/// Called by nginx with valid configuration pointers of this module's types.
pub unsafe extern "C" fn merge_loc_conf(
    cf: *mut ngx_conf_t,
    prev: *mut c_void,
    conf: *mut c_void,
) -> *mut c_char {
    let prev = &*(prev as *const LocConf);
    let conf = &mut *(conf as *mut LocConf);
    let inherited = conf.limits.is_none();
    if inherited {
        conf.limits.clone_from(&prev.limits);
    }
    conf.fail = conf.fail.or(prev.fail);
    conf.status = conf.status.or(prev.status);
    conf.headers = conf.headers.or(prev.headers);
    conf.log_level = conf.log_level.or(prev.log_level);
    conf.deny_cache = conf.deny_cache.or(prev.deny_cache);
    conf.fail_local_share = conf.fail_local_share.or(prev.fail_local_share);
    conf.dry_run = conf.dry_run.or(prev.dry_run);

    let dry_run = conf.dry_run();
    let Some(limits) = conf.limits.as_mut().filter(|l| !l.is_empty()) else {
        return ptr::null_mut();
    };
    let Some(mcf) = RateLimit::main_conf(&*cf) else { return NGX_CONF_ERROR as _ };
    for limit in limits.iter_mut() {
        match mcf.zones.iter().position(|z| z.name == limit.name) {
            Some(i) => limit.zone = i,
            None => return fail(cf, limit, "unknown ratelimit zone \"%s\""),
        }
        if mcf.zones[limit.zone].backend == NO_BACKEND {
            let what = match mcf.backends.is_empty() {
                true => "ratelimit \"%s\" is used but \"ratelimit_redis\" is not set",
                false => {
                    "ratelimit \"%s\" is used but its zone has no \"redis=\" and every \
                     \"ratelimit_redis\" has a \"name=\": give the zone \"redis=NAME\" or declare \
                     a \"ratelimit_redis\" without \"name=\""
                }
            };
            return fail(cf, limit, what);
        }
        if let Some(why) = limit.settle.and_then(|_| cannot_settle(&mcf.zones[limit.zone], limit)) {
            return fail(cf, limit, &format!("ratelimit \"%s\" {why}"));
        }
        if limit.settle.is_some() {
            mcf.settling.set(true);
        }
        let zone = &mcf.zones[limit.zone];
        limit.figures = match (zone.limit, zone.window, limit.cost) {
            (Param::Fixed(l), Param::Fixed(w), Param::Fixed(c)) if zone.member.is_none() => {
                let w = zone.period.map_or(w, Period::encode);
                Some(EncodedFigures::new(zone.algorithm, l, w, c, zone.burst))
            }
            _ => None,
        };
        if mcf.zones[limit.zone].concurrency() && !matches!(limit.cost, Param::Fixed(1)) {
            return fail(
                cf,
                limit,
                "ratelimit \"%s\" is a concurrency zone: a request holds one slot, cost= must \
                 be 1",
            );
        }
    }
    if let Some(limit) = limits.get(MAX_ZONES) {
        return fail(
            cf,
            limit,
            &format!(
                "ratelimit \"%s\" is more than a location may name, {MAX_ZONES} zones: one \
                 decision covers all of them"
            ),
        );
    }
    let backend = |l: &LimitRef| mcf.zones[l.zone].backend;
    conf.several = limits.iter().any(|l| backend(l) != backend(&limits[0]));
    if conf.several {
        limits.sort_by_key(backend);
    }
    let delayed = {
        let names = mcf.delayed_zones.borrow();
        limits.iter().find(|l| names.contains(&l.name)).map(|l| l.name.clone())
    };
    conf.delaying = delayed.is_some();
    // A dry run asks Redis every time, so what it reports is what Redis would decide now.
    conf.leasing = !dry_run && limits.iter().any(|l| mcf.zones[l.zone].lease.is_some());
    if let (Some(delayed), true) = (&delayed, conf.several) {
        let limit = limits.iter().find(|l| &l.name == delayed).unwrap_or(&limits[0]);
        return fail(
            cf,
            limit,
            "ratelimit \"%s\" may delay requests (delay=), but the zones of this location live on \
             several Redis backends (redis=), whose decisions cannot record a request at one later \
             instant together; give the delaying zones a location of their own, or one backend",
        );
    }
    if let Some(delayed) = delayed {
        for limit in limits.iter() {
            let zone = &mcf.zones[limit.zone];
            let why = match zone.algorithm {
                Algorithm::Balance => "a balance zone, which nothing refills by time",
                Algorithm::Concurrency => "a concurrency zone, whose slots have no known end",
                _ if zone.member.is_some() => {
                    "a sliding_log with member=, whose entries are \
                                               the requests' own"
                }
                _ => continue,
            };
            let what = if limit.delay_ms > 0 {
                format!("ratelimit \"%s\" is {why}: a request cannot wait for it, remove delay=")
            } else {
                format!(
                    "ratelimit \"%s\" is {why}: a request of this location may wait for its \
                     turn in zone \"{delayed}\" (delay= on a ratelimit line of it), which \
                     records it at that instant in every zone of the location; give this zone a \
                     location of its own"
                )
            };
            return fail(cf, limit, &what);
        }
    }
    if !inherited {
        warn_cross_slot(cf, mcf, limits);
        warn_mixed_leases(cf, mcf, limits);
    }
    ptr::null_mut()
}

/// Why a `ratelimit` line's zone cannot take `settle=`, if it cannot.
fn cannot_settle(zone: &Zone, limit: &LimitRef) -> Option<&'static str> {
    Some(match zone.algorithm {
        Algorithm::Concurrency => "is a concurrency zone: a request holds a slot, it spends nothing to settle; remove settle=",
        _ if zone.lease.is_some() => "has lease=: a request admitted from a worker's reservation has no place of its own in Redis to settle; remove lease= from the zone or settle= from this line",
        _ if zone.member.is_some() => "is a sliding_log with member=: its entries are the requests' ids, not places a settlement can name; remove member= or settle=",
        _ if matches!(limit.cost, Param::Fixed(0)) => "has cost=0 with settle=: an estimate of nothing places nothing to settle; give the estimate (cost=N, or leave it out: 1)",
        _ => return None,
    })
}

/// A request is admitted from reservations in all its zones or in none, so a location whose
/// zones do not all lease never admits from them and reserves nothing: say so, once.
unsafe fn warn_mixed_leases(cf: *mut ngx_conf_t, mcf: &MainConf, limits: &[LimitRef]) {
    let (leased, plain): (Vec<&LimitRef>, Vec<&LimitRef>) =
        limits.iter().partition(|l| mcf.zones[l.zone].lease.is_some());
    let (Some(l), Some(p)) = (leased.first(), plain.first()) else { return };
    ngx_log_error!(
        NGX_LOG_WARN,
        (*cf).log,
        "ratelimit zone \"{}\" has lease= but \"{}\" in the same location has not: its requests \
         are decided exactly, without reservations; give every zone of the location lease= or \
         none, in {}:{}",
        l.name,
        p.name,
        p.file,
        p.line
    );
}

/// On a Cluster, zones decided together must share a slot, or each of their decisions is
/// refused: warn where that cannot hold, once per backend, at the first `ratelimit` line of the
/// level. Zones on different backends are decided apart and need nothing in common.
unsafe fn warn_cross_slot(cf: *mut ngx_conf_t, mcf: &MainConf, limits: &[LimitRef]) {
    for (b, backend) in mcf.backends.iter().enumerate() {
        let redis = &backend.redis;
        let limits: Vec<&LimitRef> =
            limits.iter().filter(|l| mcf.zones[l.zone].backend == b).collect();
        if !redis.cluster || limits.len() < 2 || prefix_tag(&redis.prefix) {
            continue;
        }
        let tags: Vec<_> = limits.iter().map(|l| mcf.zones[l.zone].tag.as_ref()).collect();
        if tags.iter().all(|t| t.is_some() && *t == tags[0]) {
            continue;
        }
        let names: Vec<_> = limits.iter().map(|l| format!("\"{}\"", l.name)).collect();
        ngx_log_error!(
            NGX_LOG_WARN,
            (*cf).log,
            "ratelimit zones {} have no common hash tag in their keys: with \"cluster=on\" their \
             decisions follow ratelimit_fail, in {}:{}",
            names.join(", "),
            limits[0].file,
            limits[0].line
        );
    }
}

/// Logs with the `ratelimit` line's own position: `ngx_conf_log_error` would point at the end
/// of the `http{}` block, where merging happens.
unsafe fn fail(cf: *mut ngx_conf_t, limit: &LimitRef, what: &str) -> *mut c_char {
    let msg = what.replace("%s", &limit.name);
    ngx_log_error!(NGX_LOG_EMERG, (*cf).log, "{msg} in {}:{}", limit.file, limit.line);
    NGX_CONF_ERROR as _
}

/// The core module's configuration of the running cycle, if any.
unsafe fn core_conf() -> Option<&'static ngx_core_conf_t> {
    // SAFETY: the core module's configuration is the cycle's first, set before workers start and
    // never changed in a worker.
    (*(*ngx_cycle).conf_ctx.add(ngx_core_module.index) as *const ngx_core_conf_t).as_ref()
}

/// `worker_processes` of the running configuration: the default share of a zone per worker.
pub unsafe fn worker_processes() -> u64 {
    core_conf().map_or(1, |c| (c.worker_processes as u64).max(1))
}

/// `timer_resolution` (0 when not set): how long nginx's cached clock may go without an update.
pub unsafe fn timer_resolution() -> u64 {
    core_conf().map_or(0, |c| c.timer_resolution as u64)
}

//! The access-phase handler: one Redis script call per main request, suspended without holding
//! the worker, resumed by a posted event, and decided once even across internal redirects.

use core::ffi::c_void;
use core::ptr::{self, NonNull};

use ngx::core::Pool;
use ngx::ffi::{
    ngx_add_timer, ngx_core_conf_t, ngx_core_module, ngx_current_msec, ngx_cycle, ngx_del_timer,
    ngx_delete_posted_event, ngx_event_t, ngx_http_block_reading, ngx_http_cleanup_add,
    ngx_http_complex_value, ngx_http_complex_value_t, ngx_http_log_ctx_t, ngx_http_request_t,
    ngx_http_run_posted_requests, ngx_http_test_reading, ngx_int_t, ngx_list_push, ngx_msec_int_t,
    ngx_msec_t, ngx_pnalloc, ngx_pool_cleanup_add, ngx_str_t, ngx_table_elt_t, ngx_timeofday,
    NGX_AGAIN, NGX_DECLINED, NGX_ERROR, NGX_HTTP_SERVICE_UNAVAILABLE, NGX_LOG_ERR,
};
use ngx::http::{HttpModule, HttpModuleLocationConf, HttpModuleMainConf};
use ngx::ngx_log_error;

use crate::conf::{Clock, FailPolicy, KeyPiece, LocConf, MainConf, Param, RedisConf, Zone};
use crate::deny_cache::{Denial, DenyCache, UNTIL_CHANGED};
use crate::giveback;
use crate::headers::{self, Policy, Quota};
use crate::key::{cluster_value, shorten, Key, Piece};
use crate::lease::{Ask, Figures, Leases};
use crate::local_limit::{LocalLimiter, LocalZone};
use crate::log_throttle::LogThrottle;
use crate::metrics::{LeaseEvent, SlotEvent};
use crate::module::RateLimit;
use crate::params::{parse_cost, parse_limit, parse_window};
use crate::quota::Period;
use crate::redis::follow::{again, asks_again, follow, submit, Follow, Retries, TRYAGAIN_DELAY};
use crate::redis::invalidation::{self, Forget};
use crate::redis::pool::{RedisError, Waiter, WorkerPool};
use crate::script::{self, Algorithm, Decision, EncodedArgs, ReplyError, SlotRef, ZoneArgs};
use crate::slots::{local_decision, LocalPart, Slots};
pub use crate::status::Status;

/// Per main request, in its pool. Found again after an internal redirect through the pool's
/// cleanup list, because redirects wipe `r->ctx`.
pub struct Ctx {
    r: *mut ngx_http_request_t,
    pub status: Status,
    /// Set once the decision has been returned to the phase engine; later passes (internal
    /// redirects) let the request through untouched, as limit_req does.
    applied: bool,
    waiter: Waiter,
    /// Fires on completion (posted) or at the decision's deadline (timer).
    ev: ngx_event_t,
    args: EncodedArgs,
    retries: Retries,
    /// When the decision was asked for: a rejection is remembered from then, so the memory
    /// never outlasts what Redis said.
    started: ngx_msec_t,
    /// The same instant on the wall clock, in ms: `$ratelimit_time`.
    pub asked_ms: u64,
    /// The zones that decide this request, in script order.
    zones: Vec<ZoneReq>,
    /// The deciding zone (an index into `zones`), its remaining units and reset in ms.
    pub quota: Option<(usize, u64, u64)>,
    /// Rejected without asking Redis, its cost above anything the deciding zone can grant: no
    /// wait admits it, so no header may suggest one.
    beyond_capacity: bool,
    /// The concurrency slots the request holds (ids in the worker's `Slots`), one per
    /// concurrency zone, released by `cleanup` when the request ends.
    slots: Vec<u64>,
    /// `ratelimit_fail local`: the (zone, whole key) of each concurrency zone this worker
    /// admitted the request in by itself, released by `cleanup` too.
    local_slots: Vec<(usize, Vec<u8>)>,
    /// The configuration that took them, for `cleanup`: it outlives the request.
    mcf: *const MainConf,
}

/// One zone as this request sees it: limit, window and cost may come from variables.
pub struct ZoneReq {
    /// Index into the main conf's zones.
    pub zone: usize,
    /// Borrows the configuration and the request's pool, which both outlive the context.
    key: Key<'static>,
    pub limit: u64,
    pub window_ms: u64,
    cost: u64,
    /// `member=request_id`: `$request_id`, in the request's pool.
    member: Option<&'static [u8]>,
    /// `lease=`: the units to reserve with this request's decision, and their life in ms.
    lease: Option<(u64, u64)>,
}

impl ZoneReq {
    fn value(&self) -> &[u8] {
        self.key.value()
    }

    /// The key as the deny cache knows it, the whole Redis key as Redis names it in its
    /// invalidations: short values only.
    fn cached_key(&self) -> Option<[&[u8]; 4]> {
        Some(self.key.parts()).filter(|_| self.value().len() <= DENY_CACHE_MAX_KEY)
    }

    fn args(&self, zone: &Zone) -> ZoneArgs<'static> {
        let (limit, cost) = (self.limit, self.cost);
        let window_ms = zone.period.map_or(self.window_ms, Period::encode);
        ZoneArgs {
            key: self.key,
            algorithm: zone.algorithm,
            limit,
            window_ms,
            cost,
            burst: zone.burst,
            member: self.member,
            lease: self.lease,
        }
    }

    /// A concurrency zone's slot as its release or renewal names it; `key` is the whole key.
    fn slot<'a>(&'a self, key: &'a [u8]) -> Option<SlotRef<'a>> {
        let member = self.member?;
        Some(SlotRef { key, limit: self.limit, life_ms: self.window_ms, member })
    }

    fn ask(&self) -> Ask<'_> {
        let figures = Figures { limit: self.limit, window_ms: self.window_ms };
        Ask { zone: self.zone, key: self.key.parts(), cost: self.cost, figures }
    }
}

/// Rejections remembered per worker. Each entry costs its key plus about 130 bytes.
const DENY_CACHE_ENTRIES: usize = 10_000;
/// How long a rejection whose key Redis does not track for this worker is remembered: the
/// longest a reset can then go unheard.
const UNTRACKED_DENIAL_MS: u64 = 100;
/// Longer keys are always asked of Redis, so the deny cache stays small whatever clients send.
const DENY_CACHE_MAX_KEY: usize = 256;
/// Keys with reservations or demand counts per worker; more keys are decided exactly.
const LEASE_ENTRIES: usize = 10_000;

pub unsafe extern "C" fn access_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    if r != (*r).main {
        return NGX_DECLINED as ngx_int_t;
    }
    let (Some(lcf), Some(mcf)) = (RateLimit::location_conf(&*r), RateLimit::main_conf(&*r)) else {
        return NGX_DECLINED as ngx_int_t;
    };
    if lcf.limits().is_empty() {
        return NGX_DECLINED as ngx_int_t;
    }
    if let Some(ctx) = find_ctx(r) {
        let ctx = &mut *ctx.as_ptr();
        return match (ctx.applied, ctx.status) {
            (true, _) => NGX_DECLINED as ngx_int_t,
            // A spurious run of the phase engine while Redis has not answered.
            (false, Status::Pending) => NGX_AGAIN as ngx_int_t,
            (false, _) => apply(ctx, lcf, mcf),
        };
    }
    start(r, lcf, mcf)
}

unsafe fn start(r: *mut ngx_http_request_t, lcf: &LocConf, mcf: &MainConf) -> ngx_int_t {
    let Some(ctx) = new_ctx(r) else { return NGX_ERROR as ngx_int_t };
    let ctx = &mut *ctx.as_ptr();
    let Some(redis) = mcf.redis.as_ref() else { return NGX_ERROR as ngx_int_t };
    ctx.started = ngx_current_msec;
    ctx.asked_ms = wall_ms();

    for limit in lcf.limits() {
        let zone = &mcf.zones[limit.zone];
        let Some(value) = eval(r, zone.key) else { return NGX_ERROR as ngx_int_t };
        // An empty key is not limited, as in limit_req.
        if value.len == 0 {
            continue;
        }
        // The logs keep an entry per unit: their limit, and so any cost, is bounded.
        let max = zone.algorithm.max_limit();
        let figures = (
            param(r, zone.limit, |v| parse_limit(v).filter(|&n| n <= max), "limit"),
            param(r, zone.window, parse_window, "window"),
            param(r, limit.cost, parse_cost, "cost"),
        );
        let (limit_n, window_ms, cost) = match figures {
            (Ok(l), Ok(w), Ok(c)) => (l, zone.period.map_or(w, |p| p.length_ms(wall_ms())), c),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                let Some((what, value)) = e else { return NGX_ERROR as ngx_int_t };
                let bad = Failure::BadValue(what, limit.zone, zone.name.clone(), value);
                fail(ctx, lcf, mcf, bad);
                // Not among the request's zones yet (`apply` counts those): the one that failed.
                mcf.metrics.get().request(ctx.status, core::iter::once((limit.zone, 0)));
                return apply(ctx, lcf, mcf);
            }
        };
        // SAFETY: the value lives in the request's pool, as the context that keeps the key does.
        let mut value = core::slice::from_raw_parts(value.data, value.len);
        if redis.cluster && !zone.exact_key {
            let Some(v) = cluster_key_value(r, zone, value) else { return NGX_ERROR as ngx_int_t };
            value = v;
        }
        let Some(key) = zone_key(r, redis, zone, value) else { return NGX_ERROR as ngx_int_t };
        let member = match zone.member {
            // SAFETY: the value lives in the request's pool, as the context does.
            Some(cv) => match eval(r, cv) {
                Some(id) => Some(core::slice::from_raw_parts(id.data, id.len)),
                None => return NGX_ERROR as ngx_int_t,
            },
            None => None,
        };
        let z =
            ZoneReq { zone: limit.zone, key, limit: limit_n, window_ms, cost, member, lease: None };
        ctx.zones.push(z);
        let capacity = zone.algorithm.capacity(limit_n, zone.burst);
        if cost > capacity {
            let outcome = if lcf.dry_run() { "let through, dry run" } else { "rejected" };
            ngx_log_error!(
                lcf.log_level(),
                (*(*r).connection).log,
                "ratelimit: cost {cost} exceeds the {capacity} units zone \"{}\" can ever grant, \
                 request {outcome}",
                zone.name
            );
            // A rejection by this zone, for the access log and the metrics, like any other.
            ctx.status = Status::Rejected;
            ctx.quota = Some((ctx.zones.len() - 1, 0, 0));
            ctx.beyond_capacity = true;
            return apply(ctx, lcf, mcf);
        }
    }
    if ctx.zones.is_empty() {
        ctx.status = Status::Skipped;
        ctx.applied = true;
        return NGX_DECLINED as ngx_int_t;
    }
    // What Redis said changed since the last request, heard first.
    hear_changes(mcf);
    // A dry run asks Redis every time, so what it reports is what Redis would decide now.
    if lcf.deny_cache() && !lcf.dry_run() && rejected_from_memory(ctx, mcf) {
        return apply(ctx, lcf, mcf);
    }
    let leasing = !lcf.dry_run() && ctx.zones.iter().any(|z| mcf.zones[z.zone].lease.is_some());
    if leasing && admitted_from_reservations(ctx, mcf) {
        return apply(ctx, lcf, mcf);
    }

    // One clock per decision: the gateway's only when every zone asks for it.
    let now = ctx.zones.iter().all(|z| mcf.zones[z.zone].clock == Clock::Nginx).then(|| wall_ms());
    ctx.args = EncodedArgs::new(ctx.zones.iter().map(|z| z.args(&mcf.zones[z.zone])), now);

    if redis.cluster && ctx.args.slot().is_none() {
        // Redis would refuse it (CROSSSLOT), and splitting it would not be atomic.
        let zones = ctx.zones.iter().map(|z| format!("\"{}\"", mcf.zones[z.zone].name));
        fail(ctx, lcf, mcf, Failure::CrossSlot(zones.collect::<Vec<_>>().join(", ")));
        return apply(ctx, lcf, mcf);
    }
    if !submit(mcf, &mut ctx.waiter, &ctx.args) {
        decide(ctx, lcf, mcf);
        return apply(ctx, lcf, mcf);
    }
    ngx_add_timer(&mut ctx.ev, redis.timeout);
    // Notice a client that goes away while it waits (499), as limit_req's delay does.
    (*r).read_event_handler = Some(ngx_http_test_reading);
    NGX_AGAIN as ngx_int_t
}

/// A key value for Redis Cluster, in the request's pool: only the braces of the configuration
/// make a hash tag (`crate::key::cluster_value`). `whole` is the template evaluated at once.
unsafe fn cluster_key_value(
    r: *mut ngx_http_request_t,
    zone: &Zone,
    whole: &'static [u8],
) -> Option<&'static [u8]> {
    let bytes = if zone.key_pieces.is_empty() {
        if !whole.iter().any(|&b| matches!(b, b'{' | b'}' | b'%')) {
            return Some(whole);
        }
        cluster_value(core::iter::once(Piece::Text(whole)))
    } else {
        let mut pieces = Vec::with_capacity(zone.key_pieces.len());
        for piece in &zone.key_pieces {
            pieces.push(match *piece {
                KeyPiece::Brace(b) => Piece::Brace(b),
                KeyPiece::Value(cv) => {
                    let v = eval(r, cv)?;
                    // SAFETY: evaluated into the request's pool, which outlives this call.
                    Piece::Text(if v.len == 0 {
                        &[]
                    } else {
                        core::slice::from_raw_parts(v.data, v.len)
                    })
                }
            });
        }
        cluster_value(pieces.into_iter())
    };
    pool_copy(r, &bytes)
}

/// The Redis key of `zone` for the key value a request evaluated (cluster-escaped already), as
/// the request path and `ratelimit_admin` both build it; a value too long is shortened into the
/// request's pool.
pub unsafe fn zone_key(
    r: *mut ngx_http_request_t,
    redis: &RedisConf,
    zone: &Zone,
    value: &'static [u8],
) -> Option<Key<'static>> {
    let value = match shorten(value, &zone.key_text, redis.cluster) {
        Some(short) => pool_copy(r, &short)?,
        None => value,
    };
    Some(if zone.exact_key {
        Key::exact(value)
    } else {
        // SAFETY: the prefix and the zone name live in the configuration, which outlives the
        // request.
        Key::new(
            &*ptr::from_ref(redis.prefix.as_slice()),
            &*ptr::from_ref(zone.name.as_bytes()),
            value,
        )
    })
}

/// `bytes` copied into the request's pool, which outlives everything that keeps them.
pub unsafe fn pool_copy(r: *mut ngx_http_request_t, bytes: &[u8]) -> Option<&'static [u8]> {
    let p = ngx_pnalloc((*r).pool, bytes.len().max(1)) as *mut u8;
    if p.is_null() {
        return None;
    }
    ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
    Some(core::slice::from_raw_parts(p, bytes.len()))
}

/// The gateway's clock: `clock=nginx`'s now, and the time whose calendar period a quota's
/// headers describe.
pub unsafe fn wall_ms() -> u64 {
    let tp = ngx_timeofday();
    tp.sec as u64 * 1000 + tp.msec as u64
}

/// A complex value evaluated into the request's pool.
unsafe fn eval(r: *mut ngx_http_request_t, cv: *mut ngx_http_complex_value_t) -> Option<ngx_str_t> {
    let mut value = ngx_str_t { len: 0, data: ptr::null_mut() };
    (ngx_http_complex_value(r, cv, &mut value) == 0).then_some(value)
}

/// A zone figure for this request. A variable whose value does not parse is an error naming
/// the figure and the value, never a silent default; `Err(None)` is nginx failing to evaluate.
unsafe fn param(
    r: *mut ngx_http_request_t,
    p: Param,
    parse: impl Fn(&str) -> Option<u64>,
    what: &'static str,
) -> Result<u64, Option<(&'static str, String)>> {
    let cv = match p {
        Param::Fixed(n) => return Ok(n),
        Param::Var(cv) => cv,
    };
    let value = eval(r, cv).ok_or(None)?;
    let bytes = value.as_bytes();
    core::str::from_utf8(bytes)
        .ok()
        .and_then(parse)
        .ok_or_else(|| Some((what, String::from_utf8_lossy(bytes).into_owned())))
}

/// Answers from this worker's memory when Redis recently rejected one of the request's zones
/// until later than now: no unit of that zone can free before then.
unsafe fn rejected_from_memory(ctx: &mut Ctx, mcf: &MainConf) -> bool {
    let mut cache = mcf.deny_cache.borrow_mut();
    let Some(cache) = cache.as_mut() else { return false };
    let (now, entries) = (ngx_current_msec as u64, cache.len());
    for (i, z) in ctx.zones.iter().enumerate() {
        let Some(key) = z.cached_key() else { continue };
        if let Some(hit) = cache.check(z.zone, &key, z.cost, z.limit, z.window_ms, now) {
            if ctx.quota.is_none_or(|(_, _, longest)| hit.left_ms > longest) {
                ctx.quota = Some((i, hit.remaining, hit.left_ms));
            }
        }
    }
    mcf.metrics.get().deny_cache_entries(cache.len() as i64 - entries as i64);
    if ctx.quota.is_none() {
        return false;
    }
    ctx.status = Status::RejectedCached;
    true
}

/// Applies what Redis told of its keys: a change makes the deny cache forget the key and has its
/// reservations checked by rid, after `EXISTS` renewed the key's tracking (`crate::lease`); a
/// key found gone, or a flush, stops their spending until then. Lost tracking leaves
/// reservations spendable until it can be had again, and then checks them.
fn hear_changes(mcf: &MainConf) {
    let (mut cache, mut leases) = (mcf.deny_cache.borrow_mut(), mcf.leases.borrow_mut());
    let entries = cache.as_ref().map_or(0, |c| c.len());
    let zones = mcf.zones.len();
    // Sent once the tables are let go: a check the pool refuses is answered at once.
    let mut checks = Vec::new();
    // SAFETY: the worker's cached clock, read on its only thread.
    let now = unsafe { ngx_current_msec } as u64;
    invalidation::drain(|f| {
        if let Some(cache) = cache.as_mut() {
            match f {
                Forget::All | Forget::Unheard => cache.clear(),
                Forget::Key(key) | Forget::Gone(key) => {
                    (0..zones).for_each(|zone| cache.forget(zone, &[key]))
                }
                Forget::Present(_) => {}
            }
        }
        if let Some(leases) = leases.as_mut() {
            match f {
                Forget::All => leases
                    .suspect_all(now, |key| WorkerPool::get(mcf).is_some_and(|p| p.track(&[key]))),
                Forget::Unheard => leases.unverify_all(),
                // Gone or there, the answer is about the key, not about a reservation: one
                // granted after a reset is of the new life, and only its rid can tell.
                Forget::Gone(key) | Forget::Present(key) => {
                    let gone = matches!(f, Forget::Gone(_));
                    let c = leases.checks(zones, key, gone, now);
                    checks.extend(c.into_iter().map(|c| (key.to_vec(), c)));
                }
                Forget::Key(key) if leases.changed(zones, key, now) => {
                    if !WorkerPool::get(mcf).is_some_and(|p| p.track(&[key])) {
                        leases.revoke(zones, key);
                    }
                }
                Forget::Key(_) => {}
            }
        }
    });
    if let Some(cache) = cache.as_ref() {
        mcf.metrics.get().deny_cache_entries(cache.len() as i64 - entries as i64);
    }
    drop((cache, leases));
    checks.into_iter().for_each(|(key, c)| giveback::check(mcf, &key, c));
}

/// `lease=`: admits the request from this worker's reservations when every zone has the units,
/// spending them; otherwise says how many units each leasing zone asks Redis to reserve.
unsafe fn admitted_from_reservations(ctx: &mut Ctx, mcf: &MainConf) -> bool {
    let mut leases = mcf.leases.borrow_mut();
    let leases = leases.get_or_insert_with(|| Leases::new(LEASE_ENTRIES, timer_resolution()));
    let now = ngx_current_msec as u64;
    // A request is admitted from reservations in all its zones or in none, so a location with a
    // zone that does not lease never admits from them: its zones are decided exactly
    // (`nginx -t` warns of it). Its leasing zones still go as reserving nothing, not as plain
    // decisions: a plain write sets the key's TTL to the window, and would end it before the
    // reservations of other requests in it, scored up to their end, have left the window.
    let mixed = !ctx.zones.iter().all(|z| mcf.zones[z.zone].lease.is_some());
    if !mixed {
        let asks: Vec<Ask<'_>> = ctx.zones.iter().map(ZoneReq::ask).collect();
        if let Some(deciding) = leases.try_spend(&asks, now) {
            ctx.quota = Some(deciding);
            ctx.status = Status::PassedLease;
            return true;
        }
    }
    for i in 0..ctx.zones.len() {
        let zone = &mcf.zones[ctx.zones[i].zone];
        let Some(conf) = zone.lease else { continue };
        let life = conf.life_ms(ctx.zones[i].window_ms);
        let log = zone.algorithm == Algorithm::SlidingLog;
        let want = (life > 0).then(|| match mixed {
            true => 0,
            false => leases.want(&ctx.zones[i].ask(), conf.size, life, log, now),
        });
        ctx.zones[i].lease = want.map(|w| (w, life));
    }
    if mixed {
        return false;
    }
    // Expired reservations of these keys go back ahead of the decision, in the same call.
    giveback::send(mcf, leases.take_back());
    // The sweep also forgets idle keys' demand: without it a table filled by keys seen a few
    // times each would stay full, and every new key be decided exactly.
    if !leases.is_empty() {
        giveback::arm(mcf);
    }
    false
}

/// Redis answered the request's zones that asked for reservations.
fn answered(ctx: &Ctx, mcf: &MainConf) {
    if let Some(leases) = mcf.leases.borrow_mut().as_mut() {
        ctx.zones.iter().filter(|z| z.lease.is_some()).for_each(|z| leases.answered(&z.ask()));
    }
}

/// Keeps the units Redis reserved with an admitted decision, for the requests that follow.
/// Reservations Redis does not track for this worker live briefly only, as remembered
/// rejections do: a reset of the key would go unheard.
fn keep_reservations(ctx: &Ctx, mcf: &MainConf, d: &mut Decision) {
    let Some(pool) = WorkerPool::get(mcf) else { return };
    let mut leases = mcf.leases.borrow_mut();
    let Some(leases) = leases.as_mut() else { return };
    for (z, v) in ctx.zones.iter().zip(d.zones.iter_mut()) {
        let mut grant = v.grant;
        if grant.units == 0 {
            continue;
        }
        if !pool.track(&z.key.parts()) {
            grant.life_ms = grant.life_ms.min(UNTRACKED_DENIAL_MS);
        }
        let log = mcf.zones[z.zone].algorithm == Algorithm::SlidingLog;
        let old = leases.granted(&z.ask(), grant, ctx.started as u64, v.remaining, v.reset_ms, log);
        mcf.metrics.get().lease(z.zone, LeaseEvent::Reserved, grant.units);
        // What this worker may still admit includes what it now holds.
        v.remaining += grant.units;
        giveback::send(mcf, old);
    }
    giveback::arm(mcf);
}

/// Notes the slots Redis granted an admitted request in its concurrency zones, so that the
/// sweep renews them while it runs and `cleanup` releases them when it ends.
fn take_slots(ctx: &mut Ctx, mcf: &MainConf) {
    let mut slots = mcf.slots.borrow_mut();
    for z in ctx.zones.iter().filter(|z| mcf.zones[z.zone].concurrency()) {
        let key = z.key.parts().concat();
        let Some(slot) = z.slot(&key) else { continue };
        // Renewals count from when the decision was sent: Redis scored the slot later.
        let id = slots.get_or_insert_with(Slots::new).take(z.zone, slot, ctx.started as u64);
        ctx.slots.push(id);
        mcf.metrics.get().slot(z.zone, SlotEvent::Taken);
    }
    drop(slots);
    if !ctx.slots.is_empty() {
        giveback::arm(mcf);
    }
}

/// The request ended: its slots go back to Redis, once (the cleanup runs twice), and those this
/// worker counted by itself (`ratelimit_fail local`) back to its count.
unsafe fn release_slots(ctx: &mut Ctx) {
    if ctx.slots.is_empty() && ctx.local_slots.is_empty() {
        return;
    }
    // SAFETY: set with the slots from the request's configuration, which outlives it.
    let mcf = &*ctx.mcf;
    for (zone, key) in core::mem::take(&mut ctx.local_slots) {
        if let Some(slots) = mcf.slots.borrow_mut().as_mut() {
            slots.local_release(zone, &key);
        }
    }
    for id in core::mem::take(&mut ctx.slots) {
        giveback::release(mcf, id);
    }
}

/// Remembers the zones that rejected a request, for `rejected_from_memory`: until the retry-after
/// when Redis tracks the key for this worker (a change to it is heard of at once), briefly
/// otherwise.
fn remember_rejection(ctx: &Ctx, mcf: &MainConf, d: &Decision) {
    let Some(pool) = WorkerPool::get(mcf) else { return };
    let mut cache = mcf.deny_cache.borrow_mut();
    let cache = cache.get_or_insert_with(|| DenyCache::new(DENY_CACHE_ENTRIES));
    let entries = cache.len();
    for (z, v) in ctx.zones.iter().zip(&d.zones) {
        if let Some(key) = z.cached_key().filter(|_| !v.ok) {
            let until_ms = match mcf.zones[z.zone].algorithm {
                Algorithm::Balance => UNTIL_CHANGED,
                _ => ctx.started as u64 + v.reset_ms,
            };
            // Not tracked yet (the tracker is connecting) or not at all (refused): a change
            // would go unheard, so it is answered from memory briefly only.
            let kept_until_ms = match pool.track(&key) {
                true => until_ms,
                false => ctx.started as u64 + UNTRACKED_DENIAL_MS,
            };
            let (cost, limit, window_ms, remaining) = (z.cost, z.limit, z.window_ms, v.remaining);
            let denial = Denial { until_ms, kept_until_ms, cost, limit, window_ms, remaining };
            cache.insert(z.zone, &key, denial);
        }
    }
    mcf.metrics.get().deny_cache_entries(cache.len() as i64 - entries as i64);
}

unsafe fn new_ctx(r: *mut ngx_http_request_t) -> Option<NonNull<Ctx>> {
    let pool = Pool::from_ngx_pool((*r).pool);
    let ctx = NonNull::new(pool.allocate(Ctx {
        r,
        status: Status::Pending,
        applied: false,
        waiter: Waiter { result: None, token: None, ev: ptr::null_mut() },
        ev: core::mem::zeroed(),
        args: EncodedArgs::default(),
        retries: Retries::default(),
        started: 0,
        asked_ms: 0,
        zones: Vec::new(),
        beyond_capacity: false,
        quota: None,
        slots: Vec::new(),
        local_slots: Vec::new(),
        mcf: RateLimit::main_conf(&*r).map_or(ptr::null(), ptr::from_ref),
    }))?;
    // The request's cleanup detaches from Redis as soon as the request ends or is terminated;
    // the pool's runs again (harmlessly) after the access log and anchors the context for
    // `find_ctx`: `ngx_http_free_request` empties `r->cleanup` before the log phase.
    let cln = ngx_http_cleanup_add(r, 0);
    let anchor = ngx_pool_cleanup_add((*r).pool, 0);
    if cln.is_null() || anchor.is_null() {
        return None;
    }
    (*cln).handler = Some(cleanup);
    (*cln).data = ctx.as_ptr() as *mut c_void;
    (*anchor).handler = Some(cleanup);
    (*anchor).data = ctx.as_ptr() as *mut c_void;
    let c = &mut *ctx.as_ptr();
    attach(&mut c.waiter, &mut c.ev, on_event, r);
    *(*r).ctx.add(RateLimit::module().ctx_index) = ctx.as_ptr() as *mut c_void;
    Some(ctx)
}

/// The main request's context, also after an internal redirect has cleared `r->ctx`.
pub unsafe fn find_ctx(r: *mut ngx_http_request_t) -> Option<NonNull<Ctx>> {
    let r = (*r).main;
    let slot = (*r).ctx.add(RateLimit::module().ctx_index);
    if let Some(ctx) = NonNull::new(*slot as *mut Ctx) {
        return Some(ctx);
    }
    let mut cln = (*(*r).pool).cleanup;
    while !cln.is_null() {
        // Both sides name the same function of this crate, taken in this file.
        if (*cln).handler.is_some_and(|h| ptr::fn_addr_eq(h, cleanup as unsafe extern "C" fn(_))) {
            *slot = (*cln).data;
            return NonNull::new((*cln).data as *mut Ctx);
        }
        cln = (*cln).next;
    }
    None
}

/// Runs when the request ends or is terminated (client gone, shutdown): detaches from Redis at
/// once and releases the request's concurrency slots. `ngx_http_free_request` runs it for every
/// main request, aborted ones and reset HTTP/2 streams included, just before the access log
/// (after a lingering close, if there is one). The context itself stays readable for the
/// access log. Idempotent: it runs twice.
unsafe extern "C" fn cleanup(data: *mut c_void) {
    let ctx = &mut *(data as *mut Ctx);
    if let Some(token) = ctx.waiter.token.take() {
        // On the wire already: Redis may grant its slots to no one.
        if WorkerPool::cancel(token) {
            orphan_slots(ctx);
        }
    } else if ctx.status == Status::Pending && ctx.waiter.result.take().is_some() {
        // Answered, the answer not read yet (its event still posted): it may grant slots.
        orphan_slots(ctx);
    }
    detach(&mut ctx.waiter, &mut ctx.ev);
    release_slots(ctx);
}

/// The request stops waiting for a decision Redis may still run (its client went away, its
/// deadline passed, its connection was lost): a slot that decision grants is released by the
/// sweep, instead of lapsing unrenewed.
unsafe fn orphan_slots(ctx: &Ctx) {
    // SAFETY: the request's configuration outlives it (null only if it had none).
    let Some(mcf) = ctx.mcf.as_ref() else { return };
    let zones: Vec<&ZoneReq> =
        ctx.zones.iter().filter(|z| mcf.zones[z.zone].concurrency()).collect();
    let keys: Vec<Vec<u8>> = zones.iter().map(|z| z.key.parts().concat()).collect();
    let slots = zones.iter().zip(&keys).filter_map(|(z, key)| Some((z.zone, z.slot(key)?)));
    giveback::orphan(mcf, slots, ngx_current_msec as u64);
}

/// Makes `ev` the event that a completion of `waiter` posts, and that the deadline timer of
/// request `r`'s decision fires, both running `handler`.
pub unsafe fn attach(
    waiter: &mut Waiter,
    ev: &mut ngx_event_t,
    handler: unsafe extern "C" fn(*mut ngx_event_t),
    r: *mut ngx_http_request_t,
) {
    waiter.ev = ev;
    ev.handler = Some(handler);
    // Timer code logs `ev->data` as a connection; the context is found with container_of.
    ev.data = (*r).connection as *mut c_void;
    ev.log = (*(*r).connection).log;
}

/// Leaves the pool and the event loop: nothing will complete or wake this waiter any more.
pub unsafe fn detach(waiter: &mut Waiter, ev: &mut ngx_event_t) {
    if let Some(token) = waiter.token.take() {
        WorkerPool::cancel(token);
    }
    if ev.timer_set() != 0 {
        ngx_del_timer(ev);
    }
    if ev.posted() != 0 {
        ngx_delete_posted_event(ev);
    }
}

/// Completion or deadline of a pending decision.
unsafe extern "C" fn on_event(ev: *mut ngx_event_t) {
    let ctx = &mut *ngx::ngx_container_of!(ev, Ctx, ev);
    let r = ctx.r;
    let (Some(lcf), Some(mcf)) = (RateLimit::location_conf(&*r), RateLimit::main_conf(&*r)) else {
        return;
    };
    let redis = mcf.redis.as_ref().expect("a decision was sent");
    if (*ev).timedout() != 0 {
        (*ev).set_timedout(0);
        if core::mem::take(&mut ctx.retries.waiting) {
            // TRYAGAIN's pause is over.
            if let Follow::Resent = again(mcf, &mut ctx.waiter, &ctx.args, &ctx.retries) {
                ngx_add_timer(ev, time_left(ctx, redis).max(1) as ngx_msec_t);
                return;
            }
        } else if ctx.waiter.result.is_none() || asks_again(&ctx.waiter.result) {
            // The deadline met no reply, or one that would need another round trip (the two
            // can arrive in one event-loop iteration): either way the time is up.
            if let Some(token) = ctx.waiter.token.take() {
                WorkerPool::timed_out(token);
            }
            ctx.waiter.result = Some(Err(RedisError::Timeout));
        }
    }
    if ctx.waiter.result.is_none() {
        return;
    }
    match follow(mcf, &mut ctx.waiter, &ctx.args, &mut ctx.retries) {
        Follow::Resent => return,
        Follow::Later => {
            if time_left(ctx, redis) > TRYAGAIN_DELAY as ngx_msec_int_t {
                ctx.retries.waiting = true;
                if ctx.ev.posted() != 0 {
                    ngx_delete_posted_event(&mut ctx.ev);
                }
                // nginx keeps an armed timer that is within 300 ms of the new one.
                ngx_del_timer(&mut ctx.ev);
                ngx_add_timer(&mut ctx.ev, TRYAGAIN_DELAY);
                return;
            }
        }
        Follow::No => {}
    }
    // The reply and the deadline can arrive in the same event-loop iteration.
    if ctx.ev.timer_set() != 0 {
        ngx_del_timer(&mut ctx.ev);
    }
    if ctx.ev.posted() != 0 {
        ngx_delete_posted_event(&mut ctx.ev);
    }
    decide(ctx, lcf, mcf);

    let c = (*r).connection;
    let log_ctx = (*(*c).log).data as *mut ngx_http_log_ctx_t;
    (*log_ctx).current_request = r;
    (*r).read_event_handler = Some(ngx_http_block_reading);
    if let Some(run_phases) = (*r).write_event_handler {
        run_phases(r);
    }
    // `r` may be freed by now; only the connection is used.
    ngx_http_run_posted_requests(c);
}

/// What is left of the decision's `timeout`.
unsafe fn time_left(ctx: &Ctx, redis: &RedisConf) -> ngx_msec_int_t {
    let due = ctx.started.wrapping_add(redis.timeout);
    due.wrapping_sub(ngx_current_msec) as ngx_msec_int_t
}

/// Turns the waiter's result into the request's status.
unsafe fn decide(ctx: &mut Ctx, lcf: &LocConf, mcf: &MainConf) {
    let Some(result) = ctx.waiter.result.take() else { return };
    let failure = match result.map(|reply| script::decode_reply(&reply, &ctx.args)) {
        Ok(Ok(mut d)) => {
            if ctx.zones.iter().any(|z| z.lease.is_some()) {
                answered(ctx, mcf);
            }
            if !d.allowed && lcf.deny_cache() {
                remember_rejection(ctx, mcf, &d);
            }
            if d.allowed && d.zones.iter().any(|z| z.grant.units > 0) {
                keep_reservations(ctx, mcf, &mut d);
            }
            if d.allowed {
                take_slots(ctx, mcf);
            }
            return record(ctx, &d);
        }
        Ok(Err(ReplyError::Redis(msg))) if msg.starts_with("WRONGTYPE") => {
            Failure::WrongType(wrong_type_keys(ctx))
        }
        Ok(Err(e)) => Failure::Reply(e),
        Err(e) => {
            // Lost on the wire or in Redis's hands (a timeout is one): it may still run there.
            let written = matches!(
                e,
                RedisError::Timeout
                    | RedisError::Closed
                    | RedisError::Io
                    | RedisError::Protocol(_)
                    | RedisError::UnexpectedReply
            );
            if written {
                orphan_slots(ctx);
            }
            Failure::Redis(e)
        }
    };
    fail(ctx, lcf, mcf, failure);
}

/// The keys of a decision that met `WRONGTYPE`, for the log: the operator must find and remove
/// whatever else was stored there.
fn wrong_type_keys(ctx: &Ctx) -> String {
    let keys = ctx.zones.iter().map(|z| {
        let bytes: Vec<u8> = z.key.parts().concat();
        format!("\"{}\"", String::from_utf8_lossy(&bytes).escape_debug())
    });
    keys.collect::<Vec<_>>().join(", ")
}

/// Applies the fail policy; the reason is logged at most once a second per worker.
unsafe fn fail(ctx: &mut Ctx, lcf: &LocConf, mcf: &MainConf, failure: Failure) {
    let mut no_room = false;
    ctx.status = match lcf.fail() {
        FailPolicy::Open => Status::FailedOpen,
        FailPolicy::Closed => Status::FailedClosed,
        // A bad limit or cost leaves nothing to enforce locally: closed, never unlimited.
        FailPolicy::Local if matches!(failure, Failure::BadValue(..)) => Status::FailedClosed,
        // A key that cannot be counted is refused: admitting it would leave it unlimited.
        FailPolicy::Local => decide_locally(ctx, lcf, mcf).unwrap_or_else(|| {
            no_room = true;
            Status::FailedClosed
        }),
    };
    // Bad variable values (per figure and zone) and a full local table have their own
    // throttles: an outage must not hide them, nor they it, nor one bad figure another.
    let now = ngx_current_msec as u64;
    let logged = match failure {
        Failure::BadValue(what, zone, ..) => {
            (*ptr::addr_of_mut!(BAD_VALUE_LOG)).allow((what, zone), now)
        }
        _ if no_room => (*ptr::addr_of_mut!(NO_ROOM_LOG)).allow((), now),
        _ => (*ptr::addr_of_mut!(FAILURE_LOG)).allow((), now),
    };
    if logged {
        let outcome = match ctx.status {
            _ if no_room => {
                "rejected by ratelimit_fail local: no room for a new key in \
                 ratelimit_fail_local_size"
            }
            Status::FailedOpen => "passed by ratelimit_fail",
            Status::FailedClosed => "rejected by ratelimit_fail",
            _ => "decided by this worker alone by ratelimit_fail",
        };
        ngx_log_error!(
            NGX_LOG_ERR,
            (*(*ctx.r).connection).log,
            "ratelimit: {failure}, request {outcome}"
        );
    }
}

/// `ratelimit_fail local`: this worker's share of each zone, from its own memory: a rate zone's
/// from the local limiter's counters, a concurrency zone's from this worker's requests in flight
/// (a request rejected by one holds nothing and is charged nothing in the others, as with Redis).
/// The share becomes the zones' limit for this request, so headers and variables report what
/// was enforced. `None` when a key is new and the table is full of counters that still count.
unsafe fn decide_locally(ctx: &mut Ctx, lcf: &LocConf, mcf: &MainConf) -> Option<Status> {
    let share = lcf.fail_local_share().unwrap_or_else(|| worker_processes());
    for z in &mut ctx.zones {
        z.limit = (z.limit / share).max(1);
    }
    let conc = |z: &ZoneReq| mcf.zones[z.zone].concurrency();
    let keys: Vec<Vec<u8>> = ctx.zones.iter().map(|z| z.key.parts().concat()).collect();
    let mut slots = mcf.slots.borrow_mut();
    let slots = slots.get_or_insert_with(Slots::new);
    let parts: Vec<LocalPart> = ctx
        .zones
        .iter()
        .zip(&keys)
        .map(|(z, key)| match conc(z) {
            true => LocalPart::Concurrency {
                in_flight: slots.local_in_flight(z.zone, key),
                limit: z.limit,
            },
            false => LocalPart::Rate { limit: z.limit },
        })
        .collect();
    let room = parts.iter().all(|p| match *p {
        LocalPart::Concurrency { in_flight, limit } => in_flight < limit,
        LocalPart::Rate { .. } => true,
    });
    let rates: Vec<LocalZone<'_>> = ctx
        .zones
        .iter()
        .filter(|z| !conc(z))
        .map(|z| LocalZone {
            zone: z.zone,
            key: z.value(),
            limit: z.limit,
            window_ms: z.window_ms,
            cost: z.cost,
        })
        .collect();
    let rate = match room && !rates.is_empty() {
        true => {
            let mut local = mcf.local.borrow_mut();
            let local = local.get_or_insert_with(|| LocalLimiter::with_memory(mcf.local_size()));
            Some(local.decide(&rates, ngx_current_msec as u64)?)
        }
        false => None,
    };
    let d = local_decision(&parts, rate.as_ref());
    if d.allowed {
        for (z, key) in ctx.zones.iter().zip(keys).filter(|(z, _)| conc(z)) {
            slots.local_take(z.zone, &key);
            ctx.local_slots.push((z.zone, key));
        }
    }
    record(ctx, &d);
    Some(if d.allowed { Status::PassedLocal } else { Status::RejectedLocal })
}

/// The core module's configuration of the running cycle, if any.
unsafe fn core_conf() -> Option<&'static ngx_core_conf_t> {
    // SAFETY: the core module's configuration is the cycle's first, set before workers start and
    // never changed in a worker.
    (*(*ngx_cycle).conf_ctx.add(ngx_core_module.index) as *const ngx_core_conf_t).as_ref()
}

/// `worker_processes` of the running configuration: the default share of a zone per worker.
unsafe fn worker_processes() -> u64 {
    core_conf().map_or(1, |c| (c.worker_processes as u64).max(1))
}

/// `timer_resolution` (0 when not set): how long nginx's cached clock may go without an update.
unsafe fn timer_resolution() -> u64 {
    core_conf().map_or(0, |c| c.timer_resolution as u64)
}

/// Why a decision failed; formatted only when it is logged, not once per request of an outage.
enum Failure {
    Redis(RedisError),
    Reply(ReplyError),
    /// A limit, window or cost variable whose value is not a valid number: (what, zone index,
    /// zone name, value).
    BadValue(&'static str, usize, String, String),
    /// One of these keys holds data that is not ours.
    WrongType(String),
    /// The keys of these zones are in different Cluster slots.
    CrossSlot(String),
}

impl core::fmt::Display for Failure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Failure::Redis(e) => write!(f, "redis {e}"),
            Failure::Reply(ReplyError::NoScript) => f.write_str("redis replied NOSCRIPT twice"),
            Failure::Reply(ReplyError::Redis(msg)) => write!(f, "redis replied \"{msg}\""),
            Failure::Reply(ReplyError::Unexpected) => {
                f.write_str("unexpected reply from the script")
            }
            Failure::WrongType(keys) => {
                write!(f, "redis replied WRONGTYPE: one of the keys {keys} holds other data")
            }
            Failure::CrossSlot(zones) => write!(
                f,
                "the keys of zones {zones} are in different redis cluster slots; give them a \
                 common hash tag"
            ),
            Failure::BadValue(what, _, zone, value) => {
                write!(f, "invalid {what} \"{}\" for zone \"{zone}\"", value.escape_debug())
            }
        }
    }
}

fn record(ctx: &mut Ctx, d: &Decision) {
    let i = d.deciding_zone();
    let z = d.zones[i];
    ctx.status = if d.allowed { Status::Passed } else { Status::Rejected };
    ctx.quota = Some((i, z.remaining, z.reset_ms));
}

/// Failure lines at most once a second per worker (and per figure and zone for bad values).
static mut FAILURE_LOG: LogThrottle<()> = LogThrottle::new();
static mut BAD_VALUE_LOG: LogThrottle<(&'static str, usize)> = LogThrottle::new();
static mut NO_ROOM_LOG: LogThrottle<()> = LogThrottle::new();

/// Returns the decision to the phase engine, with its headers.
unsafe fn apply(ctx: &mut Ctx, lcf: &LocConf, mcf: &MainConf) -> ngx_int_t {
    ctx.applied = true;
    let r = ctx.r;
    // A cost beyond the zone's capacity was logged as such already.
    let decided_by_redis = ctx.status == Status::Rejected && !ctx.beyond_capacity;
    if lcf.dry_run() && matches!(ctx.status, Status::Rejected | Status::RejectedLocal) {
        ctx.status = Status::RejectedDryRun;
    }
    mcf.metrics.get().request(ctx.status, ctx.zones.iter().map(|z| (z.zone, z.cost)));
    let rejected =
        matches!(ctx.status, Status::Rejected | Status::RejectedCached | Status::RejectedLocal);
    // A dry run must not change what clients see: headers only when configured explicitly.
    // A cost beyond capacity gets none: no wait admits it, and no figure would say so.
    let headers = (lcf.headers.is_some() || !lcf.dry_run()) && !ctx.beyond_capacity;
    if let Some((i, remaining, reset_ms)) = ctx.quota {
        let z = &ctx.zones[i];
        let name = mcf.zones[z.zone].name.as_str();
        let (limit, window_ms) = (z.limit, z.window_ms);
        let concurrency = mcf.zones[z.zone].concurrency();
        let quota = Quota {
            zone: name,
            limit,
            // A concurrency zone announces no window, yet waiting does free slots: its
            // rejection says when to retry.
            window_ms: if concurrency { window_ms } else { policy_window(mcf, z) },
            remaining,
            reset_ms,
            rejected,
        };
        let policies = ctx.zones.iter().map(|z| Policy {
            zone: &mcf.zones[z.zone].name,
            limit: z.limit,
            window_ms: policy_window(mcf, z),
        });
        if headers
            && headers::format(lcf.headers(), &quota, policies, |name, value| {
                add_header(r, name, value)
            })
            .is_none()
        {
            return NGX_ERROR as ngx_int_t;
        }
        // A rejection from memory repeats one already logged; local ones are the outage's.
        if decided_by_redis {
            let dry_run = if rejected { "" } else { ", dry run," };
            let log = (*(*r).connection).log;
            if mcf.zones[z.zone].algorithm == Algorithm::Balance {
                // No window and no wait: what is left against what was asked is the story.
                let cost = z.cost;
                ngx_log_error!(
                    lcf.log_level(),
                    log,
                    "ratelimit: limiting requests{dry_run} by zone \"{name}\", balance \
                     {remaining} of {limit} left, cost {cost}"
                );
            } else {
                let per =
                    if concurrency { "in flight".into() } else { format!("per {window_ms}ms") };
                ngx_log_error!(
                    lcf.log_level(),
                    log,
                    "ratelimit: limiting requests{dry_run} by zone \"{name}\", limit {limit} \
                     {per}, retry in {reset_ms}ms"
                );
            }
        }
    }
    match ctx.status {
        _ if rejected => {
            let zone_status = ctx.quota.and_then(|(i, ..)| mcf.zones[ctx.zones[i].zone].status);
            zone_status.map_or(lcf.status() as ngx_int_t, |s| s as ngx_int_t)
        }
        Status::FailedClosed => NGX_HTTP_SERVICE_UNAVAILABLE as ngx_int_t,
        _ => NGX_DECLINED as ngx_int_t,
    }
}

/// The window the headers announce: none for a balance, which only an operator refills, nor for
/// a concurrency zone, whose slots are held as long as their requests run.
fn policy_window(mcf: &MainConf, z: &ZoneReq) -> u64 {
    if matches!(mcf.zones[z.zone].algorithm, Algorithm::Balance | Algorithm::Concurrency) {
        0
    } else {
        z.window_ms
    }
}

/// Adds a response header; it is sent with an allowed response and with the rejection alike.
unsafe fn add_header(r: *mut ngx_http_request_t, name: &'static str, value: &[u8]) -> Option<()> {
    let h = ngx_list_push(&mut (*r).headers_out.headers) as *mut ngx_table_elt_t;
    if h.is_null() {
        return None;
    }
    // Zeroed first: newer nginx versions chain headers through fields older ones lack.
    ptr::write_bytes(h, 0, 1);
    let pool = (*r).pool;
    let data = ngx_pnalloc(pool, value.len() + name.len()) as *mut u8;
    if data.is_null() {
        return None;
    }
    ptr::copy_nonoverlapping(value.as_ptr(), data, value.len());
    let lowcase = data.add(value.len());
    for (i, b) in name.bytes().enumerate() {
        *lowcase.add(i) = b.to_ascii_lowercase();
    }
    (*h).hash = 1;
    (*h).key = ngx_str_t { len: name.len(), data: name.as_ptr() as *mut u8 };
    (*h).value = ngx_str_t { len: value.len(), data };
    (*h).lowcase_key = lowcase;
    Some(())
}

/// The deciding zone's name, limit, remaining and reset in seconds, for the variables.
pub fn quota_figures<'a>(ctx: &Ctx, mcf: &'a MainConf) -> Option<(&'a str, u64, u64, u64)> {
    let (i, remaining, reset_ms) = ctx.quota?;
    let z = &ctx.zones[i];
    Some((&mcf.zones[z.zone].name, z.limit, remaining, headers::ceil_secs(reset_ms)))
}

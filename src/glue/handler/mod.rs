//! The access-phase handler: one Redis script call per main request, suspended without holding
//! the worker, resumed by a posted event, and decided once even across internal redirects.
//! Here: the request's context and its life (start, wake-up, cleanup) and the reading of Redis's
//! answer; what the worker remembers between requests is [`memory`], a failure's handling
//! [`fail`], and the answer handed back to nginx [`respond`].

use core::ffi::c_void;
use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_current_msec, ngx_cycle, ngx_http_cleanup_add, ngx_http_request_t, ngx_http_test_reading,
    ngx_int_t, ngx_msec_t, ngx_palloc, ngx_pool_cleanup_t, NGX_AGAIN, NGX_DECLINED, NGX_ERROR,
};
use ngx::http::{HttpModule, HttpModuleLocationConf, HttpModuleMainConf};
use ngx::ngx_log_error;

use crate::decide::headers;
use crate::decide::key::{cluster_value, Key, Piece};
use crate::decide::key_buf::KeyBuf;
use crate::decide::lease::{Ask, Figures, GiveBack, Grant};
use crate::decide::params::{parse_cost, parse_limit, parse_window};
use crate::decide::quota::Period;
use crate::decide::script::{self, Decision, EncodedFigures, Place, SlotRef, ZoneArgs};
use crate::decide::status::Status;
use crate::decide::table_key::{TableHead, TableKey};
use crate::glue::conf::{Clock, FailPolicy, KeyPiece, LocConf, MainConf, Param, Zone};
use crate::glue::giveback;
use crate::glue::module::RateLimit;
use crate::glue::request::{attach, detach, pool_copy, wall_ms, zone_key, PoolVec};
use crate::glue::value::Value;
use crate::redis::pool::{RedisError, WorkerPool};

mod fail;
mod memory;
mod parts;
mod respond;
mod wake;

use fail::{fail, Failure};
use memory::{
    admitted_from_reservations, answered, hear_changes, keep_reservations, rejected_from_memory,
    release_slots, remember_rejection, take_slots,
};
use parts::{answer, ask, asked_parts, decide_several, part_ptr, undo, Part};
use respond::apply;
use wake::on_event;

/// Per main request, in its pool. Found again after an internal redirect through the pool's
/// cleanup list, because redirects wipe `r->ctx`.
pub struct Ctx {
    pub r: *mut ngx_http_request_t,
    pub status: Status,
    /// Set once the decision has been returned to the phase engine; later passes (internal
    /// redirects) let the request through untouched, as limit_req does.
    applied: bool,
    /// Went past this worker's memory (`cleanup_at_end`): only such a request can have parts
    /// on their way, slots, or a wait to end, or fill a list or part of this context.
    asked: bool,
    /// The decision asked of the first (often the only) backend of the location's zones, from
    /// when it is asked: a request answered from memory never writes its event and buffers ...
    part: Option<Part>,
    /// ... and of each other one, asked at the same time (`LocConf::several`).
    more: PoolVec<Part>,
    /// When the decision was asked for: a rejection is remembered from then, so the memory
    /// never outlasts what Redis said.
    started: ngx_msec_t,
    /// The same instant on the wall clock, in ms: `$ratelimit_time`.
    pub asked_ms: u64,
    /// The zones that decide this request, in script order, in the request's pool.
    pub zones: PoolVec<ZoneReq>,
    /// Room for the values of the request's headers (`headers::room` bytes when it started),
    /// made with the context: a request allocates once in its pool, not once per list.
    values: (*mut u8, usize),
    /// The deciding zone (an index into `zones`), its remaining units and reset in ms.
    pub quota: Option<(usize, u64, u64)>,
    /// Rejected without asking Redis, its cost above anything the deciding zone can grant: no
    /// wait admits it, so no header may suggest one.
    beyond_capacity: bool,
    /// The configuration that took them, for `cleanup`: it outlives the request.
    mcf: *const MainConf,
    /// `delay=`: how long the request waits for its turn, in ms (0: none) ...
    pub wait_ms: u64,
    /// ... and whether it is waiting now, on `ev`'s timer.
    waiting: bool,
    /// Counted in `MainConf::waiting`, from asking with a wait allowed until it is decided
    /// without one or stops waiting: counted from the ask, or the HTTP/2 streams a worker reads
    /// in one event would all be let wait.
    in_waiting_count: bool,
    /// `$ratelimit_settled`, once the request's settlement is worked out (`None` before).
    pub settled: Option<u64>,
}

// What a request waiting for its turn (`delay=`) holds besides nginx's own request: this context
// and a give-back per zone (docs/delay.md states it).
const _: () = assert!(size_of::<Ctx>() <= 512);

/// One zone as this request sees it: limit, window and cost may come from variables.
#[derive(Clone, Copy)]
pub struct ZoneReq {
    /// Index into the main conf's zones.
    pub zone: usize,
    /// Borrows the configuration and the request's pool, which both outlive the context.
    key: Key<'static>,
    /// The key as the deny cache and the reservations find it, hashed once.
    table_key: TableKey<'static>,
    pub limit: u64,
    pub window_ms: u64,
    cost: u64,
    /// `member=request_id`: `$request_id`, in the request's pool.
    member: Option<&'static [u8]>,
    /// `lease=`: the units to reserve with this request's decision, and their life in ms.
    lease: Option<(u64, u64)>,
    /// In a location that may delay: this zone's `delay=` in ms (0 without).
    delay: Option<u64>,
    /// `settle=`: the value that replaces the cost when the request ends.
    pub settle: Option<Value>,
    /// Its `ratelimit` line's figures, encoded once (in the configuration).
    figures: Option<&'static EncodedFigures>,
    /// Where Redis recorded the request in this zone: a delayed request's place, to give back
    /// if it ends before its turn (client gone), or the estimate of a zone with `settle=`;
    /// nothing (0 units) otherwise. Kept as Redis answered it: the key is copied only for a
    /// give-back or a settlement.
    pub placed: Grant,
    /// A concurrency zone's slot the request holds (its id in the worker's `Slots`; 0: none),
    /// released by `cleanup` when the request ends.
    held: u64,
    /// `ratelimit_fail local`: a concurrency zone this worker admitted the request in by itself,
    /// released by `cleanup` too.
    held_locally: bool,
}

impl ZoneReq {
    fn value(&self) -> &[u8] {
        self.key.value()
    }

    /// The key as the deny cache knows it, the whole Redis key as Redis names it in its
    /// invalidations: short values only.
    fn cached_key(&self) -> Option<&TableKey<'static>> {
        Some(&self.table_key).filter(|_| self.value().len() <= DENY_CACHE_MAX_KEY)
    }

    fn args(&self, zone: &Zone, several: bool) -> ZoneArgs<'static> {
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
            delay: self.delay,
            figures: self.figures,
            place: match self.settle {
                Some(_) => Place::Settle,
                // Given back at once if another backend refuses the request.
                None if several && zone.undoable() => Place::Undo,
                None => Place::No,
            },
        }
    }

    /// A concurrency zone's slot as its release or renewal names it.
    fn slot(&self) -> Option<SlotRef<'_>> {
        let member = self.member?;
        Some(SlotRef { key: self.key.parts(), limit: self.limit, life_ms: self.window_ms, member })
    }

    /// `units` of this zone's place in Redis, to give back (or, settling, to charge more).
    pub fn give_back(&self, units: u64) -> GiveBack {
        let (limit, window_ms) = (self.limit, self.window_ms);
        let Grant { token, rid, .. } = self.placed;
        let key = KeyBuf::of(&self.key.parts());
        GiveBack { zone: self.zone, key, units, token, rid, limit, window_ms }
    }

    fn ask(&self) -> Ask<'_> {
        let figures = Figures { limit: self.limit, window_ms: self.window_ms };
        Ask { key: self.table_key, cost: self.cost, figures }
    }
}

/// Longer keys are always asked of Redis, so the deny cache stays small whatever clients send.
const DENY_CACHE_MAX_KEY: usize = 256;

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
            // A spurious run of the phase engine while Redis has not answered or the request
            // waits for its turn.
            (false, Status::Pending) => NGX_AGAIN as ngx_int_t,
            (false, _) if ctx.waiting => NGX_AGAIN as ngx_int_t,
            (false, _) => apply(ctx, lcf, mcf),
        };
    }
    start(r, lcf, mcf)
}

unsafe fn start(r: *mut ngx_http_request_t, lcf: &LocConf, mcf: &MainConf) -> ngx_int_t {
    let room = headers::room(lcf.headers(), lcf.limits().len());
    let Some(ctx) = new_ctx(r, lcf.limits().len(), room) else { return NGX_ERROR as ngx_int_t };
    let ctx = &mut *ctx.as_ptr();
    ctx.started = ngx_current_msec;
    ctx.asked_ms = wall_ms();
    // A dry run rejects nothing, so it delays nothing either; a worker with as many requests
    // waiting as it has connections lets no more wait. Both still say a wait of 0 to Redis.
    let may_wait =
        lcf.delaying && !lcf.dry_run() && mcf.waiting.get() < (*ngx_cycle).connection_n as u64;

    for limit in lcf.limits() {
        let zone = &mcf.zones[limit.zone];
        let Some(redis) = mcf.redis(zone.backend) else { return NGX_ERROR as ngx_int_t };
        let Some(value) = zone.key.eval(r) else { return NGX_ERROR as ngx_int_t };
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
            Some(cv) => match cv.eval(r) {
                Some(id) => Some(core::slice::from_raw_parts(id.data, id.len)),
                None => return NGX_ERROR as ngx_int_t,
            },
            None => None,
        };
        let i = limit.zone;
        let head = zone.table_head.get_or_init(|| TableHead::new(i, &key.parts()[..3]));
        let table_key = head.key(key.parts());
        let settle = limit.settle;
        // SAFETY: the configuration outlives the request.
        let figures = limit.figures.as_ref().map(|f| &*ptr::from_ref(f));
        let delay = lcf.delaying.then_some(if may_wait { limit.delay_ms } else { 0 });
        let (limit, lease) = (limit_n, None);
        let placed = Grant::default();
        let z = ZoneReq {
            zone: i,
            key,
            table_key,
            limit,
            window_ms,
            cost,
            member,
            lease,
            delay,
            settle,
            figures,
            placed,
            held: 0,
            held_locally: false,
        };
        // Room was made for every `ratelimit` line of the location.
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
    if lcf.leasing && admitted_from_reservations(ctx, mcf) {
        return apply(ctx, lcf, mcf);
    }

    let backend_of = |zones: &[ZoneReq], i: usize| mcf.zones[zones[i].zone].backend;
    let (n, first) = (ctx.zones.len(), backend_of(&ctx.zones, 0));
    // Its zones are grouped by backend (`merge_loc_conf`): a part per group.
    let split =
        if lcf.several { (1..n).find(|&i| backend_of(&ctx.zones, i) != first) } else { None };
    let pool = mcf.pool(first);
    if split.is_none() && pool.as_ref().is_some_and(|p| p.refusing()) {
        return backend_down(ctx, lcf, mcf);
    }
    if !cleanup_at_end(ctx) {
        return NGX_ERROR as ngx_int_t;
    }
    if may_wait {
        ctx.in_waiting_count = true;
        mcf.waiting.set(mcf.waiting.get() + 1);
    }
    // One clock per decision: the gateway's only when every zone asks for it.
    let now = ctx.zones.iter().all(|z| mcf.zones[z.zone].clock == Clock::Nginx).then(|| wall_ms());
    let me: *mut Ctx = ctx;
    let backend = |i: usize| backend_of(&ctx.zones, i);
    if let Some(split) = split {
        let parts = 1 + (split + 1..n).filter(|&i| backend(i) != backend(i - 1)).count();
        const { assert!(align_of::<Part>() <= align_of::<usize>()) };
        // In the request's pool, aligned by ngx_palloc to a machine word (above).
        let Some(room) = NonNull::new(ngx_palloc((*r).pool, parts * size_of::<Part>()) as _) else {
            return NGX_ERROR as ngx_int_t;
        };
        // SAFETY: room for `parts` parts, as long as the request's pool, which holds `ctx`.
        ctx.more = PoolVec::in_room(room, parts);
        let mut from = split;
        for i in split + 1..=n {
            if i == n || backend(i) != backend(from) {
                ctx.more.push(Part::new(me, backend(from), from, i));
                from = i;
            }
        }
    }
    let part = ctx.part.insert(Part::new(me, first, 0, split.unwrap_or(n)));
    attach(&mut part.waiter, &mut part.ev, on_event, r);
    // A request whose keys are all on one backend (the others' empty) places nothing to undo:
    // no other backend can refuse it.
    let several = split.is_some();
    let sent = ask(&ctx.zones, part, pool, several, mcf, now);
    for part in ctx.more.iter_mut() {
        attach(&mut part.waiter, &mut part.ev, on_event, r);
        ask(&ctx.zones, part, mcf.pool(part.backend), several, mcf, now);
    }
    if !sent && ctx.more.iter().all(|p| p.done) {
        decide(ctx, lcf, mcf);
        leave_waiting_count(ctx, mcf);
        return apply(ctx, lcf, mcf);
    }
    // Notice a client that goes away while it waits (499), as limit_req's delay does.
    (*r).read_event_handler = Some(ngx_http_test_reading);
    NGX_AGAIN as ngx_int_t
}

/// The location's one backend is known down: its `ratelimit_fail` decides at once, as after a
/// refused call, with nothing sent and so nothing to detach from. Only the slots the local
/// fallback takes are released at the request's end (`cleanup_at_end`).
unsafe fn backend_down(ctx: &mut Ctx, lcf: &LocConf, mcf: &MainConf) -> ngx_int_t {
    let holds = lcf.fail() == FailPolicy::Local
        && ctx.zones.iter().any(|z| mcf.zones[z.zone].concurrency());
    if holds && !cleanup_at_end(ctx) {
        return NGX_ERROR as ngx_int_t;
    }
    fail(ctx, lcf, mcf, Failure::Redis(RedisError::Unavailable));
    apply(ctx, lcf, mcf)
}

/// A key value for Redis Cluster, in the request's pool: only the braces of the configuration
/// make a hash tag (`crate::decide::key::cluster_value`). `whole` is the template evaluated at once.
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
                    let v = cv.eval(r)?;
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
    let value = cv.peek(r).ok_or(None)?;
    let bytes = value.as_bytes();
    core::str::from_utf8(bytes)
        .ok()
        .and_then(parse)
        .ok_or_else(|| Some((what, String::from_utf8_lossy(bytes).into_owned())))
}

/// The request's context, and after it its pool cleanup, room for its `zones` and for its
/// headers' values (`values` bytes): one allocation in the request's pool.
unsafe fn new_ctx(r: *mut ngx_http_request_t, zones: usize, values: usize) -> Option<NonNull<Ctx>> {
    type Anchor = ngx_pool_cleanup_t;
    // ngx_palloc aligns to NGX_ALIGNMENT, a machine word; what follows the context is aligned.
    const {
        assert!(align_of::<Ctx>() <= align_of::<usize>());
        assert!(align_of::<Anchor>() <= align_of::<usize>());
        assert!(align_of::<ZoneReq>() <= align_of::<usize>());
        assert!(size_of::<Ctx>() % align_of::<usize>() == 0);
        assert!(size_of::<Anchor>() % align_of::<usize>() == 0);
    };
    let pool = (*r).pool;
    let size = size_of::<Ctx>() + size_of::<Anchor>() + zones * size_of::<ZoneReq>() + values;
    let ctx = NonNull::new(ngx_palloc(pool, size) as *mut Ctx)?;
    // SAFETY: all within the allocation just made, each aligned (above).
    let anchor = ctx.as_ptr().add(1) as *mut Anchor;
    let room = NonNull::new_unchecked(anchor.add(1) as *mut ZoneReq);
    let values = (room.as_ptr().add(zones) as *mut u8, values);
    ctx.as_ptr().write(Ctx {
        r,
        status: Status::Pending,
        applied: false,
        asked: false,
        part: None,
        more: PoolVec::default(),
        started: 0,
        asked_ms: 0,
        zones: PoolVec::in_room(room, zones),
        values,
        beyond_capacity: false,
        quota: None,
        mcf: RateLimit::main_conf(&*r).map_or(ptr::null(), ptr::from_ref),
        wait_ms: 0,
        waiting: false,
        in_waiting_count: false,
        settled: None,
    });
    // The pool's cleanup (`release`) runs `cleanup` after the access log, then drops the
    // context, and anchors it for `find_ctx`; a request that goes to Redis runs `cleanup`
    // sooner as well (`cleanup_at_end`). Linked first in the pool's list, as
    // `ngx_pool_cleanup_add` links the record it allocates; this one lives in the same pool.
    let data = ctx.as_ptr() as *mut c_void;
    anchor.write(Anchor { handler: Some(release), data, next: (*pool).cleanup });
    (*pool).cleanup = anchor;
    *(*r).ctx.add(RateLimit::module().ctx_index) = ctx.as_ptr() as *mut c_void;
    Some(ctx)
}

/// Has `cleanup` detach from Redis and release the request's slots as soon as the request ends
/// or is terminated, before the access log (`ngx_http_free_request` runs `r->cleanup` first):
/// for a request that waits for Redis or may hold slots. One answered from this worker's memory
/// holds nothing, and its pool's `release` is enough.
unsafe fn cleanup_at_end(ctx: &mut Ctx) -> bool {
    let cln = ngx_http_cleanup_add(ctx.r, 0);
    if cln.is_null() {
        return false;
    }
    (*cln).handler = Some(cleanup);
    (*cln).data = ptr::from_mut(ctx) as *mut c_void;
    ctx.asked = true;
    true
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
        if (*cln).handler.is_some_and(|h| ptr::fn_addr_eq(h, release as unsafe extern "C" fn(_))) {
            *slot = (*cln).data;
            return NonNull::new((*cln).data as *mut Ctx);
        }
        cln = (*cln).next;
    }
    None
}

/// The request's pool is destroyed: `cleanup` once more, then the context's own drop (its
/// pending reply, its encoded arguments), in the one pool cleanup a request adds. A request
/// answered from this worker's memory has nothing to release and nothing to free.
unsafe extern "C" fn release(data: *mut c_void) {
    let ctx = &mut *(data as *mut Ctx);
    if ctx.asked {
        cleanup(data);
        // SAFETY: the request's configuration outlives it (null only if it had none).
        if let Some(mcf) = ctx.mcf.as_ref() {
            let mut spare = mcf.spare.borrow_mut();
            for i in 0..asked_parts(ctx) {
                spare.keep_args(core::mem::take(&mut (*part_ptr(ctx, i)).args).into_room());
            }
        }
        ptr::drop_in_place(ctx);
    }
}

/// Runs when the request ends or is terminated (client gone, shutdown): detaches from Redis at
/// once and releases the request's concurrency slots. For a request that went to Redis
/// (`cleanup_at_end`), `ngx_http_free_request` runs it for every main request, aborted ones and
/// reset HTTP/2 streams included, just before the access log (after a lingering close, if there
/// is one); for every request, the pool's `release` runs it after the log. The context itself
/// stays readable for the access log. Idempotent: it may run twice.
unsafe extern "C" fn cleanup(data: *mut c_void) {
    let ctx = &mut *(data as *mut Ctx);
    let several = !ctx.more.is_empty();
    for i in 0..asked_parts(ctx) {
        let part = &mut *part_ptr(ctx, i);
        let range = part.range();
        if let Some(token) = part.waiter.token.take() {
            // On the wire already: Redis may grant its slots to no one.
            if WorkerPool::cancel(token) {
                orphan_slots(ctx, range);
            }
        } else if ctx.status == Status::Pending {
            // Answered, the answer not read yet (its event still posted, or another backend's
            // awaited): it may grant slots, and with several backends it may have placed units.
            if let Some(reply) = part.waiter.result.take() {
                orphan_slots(ctx, range.clone());
                let answer = reply.ok().map(|reply| script::decode_reply(reply.view(), &part.args));
                if let (true, Some(Ok(d))) = (several, answer) {
                    undo(ctx, range, d.allowed, &d.zones);
                }
            }
        }
        detach(&mut part.waiter, &mut part.ev);
    }
    release_slots(ctx);
    if let Some(mcf) = ctx.mcf.as_ref() {
        leave_waiting_count(ctx, mcf);
    }
    if core::mem::take(&mut ctx.waiting) {
        // Gone before its turn: its places go back, as reservations' unspent units do.
        if let Some(mcf) = ctx.mcf.as_ref() {
            mcf.metrics.get().waited();
            let placed = ctx.zones.iter().filter(|z| z.placed.units > 0 && z.placed.rid > 0);
            giveback::send(mcf, placed.map(|z| z.give_back(z.placed.units)));
            // Given back whole: nothing is left to settle.
            ctx.zones.iter_mut().for_each(|z| z.placed = Grant::default());
        }
    }
}

/// The request stops waiting for a decision Redis may still run (its client went away, its
/// deadline passed, its connection was lost), or another backend refused what one admitted: a
/// slot granted in the zones `range` is released by the sweep, instead of lapsing unrenewed.
unsafe fn orphan_slots(ctx: &Ctx, range: core::ops::Range<usize>) {
    // SAFETY: the request's configuration outlives it (null only if it had none).
    let Some(mcf) = ctx.mcf.as_ref() else { return };
    let mut zones = ctx.zones[range].iter().filter(|z| mcf.zones[z.zone].concurrency()).peekable();
    if zones.peek().is_none() {
        return;
    }
    let slots = zones.filter_map(|z| Some((z.zone, z.slot()?)));
    giveback::orphan(mcf, slots, ngx_current_msec as u64);
}

/// Takes the request out of the worker's count of waiting requests, if it is in it.
fn leave_waiting_count(ctx: &mut Ctx, mcf: &MainConf) {
    if core::mem::take(&mut ctx.in_waiting_count) {
        mcf.waiting.set(mcf.waiting.get() - 1);
    }
}

/// Turns the parts' answers into the request's status.
unsafe fn decide(ctx: &mut Ctx, lcf: &LocConf, mcf: &MainConf) {
    if !ctx.more.is_empty() {
        return decide_several(ctx, lcf, mcf);
    }
    let mut d = match answer(ctx, mcf, 0) {
        Ok(d) => d,
        Err(failure) => return fail(ctx, lcf, mcf, failure),
    };
    if ctx.zones.iter().any(|z| z.lease.is_some()) {
        answered(ctx, mcf);
    }
    if !d.allowed && lcf.deny_cache() {
        remember_rejection(ctx, mcf, &d);
    }
    if d.wait_ms > 0 {
        delayed(ctx, &d);
    } else {
        if d.allowed {
            admitted(ctx, mcf, &mut d, core::iter::once(0..ctx.zones.len()));
        }
        record(ctx, &d);
    }
    mcf.spare.borrow_mut().keep_verdicts(d.zones);
}

/// What an admitted request keeps of its decision: a settling zone's place, reservations
/// granted with it, and the slots Redis granted in the zones `slots`.
fn admitted(
    ctx: &mut Ctx,
    mcf: &MainConf,
    d: &mut Decision,
    slots: impl Iterator<Item = core::ops::Range<usize>>,
) {
    // A zone that settles was told to record its estimate as a place.
    for (z, v) in ctx.zones.iter_mut().zip(&d.zones) {
        if z.settle.is_some() {
            z.placed = v.grant;
        }
    }
    if d.zones.iter().any(|z| z.grant.units > 0) {
        keep_reservations(ctx, mcf, d);
    }
    slots.for_each(|range| take_slots(ctx, mcf, range));
}

/// Admitted at a later instant, recorded there in every zone: what gives its places back if the
/// request ends first.
fn delayed(ctx: &mut Ctx, d: &Decision) {
    for (z, v) in ctx.zones.iter_mut().zip(&d.zones) {
        z.placed = v.grant;
    }
    record(ctx, d);
    ctx.status = Status::Delayed;
    ctx.wait_ms = d.wait_ms;
}

fn record(ctx: &mut Ctx, d: &Decision) {
    let i = d.deciding_zone();
    let z = d.zones[i];
    ctx.status = if d.allowed { Status::Passed } else { Status::Rejected };
    ctx.quota = Some((i, z.remaining, z.reset_ms));
}

/// The deciding zone's name, limit, remaining and reset in seconds, for the variables.
pub fn quota_figures<'a>(ctx: &Ctx, mcf: &'a MainConf) -> Option<(&'a str, u64, u64, u64)> {
    let (i, remaining, reset_ms) = ctx.quota?;
    let z = &ctx.zones[i];
    Some((&mcf.zones[z.zone].name, z.limit, remaining, headers::ceil_secs(reset_ms)))
}

//! What the worker remembers between requests, as the access handler uses it: rejections (the
//! deny cache), reservations (`lease=`) and the concurrency slots its requests hold; and what
//! Redis said changed, heard before any of it is trusted.

use std::cell::RefCell;

use ngx::ffi::ngx_current_msec;

use crate::codec::byte_queue::ByteQueue;

use crate::decide::deny_cache::{Denial, DenyCache, UNTIL_CHANGED};
use crate::decide::lease::{Check, Leases};
use crate::decide::script::{Algorithm, Decision};
use crate::decide::slots::Slots;
use crate::decide::status::Status;
use crate::decide::table_key::TableKey;
use crate::glue::conf::{timer_resolution, MainConf};
use crate::glue::giveback;
use crate::metrics::{LeaseEvent, SlotEvent};
use crate::redis::invalidation::{self, Forget};

use super::{Ctx, ZoneReq};

/// Rejections remembered per worker. Each entry costs its key plus about 130 bytes.
const DENY_CACHE_ENTRIES: usize = 10_000;

/// How long a rejection whose key Redis does not track for this worker is remembered: the
/// longest a reset can then go unheard.
const UNTRACKED_DENIAL_MS: u64 = 100;

/// Keys with reservations or demand counts per worker; more keys are decided exactly.
const LEASE_ENTRIES: usize = 10_000;

thread_local! {
    // The checks by rid `hear_changes` sends, each with its key: kept between calls, so that
    // once sized it allocates nothing (a worker is one thread).
    static CHECKS: RefCell<ByteQueue<Check>> = RefCell::default();
}

/// Answers from this worker's memory when Redis recently rejected one of the request's zones
/// until later than now: no unit of that zone can free before then.
pub(super) unsafe fn rejected_from_memory(ctx: &mut Ctx, mcf: &MainConf) -> bool {
    let mut cache = mcf.deny_cache.borrow_mut();
    let Some(cache) = cache.as_mut().filter(|c| c.len() > 0) else { return false };
    let (now, entries) = (ngx_current_msec as u64, cache.len());
    for (i, z) in ctx.zones.iter().enumerate() {
        let Some(key) = z.cached_key() else { continue };
        // A rejection whose wait the request may sit out (`delay=`) is asked of Redis.
        let hit = cache.check(key, z.cost, z.limit, z.window_ms, now);
        if let Some(hit) = hit.filter(|h| z.delay.is_none_or(|d| h.left_ms > d)) {
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
/// reservations checked by rid, after `EXISTS` renewed the key's tracking (`crate::decide::lease`); a
/// key found gone, or a flush, stops their spending until then. Lost tracking leaves
/// reservations spendable until it can be had again, and then checks them.
pub(super) fn hear_changes(mcf: &MainConf) {
    if !invalidation::pending() {
        return;
    }
    let (mut cache, mut leases) = (mcf.deny_cache.borrow_mut(), mcf.leases.borrow_mut());
    let entries = cache.as_ref().map_or(0, |c| c.len());
    let zones = mcf.zones.len();
    // Sent once the tables are let go: a check the pool refuses is answered at once.
    let mut checks = CHECKS.with(|c| core::mem::take(&mut *c.borrow_mut()));
    // SAFETY: the worker's cached clock, read on its only thread.
    let now = unsafe { ngx_current_msec } as u64;
    invalidation::drain(|f| {
        if let Some(cache) = cache.as_mut() {
            match f {
                Forget::All | Forget::Unheard => cache.clear(),
                Forget::Key(key) | Forget::Gone(key) => {
                    (0..zones).for_each(|zone| cache.forget(&TableKey::new(zone, &[key])))
                }
                Forget::Present(_) => {}
            }
        }
        if let Some(leases) = leases.as_mut() {
            match f {
                Forget::All => {
                    leases.suspect_all(now, |zone, key| giveback::track(mcf, zone, &[key]))
                }
                Forget::Unheard => leases.unverify_all(),
                // Gone or there, the answer is about the key, not about a reservation: one
                // granted after a reset is of the new life, and only its rid can tell.
                Forget::Gone(key) | Forget::Present(key) => {
                    let gone = matches!(f, Forget::Gone(_));
                    leases.checks(zones, key, gone, now, |c| checks.push(&[key], c));
                }
                Forget::Key(key) => {
                    let zone = leases.changed(zones, key, now);
                    if zone.is_some_and(|zone| !giveback::track(mcf, zone, &[key])) {
                        leases.revoke(zones, key);
                    }
                }
            }
        }
    });
    if let Some(cache) = cache.as_ref() {
        mcf.metrics.get().deny_cache_entries(cache.len() as i64 - entries as i64);
    }
    drop((cache, leases));
    while let Some((key, c)) = checks.pop_front() {
        giveback::check(mcf, key, c);
    }
    CHECKS.with(|c| c.borrow_mut().recycle(checks));
}

/// `lease=`: admits the request from this worker's reservations when every zone has the units,
/// spending them; otherwise says how many units each leasing zone asks Redis to reserve.
pub(super) unsafe fn admitted_from_reservations(ctx: &mut Ctx, mcf: &MainConf) -> bool {
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
        if let Some(deciding) = leases.try_spend(ctx.zones.iter().map(ZoneReq::ask), now) {
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
pub(super) fn answered(ctx: &Ctx, mcf: &MainConf) {
    if let Some(leases) = mcf.leases.borrow_mut().as_mut() {
        // SAFETY: the worker's cached clock, read on its only thread.
        let now = unsafe { ngx_current_msec } as u64;
        let leased = ctx.zones.iter().filter(|z| z.lease.is_some());
        leased.for_each(|z| leases.answered(&z.ask(), now));
    }
}

/// Keeps the units Redis reserved with an admitted decision, for the requests that follow.
/// Reservations Redis does not track for this worker live briefly only, as remembered
/// rejections do: a reset of the key would go unheard.
pub(super) fn keep_reservations(ctx: &Ctx, mcf: &MainConf, d: &mut Decision) {
    let mut leases = mcf.leases.borrow_mut();
    let Some(leases) = leases.as_mut() else { return };
    for (z, v) in ctx.zones.iter().zip(d.zones.iter_mut()) {
        let mut grant = v.grant;
        // A zone that asked for none was granted a place (`settle=`, several backends), not units
        // to spend.
        if grant.units == 0 || z.lease.is_none() {
            continue;
        }
        let tracked = giveback::track(mcf, z.zone, &z.key.parts());
        if !tracked {
            grant.life_ms = grant.life_ms.min(UNTRACKED_DENIAL_MS);
        }
        let log = mcf.zones[z.zone].algorithm == Algorithm::SlidingLog;
        let (started, remaining, reset_ms) = (ctx.started as u64, v.remaining, v.reset_ms);
        let old = leases.granted(&z.ask(), grant, started, remaining, reset_ms, log, tracked);
        mcf.metrics.get().lease(z.zone, LeaseEvent::Reserved, grant.units);
        // What this worker may still admit includes what it now holds.
        v.remaining += grant.units;
        giveback::send(mcf, old);
    }
    giveback::arm(mcf);
}

/// Notes the slots Redis granted an admitted request in its concurrency zones, so that the
/// sweep renews them while it runs and `cleanup` releases them when it ends.
pub(super) fn take_slots(ctx: &mut Ctx, mcf: &MainConf, range: core::ops::Range<usize>) {
    let mut slots = mcf.slots.borrow_mut();
    let (sent, mut any) = (ctx.started as u64, false);
    for z in ctx.zones[range].iter_mut().filter(|z| mcf.zones[z.zone].concurrency()) {
        let Some(slot) = z.slot() else { continue };
        // Renewals count from when the decision was sent: Redis scored the slot later.
        let id = slots.get_or_insert_with(Slots::new).take(z.zone, slot, sent);
        z.held = id;
        any = true;
        mcf.metrics.get().slot(z.zone, SlotEvent::Taken);
    }
    drop(slots);
    if any {
        giveback::arm(mcf);
    }
}

/// The request ended: its slots go back to Redis, once (the cleanup runs twice), and those this
/// worker counted by itself (`ratelimit_fail local`) back to its count.
pub(super) unsafe fn release_slots(ctx: &mut Ctx) {
    // SAFETY: the request's configuration outlives it (null only if it had none).
    let Some(mcf) = ctx.mcf.as_ref() else { return };
    for z in ctx.zones.iter_mut().filter(|z| z.held_locally) {
        z.held_locally = false;
        if let Some(slots) = mcf.slots.borrow_mut().as_mut() {
            slots.local_release(z.table_key.hash);
        }
    }
    for z in ctx.zones.iter_mut().filter(|z| z.held != 0) {
        giveback::release(mcf, core::mem::take(&mut z.held));
    }
}

/// Remembers the zones that rejected a request, for `rejected_from_memory`: until the retry-after
/// when Redis tracks the key for this worker (a change to it is heard of at once), briefly
/// otherwise.
pub(super) fn remember_rejection(ctx: &Ctx, mcf: &MainConf, d: &Decision) {
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
            let kept_until_ms = match giveback::track(mcf, z.zone, &key.parts) {
                true => until_ms,
                false => ctx.started as u64 + UNTRACKED_DENIAL_MS,
            };
            let (cost, limit, window_ms, remaining) = (z.cost, z.limit, z.window_ms, v.remaining);
            let denial = Denial { until_ms, kept_until_ms, cost, limit, window_ms, remaining };
            cache.insert(key, denial);
        }
    }
    mcf.metrics.get().deny_cache_entries(cache.len() as i64 - entries as i64);
}

//! A request's decision asked of each backend its location's zones live on (`redis=`): a
//! [`Part`] per backend, sent at once, each with its own deadline and retries; their answers
//! read and combined, all or nothing; what one backend admitted given back at once when another
//! refuses (docs/sizing.md, several backends).

use core::ops::Range;
use core::ptr;

use ngx::ffi::{ngx_add_timer, ngx_event_t};

use crate::decide::script::{self, Decision, EncodedArgs, ReplyError, ZoneVerdict};
use crate::decide::status::Status;
use crate::glue::conf::{LocConf, MainConf};
use crate::glue::giveback;
use crate::redis::follow::{submit, Retries};
use crate::redis::pool::{Frame, RedisError, Waiter, WorkerPool};

use super::fail::{stand_in, Failure};
use super::memory::{answered, keep_reservations, remember_rejection, take_slots};
use super::{admitted, orphan_slots, record, Ctx, ZoneReq};

/// One backend's share of a request's decision: its zones, `Ctx::zones[from..to]`, in one script
/// call with its own deadline and retries.
pub(super) struct Part {
    pub(super) waiter: Waiter,
    /// Fires on completion (posted) or at the decision's deadline (timer); for the first part,
    /// also at the end of a delayed request's wait.
    pub(super) ev: ngx_event_t,
    pub(super) args: EncodedArgs,
    pub(super) retries: Retries,
    pub(super) backend: usize,
    pub(super) from: usize,
    pub(super) to: usize,
    /// Its request's context, which holds it (in the request's pool, as long as the part).
    pub(super) ctx: *mut Ctx,
    /// Its answer, or the failure that stands for one, is in.
    pub(super) done: bool,
    /// Its keys are in different Cluster slots: not sent.
    pub(super) cross_slot: bool,
    /// With several backends, once decided: whether its backend admitted the request; `None`
    /// when it could not say, and the location's `ratelimit_fail` stood in.
    pub(super) said: Option<bool>,
}

impl Part {
    pub(super) fn new(ctx: *mut Ctx, backend: usize, from: usize, to: usize) -> Self {
        Part {
            waiter: Waiter::new(ptr::null_mut()),
            // SAFETY: all-zero is an idle event.
            ev: unsafe { core::mem::zeroed() },
            args: EncodedArgs::default(),
            retries: Retries::default(),
            backend,
            from,
            to,
            ctx,
            done: false,
            cross_slot: false,
            said: None,
        }
    }

    /// Its zones, as indexes into `Ctx::zones`.
    pub(super) fn range(&self) -> Range<usize> {
        self.from..self.to
    }
}

/// Sends a part of the request's decision to its backend (through `pool`, that backend's);
/// false when it is done at once (Redis known down, keys in different Cluster slots).
/// `several`: the request has other parts, on other backends, which may refuse it after this
/// one admits.
pub(super) unsafe fn ask(
    zones: &[ZoneReq],
    part: &mut Part,
    pool: Option<&mut WorkerPool>,
    several: bool,
    mcf: &MainConf,
    now: Option<u64>,
) -> bool {
    let Some(redis) = mcf.redis(part.backend) else { return false };
    if pool.as_ref().is_some_and(|p| p.refusing()) {
        // Known down: refused as `submit` would refuse it, without writing its arguments.
        part.waiter.result = Some(Err(RedisError::Unavailable));
        part.done = true;
        return false;
    }
    let zones = zones[part.range()].iter();
    let room = mcf.spare.borrow_mut().args();
    part.args = EncodedArgs::new_in(room, zones.map(|z| z.args(&mcf.zones[z.zone], several)), now);
    // Redis would refuse it (CROSSSLOT), and splitting it would not be atomic.
    part.cross_slot = redis.cluster && part.args.call().slot().is_none();
    if part.cross_slot || !submit(pool, &mut part.waiter, part.args.call()) {
        part.done = true;
        return false;
    }
    ngx_add_timer(&mut part.ev, redis.timeout);
    true
}

/// Part `i` (below [`asked_parts`]) of the request's decision: the first, then the others.
pub(super) fn part_ptr(ctx: &mut Ctx, i: usize) -> *mut Part {
    match i {
        0 => ctx.part.as_mut().map_or(ptr::null_mut(), ptr::from_mut),
        i => &mut ctx.more[i - 1],
    }
}

/// How many parts the request asked: none if answered from memory.
pub(super) fn asked_parts(ctx: &Ctx) -> usize {
    ctx.part.as_ref().map_or(0, |_| 1 + ctx.more.len())
}

/// A backend admitted the request in the zones `range` (`allowed`, with `verdicts`) while it is
/// refused: what it placed there goes back at once, and the slots it granted are released.
pub(super) unsafe fn undo(
    ctx: &mut Ctx,
    range: Range<usize>,
    allowed: bool,
    verdicts: &[ZoneVerdict],
) {
    // SAFETY: the request's configuration outlives it (null only if it had none).
    let Some(mcf) = ctx.mcf.as_ref() else { return };
    if !allowed {
        return;
    }
    let zones = &ctx.zones[range.clone()];
    let placed = zones.iter().zip(verdicts).filter(|(z, v)| {
        let g = v.grant;
        g.units > 0 && g.rid > 0 && z.lease.is_none()
    });
    let back = placed.map(|(z, v)| ZoneReq { placed: v.grant, ..*z }.give_back(v.grant.units));
    giveback::send(mcf, back);
    orphan_slots(ctx, range);
}

/// A location on several backends: admitted only if every one admits (or its failure's policy
/// does); what one admitted goes back at once when another refuses. Each part keeps what its
/// backend said, and the verdicts' lists are the worker's spare ones: nothing is allocated.
pub(super) unsafe fn decide_several(ctx: &mut Ctx, lcf: &LocConf, mcf: &MainConf) {
    let parts = asked_parts(ctx);
    let mut all = Decision { allowed: true, wait_ms: 0, zones: mcf.spare.borrow_mut().verdicts() };
    // The statuses a policy stood in with, a bit each.
    let mut stood = 0u32;
    for i in 0..parts {
        let (range, backend) = {
            let part = &*part_ptr(ctx, i);
            (part.range(), part.backend)
        };
        let (said, d) = match answer(ctx, mcf, i) {
            Ok(d) => (Some(d.allowed), d),
            Err(failure) => {
                let (status, d) = stand_in(ctx, lcf, mcf, range, backend, failure);
                stood |= 1 << status as u32;
                (None, d)
            }
        };
        (*part_ptr(ctx, i)).said = said;
        all.allowed &= d.allowed;
        all.zones.extend_from_slice(&d.zones);
        mcf.spare.borrow_mut().keep_verdicts(d.zones);
    }
    if ctx.zones.iter().any(|z| z.lease.is_some()) {
        answered(ctx, mcf);
    }
    if all.allowed {
        admitted(ctx, mcf, &mut all, core::iter::empty());
        // Slots are the ones Redis granted: a policy's stand-in took none there.
        for i in 0..parts {
            let part = &*part_ptr(ctx, i);
            if part.said.is_some() {
                take_slots(ctx, mcf, part.range());
            }
        }
    } else {
        for i in 0..parts {
            let part = &*part_ptr(ctx, i);
            if let Some(allowed) = part.said {
                let range = part.range();
                undo(ctx, range.clone(), allowed, &all.zones[range]);
            }
        }
        // Reservations granted with it stay this worker's, as any reservation does.
        keep_reservations(ctx, mcf, &mut all);
        if lcf.deny_cache() {
            // Only what Redis said is remembered, never a policy's stand-in.
            let mut heard = Decision { zones: mcf.spare.borrow_mut().verdicts(), ..all };
            heard.zones.extend_from_slice(&all.zones);
            for i in 0..parts {
                let part = &*part_ptr(ctx, i);
                if part.said.is_none() {
                    heard.zones[part.range()].iter_mut().for_each(|v| v.ok = true);
                }
            }
            remember_rejection(ctx, mcf, &heard);
            mcf.spare.borrow_mut().keep_verdicts(heard.zones);
        }
    }
    record(ctx, &all);
    mcf.spare.borrow_mut().keep_verdicts(all.zones);
    let redis_refused = (0..parts).any(|i| (*part_ptr(ctx, i)).said == Some(false));
    let has = |s: Status| stood & (1 << s as u32) != 0;
    ctx.status = match all.allowed {
        false if redis_refused => Status::Rejected,
        false if has(Status::RejectedLocal) => Status::RejectedLocal,
        false => Status::FailedClosed,
        true if has(Status::PassedLocal) => Status::PassedLocal,
        true if has(Status::FailedOpen) => Status::FailedOpen,
        true => Status::Passed,
    };
    if ctx.status == Status::FailedClosed {
        // As with one backend: a refusal by policy announces no figures.
        ctx.quota = None;
    }
}

/// What part `i`'s backend answered: its decision, or why there is none.
pub(super) unsafe fn answer(ctx: &mut Ctx, mcf: &MainConf, i: usize) -> Result<Decision, Failure> {
    let part = &mut *part_ptr(ctx, i);
    let range = part.range();
    if part.cross_slot {
        let zones = ctx.zones[range].iter().map(|z| format!("\"{}\"", mcf.zones[z.zone].name));
        return Err(Failure::CrossSlot(zones.collect::<Vec<_>>().join(", ")));
    }
    let result = part.waiter.result.take().unwrap_or(Err(RedisError::Timeout));
    // The verdicts' room is taken only for a reply: a failure would drop it.
    let decode = |reply: Frame| {
        let room = mcf.spare.borrow_mut().verdicts();
        script::decode_reply_in(reply.view(), &part.args, room)
    };
    match result.map(decode) {
        Ok(Ok(d)) => Ok(d),
        Ok(Err(ReplyError::Redis(msg))) if msg.starts_with("WRONGTYPE") => {
            Err(Failure::WrongType(wrong_type_keys(&ctx.zones[range])))
        }
        Ok(Err(e)) => Err(Failure::Reply(e)),
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
                orphan_slots(ctx, range);
            }
            Err(Failure::Redis(e))
        }
    }
}

/// The keys of a decision that met `WRONGTYPE`, for the log: the operator must find and remove
/// whatever else was stored there.
fn wrong_type_keys(zones: &[ZoneReq]) -> String {
    let keys = zones.iter().map(|z| {
        let bytes: Vec<u8> = z.key.parts().concat();
        format!("\"{}\"", String::from_utf8_lossy(&bytes).escape_debug())
    });
    keys.collect::<Vec<_>>().join(", ")
}

//! Replies that ask for another round trip rather than answer a decision — `NOSCRIPT`, a
//! Cluster's `MOVED`, `ASK`, `TRYAGAIN` and `CLUSTERDOWN` — and sending the decision again
//! within its deadline;
//! and queueing a decision on the worker's pool. Shared by requests, `ratelimit_admin` and
//! give-backs.

use core::ptr::NonNull;

use ngx::ffi::ngx_msec_t;

use super::pool::{Command, Frame, RedisError, Token, Waiter, WorkerPool};
use super::topology::{parse_redirect, Redirect};
use crate::codec::call::Args;

/// How many `MOVED` and `ASK` one decision follows: more means the cluster changes faster
/// than this worker's table follows, and the decision's time is better spent failing.
const MAX_REDIRECTS: u8 = 2;
/// The wait before the one retry after `TRYAGAIN` (a slot in the middle of a migration), and
/// before the first after `CLUSTERDOWN`.
const TRYAGAIN_DELAY: ngx_msec_t = 20;
/// How many times one decision asks again after `CLUSTERDOWN`, each pause twice the last
/// (20, 40, 80, 160 ms): a manual failover or a node rejoining leaves a node answering it for
/// moments, while a primary lost with `cluster-require-full-coverage yes` leaves every node
/// answering it for seconds, where 300 ms more per decision before `ratelimit_fail` is the
/// bound.
const CLUSTERDOWN_RETRIES: u8 = 4;

/// What a decision has already tried after replies that were not its answer.
#[derive(Default)]
pub struct Retries {
    reloaded: bool,
    redirects: u8,
    tried_again: bool,
    cluster_down: u8,
    /// Waiting out a pause before asking again (the caller's timer).
    pub waiting: bool,
    /// The `ASK` being followed: a retry after `NOSCRIPT` or `TRYAGAIN` goes there too.
    ask: Option<Redirect>,
}

pub enum Follow {
    /// Queued again: wait for the new reply.
    Resent,
    /// Send again after this pause, if the deadline allows.
    Later(ngx_msec_t),
    /// The result stands.
    No,
}

/// A reply asking for another round trip, rather than an answer.
enum Detour {
    /// Redis lost the script (restart, `SCRIPT FLUSH`, a node that never saw it).
    NoScript,
    Redirect(Redirect),
    TryAgain,
    /// The node's cluster state is `fail` for now.
    ClusterDown,
}

/// Whether a decision's result is a reply asking for another round trip.
pub fn asks_again(result: &Option<Result<Frame, RedisError>>) -> bool {
    detour(result).is_some()
}

fn detour(result: &Option<Result<Frame, RedisError>>) -> Option<Detour> {
    let e = result.as_ref()?.as_ref().ok()?.view().error()?;
    if e.starts_with(b"NOSCRIPT") {
        Some(Detour::NoScript)
    } else if e.starts_with(b"TRYAGAIN") {
        Some(Detour::TryAgain)
    } else if e.starts_with(b"CLUSTERDOWN") {
        Some(Detour::ClusterDown)
    } else {
        parse_redirect(e).map(Detour::Redirect)
    }
}

/// Sends a decision again when its reply asks for it, within the same deadline: after
/// `NOSCRIPT` once, in a call preceded by `SCRIPT LOAD` (one for all the decisions that ask
/// again together); after `MOVED` or `ASK` up to `MAX_REDIRECTS` times; after `TRYAGAIN`
/// once, a little later; after `CLUSTERDOWN` up to `CLUSTERDOWN_RETRIES` times, later each time.
///
/// # Safety
/// `waiter` and `args` stay where they are, alive, until the waiter completes or is cancelled
/// (they live side by side in the caller's context).
pub unsafe fn follow<'p>(
    pool: impl FnOnce() -> Option<&'p mut WorkerPool>,
    waiter: &mut Waiter,
    args: &Args,
    retries: &mut Retries,
) -> Follow {
    // The pool is looked up only for a reply that asks for another call, not for every reply.
    match detour(&waiter.result) {
        Some(Detour::NoScript) if !retries.reloaded => {
            retries.reloaded = true;
            resend(pool(), waiter, args, retries.ask.as_ref(), true)
        }
        Some(Detour::Redirect(to)) if retries.redirects < MAX_REDIRECTS => {
            let pool = pool();
            // Without `cluster=on` there is nowhere to follow it to: the reply stands, and says
            // why.
            if !pool.as_deref().is_some_and(WorkerPool::cluster) {
                return Follow::No;
            }
            retries.redirects += 1;
            // After a NOSCRIPT, every node it goes to next may lack the script too (a replica
            // just promoted), so each later call is preceded by SCRIPT LOAD.
            let follow = resend(pool, waiter, args, Some(&to), retries.reloaded);
            retries.ask = matches!(to, Redirect::Ask { .. }).then_some(to);
            follow
        }
        Some(Detour::TryAgain) if !retries.tried_again => {
            retries.tried_again = true;
            Follow::Later(TRYAGAIN_DELAY)
        }
        Some(Detour::ClusterDown) if retries.cluster_down < CLUSTERDOWN_RETRIES => {
            // Without `cluster=on` it says that the server is a Cluster node: the reply stands.
            if !pool().as_deref().is_some_and(WorkerPool::cluster) {
                return Follow::No;
            }
            retries.cluster_down += 1;
            Follow::Later(TRYAGAIN_DELAY << (retries.cluster_down - 1))
        }
        _ => Follow::No,
    }
}

/// Sends a decision again once the pause `Follow::Later` asked for is over, where the `ASK`
/// being followed points.
///
/// # Safety
/// `waiter` and `args` stay where they are, alive, until the waiter completes or is cancelled
/// (they live side by side in the caller's context).
pub unsafe fn again(
    pool: Option<&mut WorkerPool>,
    waiter: &mut Waiter,
    args: &Args,
    retries: &Retries,
) -> Follow {
    resend(pool, waiter, args, retries.ask.as_ref(), retries.reloaded)
}

/// Queues a decision again, where a redirection points if one is followed.
unsafe fn resend(
    pool: Option<&mut WorkerPool>,
    waiter: &mut Waiter,
    args: &Args,
    via: Option<&Redirect>,
    reload: bool,
) -> Follow {
    let cmd = Command::decision(args, reload);
    let queued = queue(pool, waiter, |pool, w| match via {
        Some(to) => pool.redirect(w, cmd, to),
        None => pool.submit(w, cmd),
    });
    if queued {
        Follow::Resent
    } else {
        Follow::No
    }
}

/// Queues `args` for `waiter`; false, with the error as its result, when the pool refuses. The
/// arguments must outlive the pending decision (they live beside the waiter, in its context).
///
/// # Safety
/// `waiter` and `args` stay where they are, alive, until the waiter completes or is cancelled
/// (they live side by side in the caller's context).
pub unsafe fn submit(pool: Option<&mut WorkerPool>, waiter: &mut Waiter, args: &Args) -> bool {
    queue(pool, waiter, |pool, w| pool.submit(w, Command::decision(args, false)))
}

unsafe fn queue(
    pool: Option<&mut WorkerPool>,
    waiter: &mut Waiter,
    send: impl FnOnce(&mut WorkerPool, NonNull<Waiter>) -> Result<Token, RedisError>,
) -> bool {
    let Some(pool) = pool else {
        waiter.result = Some(Err(RedisError::Unavailable));
        return false;
    };
    waiter.result = None;
    match send(pool, NonNull::from(&mut *waiter)) {
        Ok(token) => {
            waiter.token = Some(token);
            true
        }
        Err(e) => {
            waiter.result = Some(Err(e));
            false
        }
    }
}

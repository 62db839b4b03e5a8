//! Sentinel mode: decisions go to the primary a group of sentinels names, and only to an
//! address a sentinel gave *after* the last failure. A primary restarted with its old
//! configuration comes back as a writable `master` for about 10 s before Sentinel demotes it;
//! a client reconnecting to a remembered address would count there, and lose the counts.
//!
//! Per worker: Resolving (a question out to a sentinel, no primary: decisions follow
//! `ratelimit_fail` at once) → Verifying (a primary named, its first connection checking
//! `ROLE`) → Ready. Every new connection to the primary sends `ROLE` as a set-up command and
//! carries nothing until it says `master`, so a decision never reaches a demoted node whatever
//! the state. Any failure of the primary (connect, timeout, close, `READONLY`, `ROLE`) drops it
//! and asks again, at most once per `ASK_GAP_MS`; every `REFRESH_MS` (jittered) the worker asks
//! anyway, which catches a switch while its connections stayed up.

use core::ffi::c_void;
use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_add_timer, ngx_cycle, ngx_del_timer, ngx_event_t, NGX_LOG_ERR, NGX_LOG_NOTICE, NGX_LOG_WARN,
};
use ngx::ngx_log_error;

use super::breaker;
use super::conf::RedisConf;
use super::node::{Addr, NodePool, Role};
use super::pool::{log, now, RedisError};
use super::query::Query;
use crate::codec::resp::{self, MasterAddr, Reply, MAX_REPLY_LEN};
use crate::metrics::Metrics;

/// Questions to the sentinels are at least this far apart.
const ASK_GAP_MS: u64 = 100;
/// A group no sentinel knows is a configuration error: asked again at this pace.
const UNKNOWN_RETRY_MS: u64 = 1000;
/// The primary is confirmed this often, give or take `REFRESH_JITTER_MS`, so that workers do
/// not ask all at once.
const REFRESH_MS: u64 = 10_000;
const REFRESH_JITTER_MS: u64 = 1000;
const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

pub struct Sentinel {
    conf: *const RedisConf,
    metrics: Metrics,
    /// `SENTINEL get-master-addr-by-name NAME`.
    question: Box<[u8]>,
    /// The sentinels, the one that answered last first.
    sentinels: Vec<NonNull<NodePool>>,
    /// Where decisions go; `None` while no sentinel has named one since the last failure.
    primary: Option<NonNull<NodePool>>,
    /// The primary's first `PING` (behind its `ROLE` check), and the node it went to.
    verifying: Option<(NonNull<Query>, NonNull<NodePool>)>,
    /// Former primaries, freed once no decision waits on them.
    retired: Vec<NonNull<NodePool>>,
    /// The question out, and the index of the sentinel asked.
    asking: Option<(NonNull<Query>, usize)>,
    last_ask: u64,
    /// Asks (again), and frees idle former primaries.
    ev: ngx_event_t,
    /// The primary that failed last, until a primary is verified: named again, it is not
    /// announced again, nor are its failures logged again (the sentinels keep naming a dead
    /// primary until they agree it is down, a second or more).
    lost_addr: Option<String>,
    /// Once per outage each: no sentinel knows the name (or names a host, not an IP address);
    /// none answered.
    unknown_logged: bool,
    unanswered_logged: bool,
}

impl Sentinel {
    /// This worker's view of the group; the first question goes out on the next event-loop
    /// iteration. Boxed and leaked (queries and nodes point back to it); freed by `destroy`.
    pub fn create(conf: &RedisConf, metrics: Metrics) -> NonNull<Sentinel> {
        let name = &conf.sentinel.as_ref().expect("sentinel mode").name;
        let sentinels = conf
            .seeds
            .iter()
            .map(|seed| NodePool::create(conf, Addr::configured(seed), metrics, Role::Sentinel))
            .collect();
        let question = resp::command(&[b"SENTINEL", b"get-master-addr-by-name", name.as_bytes()]);
        let s = Box::into_raw(Box::new(Sentinel {
            conf,
            metrics,
            question: question.into(),
            sentinels,
            primary: None,
            verifying: None,
            retired: Vec::new(),
            asking: None,
            last_ask: 0,
            // SAFETY: an all-zero event is nginx's own initial state for one.
            ev: unsafe { core::mem::zeroed() },
            lost_addr: None,
            unknown_logged: false,
            unanswered_logged: false,
        }));
        // SAFETY: `s` is the fresh allocation; the cycle log outlives the worker.
        unsafe {
            (*s).ev.handler = Some(on_timer);
            (*s).ev.data = s as *mut c_void;
            (*s).ev.log = (*ngx_cycle).log;
            // A worker shutting down gracefully does not wait for the next question.
            (*s).ev.set_cancelable(1);
            Sentinel::arm(s, 1);
            NonNull::new_unchecked(s)
        }
    }

    /// Cancels what is out and frees every node; no request may be pending.
    ///
    /// # Safety
    /// `s` came from `create` and is not used afterwards.
    pub unsafe fn destroy(s: NonNull<Sentinel>) {
        let s = Box::from_raw(s.as_ptr());
        if s.ev.timer_set() != 0 {
            ngx_del_timer(ptr::addr_of!(s.ev) as *mut ngx_event_t);
        }
        // Before their nodes: a query's waiter sits on one of their connections.
        if let Some((q, _)) = s.asking {
            Query::cancel(q);
        }
        if let Some((q, _)) = s.verifying {
            Query::cancel(q);
        }
        let nodes = s.sentinels.iter().chain(&s.retired).chain(s.primary.iter());
        for &node in nodes {
            NodePool::destroy(node);
        }
    }

    fn conf(&self) -> &'static RedisConf {
        // SAFETY: the configuration outlives the worker's pools.
        unsafe { &*self.conf }
    }

    fn name(&self) -> &'static str {
        &self.conf().sentinel.as_ref().expect("sentinel mode").name
    }

    /// Where a decision goes now.
    pub fn primary(&self) -> Result<NonNull<NodePool>, RedisError> {
        self.primary.ok_or_else(|| RedisError::NoPrimary(self.name().to_owned()))
    }

    /// (Re)arms the timer; an armed one is replaced, not kept because it is close (nginx keeps
    /// a timer re-armed within 300 ms of its old deadline).
    unsafe fn arm(s: *mut Sentinel, delay: u64) {
        let ev = ptr::addr_of_mut!((*s).ev);
        if (*ev).timer_set() != 0 {
            ngx_del_timer(ev);
        }
        ngx_add_timer(ev, delay.max(1) as _);
    }

    /// The next question: soon while no primary is known, else the periodic confirmation.
    unsafe fn arm_next(s: *mut Sentinel, unknown: bool) {
        let delay = match (*s).primary {
            Some(_) => {
                // Spreads the workers' questions; the pid differs between workers.
                let spread = (std::process::id() as u64).wrapping_mul(7919).wrapping_add(now());
                REFRESH_MS - REFRESH_JITTER_MS + spread % (2 * REFRESH_JITTER_MS + 1)
            }
            None if unknown => UNKNOWN_RETRY_MS,
            None => ((*s).last_ask + ASK_GAP_MS).saturating_sub(now()),
        };
        Sentinel::arm(s, delay);
    }

    /// Asks the sentinels from the `from`th on, in order, until one takes the question.
    unsafe fn ask(s: *mut Sentinel, from: usize) {
        (*s).last_ask = now();
        let timeout = (*s).conf().timeout;
        for i in from..(*s).sentinels.len() {
            let node = (&(*s).sentinels)[i];
            let bytes = (*s).question.clone();
            // An open breaker or a refused connect refuses at once: the next sentinel.
            if let Ok(q) =
                Query::start(node, bytes, false, MAX_REPLY_LEN, timeout, s as *mut c_void, answered)
            {
                (*s).asking = Some((q, i));
                return;
            }
        }
        if !(*s).unanswered_logged && (*s).primary.is_none() {
            (*s).unanswered_logged = true;
            ngx_log_error!(
                NGX_LOG_ERR,
                log(),
                "ratelimit: no sentinel of group \"{}\" answered, requests follow ratelimit_fail",
                (*s).name()
            );
        }
        Sentinel::arm_next(s, false);
    }

    /// A sentinel named `addr`: it becomes the primary, unless it already is.
    unsafe fn adopt(s: *mut Sentinel, addr: &str, learned: Addr) {
        if let Some(p) = (*s).primary {
            if (*p.as_ptr()).name() == addr {
                return;
            }
            // A switch seen by the periodic question while the old connections stayed up.
            (*s).primary = None;
            (*s).retired.push(p);
        }
        let node = NodePool::create((*s).conf(), learned, (*s).metrics, Role::Primary);
        if (*s).lost_addr.as_deref() == Some(addr) {
            (*node.as_ptr()).quiet();
        } else {
            ngx_log_error!(
                NGX_LOG_NOTICE,
                log(),
                "ratelimit: sentinels name \"{addr}\" the primary of \"{}\"",
                (*s).name()
            );
        }
        (*node.as_ptr()).watch((s as *mut c_void, lost));
        (*s).primary = Some(node);
        // Opens the first connection now, so that the first decision does not pay for it;
        // a failure here reaches `lost` like any other.
        let timeout = (*s).conf().timeout;
        let sent = Query::start(
            node,
            PING.into(),
            false,
            MAX_REPLY_LEN,
            timeout,
            s as *mut c_void,
            verified,
        );
        // A check of an earlier primary must not take this one's place when it answers.
        if let Some((q, _)) = core::mem::replace(&mut (*s).verifying, sent.ok().map(|q| (q, node)))
        {
            Query::cancel(q);
        }
    }

    /// Frees former primaries no decision waits on any more.
    unsafe fn sweep(s: *mut Sentinel) {
        let retired = core::mem::take(&mut (*s).retired);
        for node in retired {
            let waiting = (*s).verifying.is_some_and(|(_, n)| n == node);
            if (*node.as_ptr()).idle() && !waiting {
                NodePool::destroy(node);
            } else {
                (*s).retired.push(node);
            }
        }
    }
}

/// The timer: ask, and free what the last failure left.
unsafe extern "C" fn on_timer(ev: *mut ngx_event_t) {
    let s = (*ev).data as *mut Sentinel;
    Sentinel::sweep(s);
    if (*s).asking.is_none() {
        Sentinel::ask(s, 0);
    }
}

/// A sentinel's answer, or its failure.
unsafe fn answered(owner: *mut c_void, result: Result<Reply, RedisError>) {
    let s = owner as *mut Sentinel;
    let Some((_, i)) = (*s).asking.take() else { return };
    let sentinel = (&(*s).sentinels)[i];
    match result.as_ref().map(resp::master_addr) {
        Ok(MasterAddr::Addr(addr)) => {
            // The one that answered is asked first next time.
            let node = (*s).sentinels.remove(i);
            (*s).sentinels.insert(0, node);
            (*s).unanswered_logged = false;
            // Only IP addresses (not `resolve-hostnames yes`): the worker never waits for DNS.
            let Some(learned) = Addr::learned(&addr) else {
                if !(*s).unknown_logged {
                    (*s).unknown_logged = true;
                    ngx_log_error!(
                        NGX_LOG_ERR,
                        log(),
                        "ratelimit: sentinels name \"{addr}\" the primary of \"{}\": not an IP \
                         address, requests follow ratelimit_fail",
                        (*s).name()
                    );
                }
                return Sentinel::arm_next(s, true);
            };
            (*s).unknown_logged = false;
            Sentinel::adopt(s, &addr, learned);
            Sentinel::arm_next(s, false);
        }
        Ok(MasterAddr::Unknown) => {
            if !(*s).unknown_logged {
                (*s).unknown_logged = true;
                ngx_log_error!(
                    NGX_LOG_ERR,
                    log(),
                    "ratelimit: sentinel \"{}\" knows no primary named \"{}\" (sentinel= of \
                     \"ratelimit_redis\"), requests follow ratelimit_fail",
                    (*sentinel.as_ptr()).name(),
                    (*s).name()
                );
            }
            if i + 1 < (*s).sentinels.len() {
                Sentinel::ask(s, i + 1);
            } else {
                Sentinel::arm_next(s, true);
            }
        }
        // Failures were counted (and the first logged) by that sentinel's node; an error
        // reply (not a sentinel: `ERR unknown command`) or a strange one is logged here,
        // once per outage like the rest.
        _ if (*s).unanswered_logged => Sentinel::ask(s, i + 1),
        _ => {
            match &result {
                // `NOAUTH`, `WRONGPASS`: the node logged them as failures already.
                Ok(Reply::Error(e)) if breaker::unusable(e) => {}
                Ok(Reply::Error(e)) => {
                    ngx_log_error!(
                        NGX_LOG_ERR,
                        log(),
                        "ratelimit: sentinel \"{}\" replied \"{}\"",
                        (*sentinel.as_ptr()).name(),
                        String::from_utf8_lossy(e)
                    );
                }
                Ok(_) => {
                    ngx_log_error!(
                        NGX_LOG_ERR,
                        log(),
                        "ratelimit: sentinel \"{}\" gave an unexpected answer",
                        (*sentinel.as_ptr()).name()
                    );
                }
                Err(_) => {}
            }
            Sentinel::ask(s, i + 1);
        }
    }
}

/// The primary's first `PING` came back: it said `master` and serves.
unsafe fn verified(owner: *mut c_void, result: Result<Reply, RedisError>) {
    let s = owner as *mut Sentinel;
    let Some((_, node)) = (*s).verifying.take() else { return };
    if (*s).primary == Some(node) && matches!(result, Ok(Reply::Status(_))) {
        (*s).lost_addr = None;
        ngx_log_error!(
            NGX_LOG_NOTICE,
            log(),
            "ratelimit: primary \"{}\" of \"{}\" verified (ROLE master)",
            (*node.as_ptr()).name(),
            (*s).name()
        );
    }
}

/// The primary failed: it is dropped at once, so that nothing reconnects to it, and the
/// sentinels are asked again. Called from inside the node's failure path: takes note and arms
/// the timer, frees nothing.
unsafe fn lost(owner: *mut c_void, node: NonNull<NodePool>, why: &RedisError) {
    let s = owner as *mut Sentinel;
    if (*s).primary != Some(node) {
        // A former primary: its decisions fail as they may.
        return;
    }
    (*s).primary = None;
    (*s).retired.push(node);
    let name = (*node.as_ptr()).name();
    if (*s).lost_addr.as_deref() != Some(name) {
        ngx_log_error!(
            NGX_LOG_WARN,
            log(),
            "ratelimit: primary \"{name}\" of \"{}\" {why}, asking the sentinels again",
            (*s).name()
        );
        (*s).lost_addr = Some(name.to_owned());
    }
    // An answer given before the failure may name the failed node: it must not count.
    if let Some((q, _)) = (*s).asking.take() {
        Query::cancel(q);
    }
    Sentinel::arm_next(s, false);
}

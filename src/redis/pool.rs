//! The per-worker pool of Redis connections, and the waiter protocol between a pending decision
//! and the connection that carries it.
//!
//! A waiter is owned by its request. The pool only ever completes a waiter by storing the result
//! and posting the waiter's event: it never calls back into HTTP code, so no connection state is
//! borrowed while a request runs. A request that goes away cancels its slot, leaving a tombstone
//! whose reply is read and dropped, because pipelined replies are matched strictly in order.

use core::fmt;
use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_current_msec, ngx_cycle, ngx_event_t, ngx_post_event, ngx_posted_events, NGX_LOG_ERR,
    NGX_LOG_INFO, NGX_LOG_NOTICE, NGX_LOG_WARN,
};
use ngx::ngx_log_error;

use super::breaker::{self, Admit, Breaker, Transition};
use super::conn::{Conn, MAX_OUTSTANDING};
use super::resp::{ProtocolError, Reply};
use crate::conf::{MainConf, RedisConf};
use crate::metrics::{Counter, ErrorKind, Gauge, Metrics};
use crate::script::EncodedArgs;

/// A new connection is opened only when every open one already carries this many decisions;
/// below that, pipelining on few connections is cheaper for Redis and for the worker.
const SPILL_AT: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisError {
    Connect,
    Unavailable,
    Timeout,
    Closed,
    Io,
    Protocol(ProtocolError),
    UnexpectedReply,
    /// Every connection already carries as many decisions as it may: Redis does not keep up.
    Overloaded,
    /// An error reply after which Redis cannot decide (`LOADING`, `BUSY`, `READONLY`, ...).
    Refused(String),
    /// TLS failed: the handshake, its deadline, or the server's certificate; the reason.
    Tls(String),
}

impl RedisError {
    /// For the metrics; `None` for what is not Redis failing: an open breaker (not asked) and
    /// error replies, which are counted by their class.
    fn kind(&self) -> Option<ErrorKind> {
        Some(match self {
            RedisError::Connect | RedisError::Tls(_) => ErrorKind::Refused,
            RedisError::Timeout => ErrorKind::Timeout,
            RedisError::Closed => ErrorKind::Closed,
            RedisError::Io => ErrorKind::Io,
            RedisError::Protocol(_) | RedisError::UnexpectedReply => ErrorKind::Protocol,
            RedisError::Overloaded => ErrorKind::Overloaded,
            RedisError::Unavailable | RedisError::Refused(_) => return None,
        })
    }
}

impl fmt::Display for RedisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisError::Connect => f.write_str("connect failed"),
            RedisError::Unavailable => f.write_str("not asked (circuit open after failures)"),
            RedisError::Timeout => f.write_str("timed out"),
            RedisError::Closed => f.write_str("closed the connection"),
            RedisError::Io => f.write_str("i/o error"),
            RedisError::Protocol(e) => write!(f, "protocol error: {e}"),
            RedisError::UnexpectedReply => f.write_str("sent a reply to a command never sent"),
            RedisError::Overloaded => {
                write!(f, "does not keep up ({MAX_OUTSTANDING} decisions waiting per connection)")
            }
            RedisError::Refused(msg) => write!(f, "replied \"{msg}\""),
            RedisError::Tls(why) => write!(f, "TLS {why}"),
        }
    }
}

/// The part of a pending decision the pool may touch.
pub struct Waiter {
    pub result: Option<Result<Reply, RedisError>>,
    pub token: Option<Token>,
    /// Posted when `result` is set.
    pub ev: *mut ngx_event_t,
}

/// What a decision sends. The arguments live in the request's pool: they are read only while
/// the decision's waiter is pending, and a cancelled decision is never written.
#[derive(Clone, Copy)]
pub struct Command {
    pub args: NonNull<EncodedArgs>,
    /// Redis lost the script: `SCRIPT LOAD` it before the call that carries this decision.
    pub reload: bool,
}

/// Where a waiter's command sits: valid while the waiter is pending, because closing a
/// connection completes (and so detaches) every waiter on it.
#[derive(Clone, Copy)]
pub struct Token {
    pub(super) conn: NonNull<Conn>,
    pub(super) seq: u64,
}

pub struct WorkerPool {
    pub(super) conf: *const RedisConf,
    pub(super) conns: Vec<NonNull<Conn>>,
    pub(super) breaker: Breaker,
    pub(super) metrics: Metrics,
    /// This worker is counted in the `BreakerOpen` gauge.
    breaker_open: bool,
}

impl WorkerPool {
    /// This worker's pool for the cycle's configuration, created on first use.
    pub fn get(mcf: &MainConf) -> Option<&'static mut WorkerPool> {
        let conf = mcf.redis.as_ref()?;
        let mut p = mcf.pool.get();
        if p.is_null() {
            let breaker = Breaker::new(conf.fail_threshold, conf.fail_backoff as u64);
            let metrics = mcf.metrics.get();
            let pool =
                WorkerPool { conf, conns: Vec::new(), breaker, metrics, breaker_open: false };
            p = Box::into_raw(Box::new(pool));
            mcf.pool.set(p);
        }
        // SAFETY: the pool lives until `destroy` at worker exit, and a worker is one thread.
        Some(unsafe { &mut *p })
    }

    /// Closes every connection; at worker exit no request is pending any more.
    pub fn destroy(cell: &core::cell::Cell<*mut WorkerPool>) {
        let p = cell.replace(ptr::null_mut());
        if p.is_null() {
            return;
        }
        // SAFETY: created by `get` with Box::into_raw. Closing a connection reaches the pool
        // through the connection's raw pointer, so the pool is owned again (and dropped) only
        // once no connection is left to do so.
        unsafe {
            while let Some(&conn) = (*p).conns.last() {
                Conn::close(conn, RedisError::Closed, false);
            }
            (*p).breaker_gauge(false);
            drop(Box::from_raw(p));
        }
    }

    pub(super) fn conf(&self) -> &'static RedisConf {
        // SAFETY: the configuration outlives the worker's pool.
        unsafe { &*self.conf }
    }

    /// Queues a decision for `waiter`. Everything queued in one event-loop iteration goes out
    /// in one write.
    ///
    /// # Safety
    /// `cmd`'s arguments stay valid while `waiter` is pending.
    pub unsafe fn submit(
        &mut self,
        waiter: NonNull<Waiter>,
        cmd: Command,
    ) -> Result<Token, RedisError> {
        let conn = self.pick()?;
        // SAFETY: `pick` returns a live connection of this pool.
        Ok(Conn::push(conn, waiter, cmd))
    }

    fn pick(&mut self) -> Result<NonNull<Conn>, RedisError> {
        if self.breaker.admit(now()) == Admit::No {
            return Err(RedisError::Unavailable);
        }
        // SAFETY: every pointer in `conns` is a live connection.
        let load = |c: &NonNull<Conn>| unsafe { c.as_ref().load() };
        let least = self.conns.iter().min_by_key(|c| load(c)).copied();
        let busy = least.is_none_or(|c| load(&c) >= SPILL_AT);
        if busy && self.conns.len() < self.conf().pool_size {
            let self_ptr: *mut WorkerPool = self;
            self.metrics.count(Counter::Connects);
            match Conn::connect(self_ptr) {
                Ok(c) => {
                    self.metrics.gauge(Gauge::Connections, 1);
                    self.conns.push(c);
                    return Ok(c);
                }
                Err(e) => {
                    self.failed(&e);
                    if least.is_none() {
                        return Err(e);
                    }
                }
            }
        }
        match least {
            Some(c) if load(&c) >= MAX_OUTSTANDING => {
                self.failed(&RedisError::Overloaded);
                Err(RedisError::Overloaded)
            }
            Some(c) => Ok(c),
            None => Err(RedisError::Unavailable),
        }
    }

    /// Detaches a waiter from its slot; the reply, when it comes, is dropped.
    pub fn cancel(token: Token) {
        // SAFETY: a token is only held by a pending waiter, whose connection is alive.
        unsafe { Conn::cancel(token) }
    }

    pub(super) fn forget(&mut self, conn: NonNull<Conn>) {
        self.metrics.gauge(Gauge::Connections, -1);
        self.conns.retain(|&c| c != conn);
    }

    /// A decision's deadline passed before Redis answered: a Redis too slow for the traffic
    /// counts as failing, or the breaker would never spare requests the wait.
    pub fn timed_out(&mut self) {
        self.failed(&RedisError::Timeout);
    }

    /// A failure: the first of an outage is logged with its reason, and the breaker's
    /// transitions once each.
    pub(super) fn failed(&mut self, why: &RedisError) {
        self.metrics.failure(why.kind());
        let name = &self.conf().name;
        if !self.breaker.failing() {
            ngx_log_error!(
                NGX_LOG_ERR,
                log(),
                "ratelimit: redis \"{name}\" {why}, requests follow ratelimit_fail"
            );
        }
        let backoff = self.conf().fail_backoff;
        match self.breaker.failure(now()) {
            Some(Transition::Opened) => {
                self.breaker_gauge(true);
                ngx_log_error!(
                    NGX_LOG_WARN,
                    log(),
                    "ratelimit: redis \"{name}\" failed {} times in a row, not asked for \
                     {backoff}ms",
                    self.conf().fail_threshold
                );
            }
            Some(Transition::Reopened) => {
                self.breaker_gauge(true);
                ngx_log_error!(
                    NGX_LOG_INFO,
                    log(),
                    "ratelimit: redis \"{name}\" probe failed, not asked for {backoff}ms"
                );
            }
            _ => {}
        }
    }

    /// A reply: usable ones close the breaker, errors meaning Redis cannot serve count as
    /// failures. A `late` one (past its deadline, its request long answered) proves nothing
    /// either way. Returns whether the connection should be replaced (`READONLY`: a replica
    /// after a failover, whose address may lead to the new primary on a fresh connection).
    pub(super) fn replied(&mut self, reply: &Reply, late: bool) -> bool {
        if let Reply::Error(e) = reply {
            self.metrics.error_reply(e);
            if breaker::unusable(e) {
                let msg = String::from_utf8_lossy(e);
                self.failed(&RedisError::Refused(msg.into_owned()));
                return e.starts_with(b"READONLY");
            }
        }
        if late {
            return false;
        }
        let was_failing = self.breaker.failing();
        self.breaker.success();
        self.breaker_gauge(false);
        if was_failing {
            ngx_log_error!(
                NGX_LOG_NOTICE,
                log(),
                "ratelimit: redis \"{}\" answers again",
                self.conf().name
            );
        }
        false
    }
}

impl WorkerPool {
    /// Keeps this worker's share of the `BreakerOpen` gauge, and counts each opening.
    fn breaker_gauge(&mut self, open: bool) {
        if open {
            self.metrics.count(Counter::BreakerOpenings);
        }
        if open != self.breaker_open {
            self.breaker_open = open;
            self.metrics.gauge(Gauge::BreakerOpen, if open { 1 } else { -1 });
        }
    }
}

fn now() -> u64 {
    // SAFETY: a worker's cached clock, read on its only thread.
    unsafe { ngx_current_msec as u64 }
}

fn log() -> *mut ngx::ffi::ngx_log_t {
    // SAFETY: the cycle (and its log) exists whenever a worker runs event handlers.
    unsafe { (*ngx_cycle).log }
}

/// Stores a waiter's result and wakes its request through its posted event.
///
/// # Safety
/// `w` is a pending waiter: its request has not run its cleanup.
pub(super) unsafe fn complete(w: NonNull<Waiter>, result: Result<Reply, RedisError>) {
    let w = &mut *w.as_ptr();
    w.result = Some(result);
    w.token = None;
    ngx_post_event(w.ev, ptr::addr_of_mut!(ngx_posted_events));
}

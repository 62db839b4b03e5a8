//! One Redis server as this worker sees it: its address, its pipelined connections and its
//! circuit breaker. A single server, the current primary of a Sentinel group and each node of
//! a Cluster are one `NodePool` each, so one failing node never stops decisions on the others.

use core::ffi::c_void;
use core::ptr::NonNull;
use std::net::SocketAddr;

use ngx::ffi::{
    sa_family_t, sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t, AF_INET,
    AF_INET6, NGX_LOG_ERR, NGX_LOG_INFO, NGX_LOG_NOTICE, NGX_LOG_WARN,
};
use ngx::ngx_log_error;

use super::breaker::{self, Admit, Breaker, Transition};
use super::conn::{Conn, MAX_OUTSTANDING};
use super::pool::{log, now, Command, RedisError, Token, Waiter};
use super::resp::Reply;
use crate::conf::{RedisConf, SeedAddr};
use crate::metrics::{Counter, Gauge, Metrics};

/// A new connection is opened only when every open one already carries this many decisions;
/// below that, pipelining on few connections is cheaper for Redis and for the worker.
const SPILL_AT: usize = 16;

/// Where a node listens.
pub struct Addr {
    sockaddr: *mut sockaddr,
    socklen: socklen_t,
    /// `host:port` as configured or as Redis announced it, for logs and redirections.
    pub name: String,
    pub is_unix: bool,
    /// Backs `sockaddr` for addresses learned at run time.
    _storage: Option<Box<sockaddr_storage>>,
}

impl Addr {
    /// An address parsed at configuration time, in the cycle's pool.
    pub fn configured(seed: &SeedAddr) -> Addr {
        Addr {
            sockaddr: seed.sockaddr,
            socklen: seed.socklen,
            name: seed.name.clone(),
            is_unix: seed.is_unix,
            _storage: None,
        }
    }

    /// An address Redis gave us (`CLUSTER SLOTS`, `MOVED`, a sentinel). Only IP literals: a
    /// host name would need the resolver, and the worker never blocks on DNS.
    pub fn learned(name: &str) -> Option<Addr> {
        let sa: SocketAddr = name.parse().ok().or_else(|| {
            // Redis writes IPv6 hosts unbracketed: "::1:7001".
            let (host, port) = name.rsplit_once(':')?;
            format!("[{host}]:{port}").parse().ok()
        })?;
        // SAFETY: an all-zero sockaddr_storage is valid, and it is large and aligned enough
        // for either family.
        let mut storage: Box<sockaddr_storage> = Box::new(unsafe { core::mem::zeroed() });
        let p = &mut *storage as *mut sockaddr_storage;
        let socklen = match sa {
            SocketAddr::V4(v4) => {
                // SAFETY: see above.
                let sin = unsafe { &mut *(p as *mut sockaddr_in) };
                sin.sin_family = AF_INET as sa_family_t;
                sin.sin_port = v4.port().to_be();
                sin.sin_addr.s_addr = u32::from_ne_bytes(v4.ip().octets());
                size_of::<sockaddr_in>()
            }
            SocketAddr::V6(v6) => {
                // SAFETY: see above.
                let sin6 = unsafe { &mut *(p as *mut sockaddr_in6) };
                sin6.sin6_family = AF_INET6 as sa_family_t;
                sin6.sin6_port = v6.port().to_be();
                sin6.sin6_addr.__in6_u.__u6_addr8 = v6.ip().octets();
                size_of::<sockaddr_in6>()
            }
        };
        Some(Addr {
            sockaddr: p as *mut sockaddr,
            socklen: socklen as socklen_t,
            name: name.to_owned(),
            is_unix: false,
            _storage: Some(storage),
        })
    }

    pub fn sockaddr(&self) -> (*mut sockaddr, socklen_t) {
        (self.sockaddr, self.socklen)
    }
}

/// A function and its data, called on each failure of a node.
pub type Hook = (unsafe fn(*mut c_void), *mut c_void);

pub struct NodePool {
    pub(super) conf: *const RedisConf,
    pub(super) addr: Addr,
    pub(super) conns: Vec<NonNull<Conn>>,
    pub(super) breaker: Breaker,
    pub(super) metrics: Metrics,
    /// This node is counted in the `BreakerOpen` gauge.
    breaker_open: bool,
    /// Told of every failure: a Cluster node that fails may have been replaced.
    pub(super) on_failure: Option<Hook>,
}

impl NodePool {
    /// A node pool, boxed and leaked: connections point back to it, so it must not move. It
    /// is freed by [`NodePool::destroy`].
    pub fn create(conf: &RedisConf, addr: Addr, metrics: Metrics) -> NonNull<NodePool> {
        let breaker = Breaker::new(conf.fail_threshold, conf.fail_backoff as u64);
        let pool = NodePool {
            conf,
            addr,
            conns: Vec::new(),
            breaker,
            metrics,
            breaker_open: false,
            on_failure: None,
        };
        NonNull::from(Box::leak(Box::new(pool)))
    }

    /// Closes every connection and frees the pool; no request may be pending on it.
    ///
    /// # Safety
    /// `p` came from `create` and is not used afterwards.
    pub unsafe fn destroy(p: NonNull<NodePool>) {
        let p = p.as_ptr();
        // Closing a connection reaches the pool through the connection's raw pointer, so the
        // pool is owned again (and dropped) only once no connection is left to do so.
        while let Some(&conn) = (*p).conns.last() {
            Conn::close(conn, RedisError::Closed, false);
        }
        (*p).breaker_gauge(false);
        drop(Box::from_raw(p));
    }

    pub(super) fn conf(&self) -> &'static RedisConf {
        // SAFETY: the configuration outlives the worker's pools.
        unsafe { &*self.conf }
    }

    /// Whether anything is still open or waiting here.
    pub fn idle(&self) -> bool {
        // SAFETY: every pointer in `conns` is a live connection.
        self.conns.iter().all(|c| unsafe { c.as_ref().load() } == 0)
    }

    /// Queues a command for `waiter`. Everything queued in one event-loop iteration goes out
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

    /// Queues a command on a connection of its own, whatever the breaker says: the one way a
    /// background probe reaches a node that failed.
    ///
    /// # Safety
    /// As for [`NodePool::submit`].
    pub unsafe fn submit_fresh(
        &mut self,
        waiter: NonNull<Waiter>,
        cmd: Command,
    ) -> Result<Token, RedisError> {
        let self_ptr: *mut NodePool = self;
        self.metrics.count(Counter::Connects);
        let conn = Conn::connect(self_ptr)?;
        self.metrics.gauge(Gauge::Connections, 1);
        self.conns.push(conn);
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
            let self_ptr: *mut NodePool = self;
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

    pub(super) fn forget(&mut self, conn: NonNull<Conn>) {
        self.metrics.gauge(Gauge::Connections, -1);
        self.conns.retain(|&c| c != conn);
    }

    /// A failure: the first of an outage is logged with its reason, and the breaker's
    /// transitions once each.
    pub(super) fn failed(&mut self, why: &RedisError) {
        if let Some((hook, data)) = self.on_failure {
            // SAFETY: whoever set the hook outlives this node (it owns it).
            unsafe { hook(data) };
        }
        self.metrics.failure(why.kind());
        let name = self.addr.name.clone();
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
                self.addr.name
            );
        }
        false
    }

    /// Keeps this node's share of the `BreakerOpen` gauge, and counts each opening.
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

//! One Redis server as this worker sees it: its address, its pipelined connections and its
//! circuit breaker. A single server, the current primary of a Sentinel group and each node of
//! a Cluster are one `NodePool` each, so one failing node never stops decisions on the others.

use core::ffi::c_void;
use core::ptr::NonNull;
use std::net::SocketAddr;

use ngx::ffi::{
    ngx_add_timer, ngx_cycle, ngx_del_timer, ngx_event_t, sa_family_t, sockaddr, sockaddr_in,
    sockaddr_in6, sockaddr_storage, socklen_t, AF_INET, AF_INET6, NGX_LOG_ERR, NGX_LOG_INFO,
    NGX_LOG_NOTICE, NGX_LOG_WARN,
};
use ngx::ngx_log_error;

use super::batch;
use super::breaker::{self, Breaker, Transition};
use super::conf::{RedisConf, SeedAddr};
use super::conn::{Conn, Setup, MAX_OUTSTANDING};
use super::pool::{log, Command, RedisError, Token, Waiter};
use super::query::Query;
use super::topology::NodeAddr;
use super::tracker::Tracker;
use crate::codec::resp::{Head, Reply, View, MAX_REPLY_LEN};
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

    /// The IP address and port it stands for, as Redis Cluster names nodes; `None` for a unix
    /// socket. A seed written without its port, or by host name, is still the node the cluster
    /// announces by IP.
    pub fn node_addr(&self) -> Option<NodeAddr> {
        // SAFETY: `sockaddr` points to a socket address of `socklen` bytes, of the family it
        // says (nginx's ngx_parse_url, or `learned`).
        unsafe {
            match i32::from((*self.sockaddr).sa_family) {
                f if f == AF_INET as i32 => {
                    let sin = &*(self.sockaddr as *const sockaddr_in);
                    let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
                    Some(NodeAddr::new(ip.to_string(), u16::from_be(sin.sin_port)))
                }
                f if f == AF_INET6 as i32 => {
                    let sin6 = &*(self.sockaddr as *const sockaddr_in6);
                    let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.__in6_u.__u6_addr8);
                    Some(NodeAddr::new(ip.to_string(), u16::from_be(sin6.sin6_port)))
                }
                _ => None,
            }
        }
    }
}

/// What a node is to this worker; it decides what each new connection sends first.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The one data server: `AUTH`, `SELECT`.
    Single,
    /// A Sentinel group's primary: `AUTH`, `SELECT`, then `ROLE` must say `master`.
    Primary,
    /// A sentinel: its own `AUTH`, nothing else.
    Sentinel,
    /// A node of a Redis Cluster: `AUTH` (a cluster has one database).
    Cluster,
}

/// `ROLE`, the last set-up command on a connection to a Sentinel group's primary.
const ROLE: &[u8] = b"*1\r\n$4\r\nROLE\r\n";
const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

/// Told of each failure of a node (a Sentinel group, of its primary's): the owner, the node.
pub type Watcher = (*mut c_void, unsafe fn(*mut c_void, NonNull<NodePool>, &RedisError));

pub struct NodePool {
    pub(super) conf: *const RedisConf,
    pub(super) addr: Addr,
    pub(super) conns: Vec<NonNull<Conn>>,
    pub(super) breaker: Breaker,
    pub(super) metrics: Metrics,
    role: Role,
    /// This node is counted in the `BreakerOpen` gauge.
    breaker_open: bool,
    /// Sends the next background probe while the breaker is open.
    probe_ev: ngx_event_t,
    /// The probe on the wire.
    probe: Option<NonNull<Query>>,
    watcher: Option<Watcher>,
    /// A Cluster's error reply was logged: once is enough to say what is wrong.
    cluster_logged: bool,
    /// A Cluster node that refused an undeclared key of another slot: batches to it are per
    /// slot from then on.
    per_slot: bool,
    /// The outage was reported already (by a former pool for the same address, a primary
    /// named again after it failed): failures are not logged until the node answers.
    quiet: bool,
    /// Tells the deny cache when keys of this node change; made when first needed.
    tracker: Option<Box<Tracker>>,
}

impl NodePool {
    /// A node pool, boxed and leaked: connections point back to it, so it must not move. It
    /// is freed by [`NodePool::destroy`].
    pub fn create(conf: &RedisConf, addr: Addr, metrics: Metrics, role: Role) -> NonNull<NodePool> {
        let breaker = Breaker::new(conf.fail_threshold, conf.fail_backoff as u64);
        let pool = Box::new(NodePool {
            conf,
            addr,
            conns: Vec::new(),
            breaker,
            metrics,
            role,
            breaker_open: false,
            // SAFETY: an all-zero event is nginx's own initial state for one.
            probe_ev: unsafe { core::mem::zeroed() },
            probe: None,
            watcher: None,
            cluster_logged: false,
            per_slot: false,
            quiet: false,
            tracker: None,
        });
        let p = Box::into_raw(pool);
        // SAFETY: `p` is the fresh, pinned allocation; the cycle log outlives the worker.
        unsafe {
            (*p).probe_ev.handler = Some(on_probe_timer);
            (*p).probe_ev.data = p as *mut c_void;
            (*p).probe_ev.log = (*ngx_cycle).log;
            // A worker shutting down gracefully does not wait for the next probe.
            (*p).probe_ev.set_cancelable(1);
            NonNull::new_unchecked(p)
        }
    }

    /// Its failures are not logged until it answers: they continue an outage already reported.
    pub fn quiet(&mut self) {
        self.quiet = true;
    }

    /// Whether a failure now is part of an outage already logged.
    pub(super) fn reported(&self) -> bool {
        self.quiet || self.breaker.failing()
    }

    /// Who is told of this node's failures, and of idle connections it closes.
    pub fn watch(&mut self, watcher: Watcher) {
        self.watcher = Some(watcher);
    }

    /// Closes every connection and frees the pool; no request may be pending on it.
    ///
    /// # Safety
    /// `p` came from `create` and is not used afterwards.
    pub unsafe fn destroy(p: NonNull<NodePool>) {
        (*p.as_ptr()).stop_probing();
        if let Some(t) = (*p.as_ptr()).tracker.take() {
            Tracker::destroy(t);
        }
        let p = p.as_ptr();
        // Closing a connection reaches the pool through the connection's raw pointer, so the
        // pool is owned again (and dropped) only once no connection is left to do so.
        while let Some(&conn) = (*p).conns.last() {
            Conn::close(conn, RedisError::Closed, false);
        }
        (*p).breaker_gauge(false);
        drop(Box::from_raw(p));
    }

    /// Asks this node to tell the worker when the key made of `key`'s parts changes; false when
    /// it cannot yet.
    pub fn track(&mut self, key: &[&[u8]]) -> bool {
        let me = NonNull::from(&mut *self);
        // SAFETY: the tracker is destroyed with its node, first.
        let t = self.tracker.get_or_insert_with(|| unsafe { Tracker::create(me) });
        t.track(key)
    }

    pub(super) fn conf(&self) -> &'static RedisConf {
        // SAFETY: the configuration outlives the worker's pools.
        unsafe { &*self.conf }
    }

    pub fn name(&self) -> &str {
        &self.addr.name
    }

    /// The server as log lines name it: its address, and its backend's name when it has one
    /// (two backends may share a server).
    pub fn shown(&self) -> Shown<'_> {
        Shown { addr: &self.addr.name, backend: &self.conf().backend }
    }

    /// Whether any decision still waits here.
    pub fn idle(&self) -> bool {
        // SAFETY: every pointer in `conns` is a live connection.
        self.conns.iter().all(|c| unsafe { c.as_ref().load() } == 0)
    }

    /// What a new connection sends before anything else, in order: `AUTH`, `SELECT`, `ROLE`.
    pub(super) fn setup(&self) -> impl Iterator<Item = (Setup, &'static [u8])> {
        let conf = self.conf();
        let (auth, select) = match (self.role, &conf.sentinel) {
            (Role::Sentinel, Some(s)) => (s.auth.as_deref(), None),
            _ => (conf.auth.as_deref(), conf.select.as_deref()),
        };
        let role = (self.role == Role::Primary).then_some(ROLE);
        let steps = [(Setup::Auth, auth), (Setup::Select, select), (Setup::Role, role)];
        steps.into_iter().filter_map(|(step, bytes)| Some((step, bytes?)))
    }

    /// A set-up command's reply: an error (`WRONGPASS`, `ERR DB index is out of range`), or a
    /// `ROLE` other than `master`, fails the connection and counts for the breaker.
    pub(super) fn set_up(&mut self, step: Setup, reply: View<'_>) -> Result<(), RedisError> {
        match (step, reply.error()) {
            // A Redis with no password set answers `AUTH` with an `ERR` and serves anyway.
            (Setup::Auth, Some(e)) if !breaker::unusable(e) => {
                self.metrics.error_reply(e);
                Ok(())
            }
            (_, Some(e)) => {
                self.metrics.error_reply(e);
                Err(RedisError::Refused(String::from_utf8_lossy(e).into_owned()))
            }
            (Setup::Role, None) => match reply.items().map(|mut items| items.next_head()) {
                Some(Some(Head::Bulk(Some(b"master")))) => Ok(()),
                Some(Some(Head::Bulk(Some(role)))) => {
                    Err(RedisError::NotPrimary(String::from_utf8_lossy(role).into_owned()))
                }
                _ => Err(RedisError::NotPrimary(String::new())),
            },
            _ => Ok(()),
        }
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
        let conn = if cmd.max_reply > MAX_REPLY_LEN { self.pick_private()? } else { self.pick()? };
        // SAFETY: `pick` and `pick_private` return a live connection of this pool.
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
        let conn = self.connect()?;
        // SAFETY: `connect` returns a live connection of this pool.
        Ok(Conn::push(conn, waiter, cmd))
    }

    /// A connection of its own for a command whose reply may take megabytes (`CLUSTER SLOTS`
    /// of a fragmented cluster), closed once answered. Decisions pipelined behind such a reply
    /// would wait for all of it, past their `timeout` while a new worker reads a large table;
    /// `pick` never gives them this connection.
    fn pick_private(&mut self) -> Result<NonNull<Conn>, RedisError> {
        if !self.breaker.admit() {
            return Err(RedisError::Unavailable);
        }
        let c = self.connect().inspect_err(|e| self.failed(e))?;
        // SAFETY: just made, and live.
        unsafe { Conn::make_private(c) };
        Ok(c)
    }

    fn connect(&mut self) -> Result<NonNull<Conn>, RedisError> {
        let self_ptr: *mut NodePool = self;
        self.metrics.count(Counter::Connects);
        let c = Conn::connect(self_ptr)?;
        self.metrics.gauge(Gauge::Connections, 1);
        self.conns.push(c);
        Ok(c)
    }

    fn pick(&mut self) -> Result<NonNull<Conn>, RedisError> {
        if !self.breaker.admit() {
            return Err(RedisError::Unavailable);
        }
        // SAFETY: every pointer in `conns` is a live connection.
        let load = |c: &NonNull<Conn>| unsafe { c.as_ref().load() };
        // SAFETY: as above.
        let open = |c: &&NonNull<Conn>| unsafe { !c.as_ref().private() };
        // A decision joins those of this event-loop iteration that wait to be written, so that
        // one call carries them all: spread over the connections, the least loaded each time,
        // a burst went out as a small call per connection, and Redis, which runs one call at a
        // time whatever the connection, paid the fixed cost of each.
        // SAFETY: as above.
        let joining = |c: &&NonNull<Conn>| unsafe { c.as_ref().batch_open() };
        if let Some(&c) = self.conns.iter().filter(open).find(joining) {
            return Ok(c);
        }
        let least = self.conns.iter().filter(open).min_by_key(|c| load(c)).copied();
        let busy = least.is_none_or(|c| load(&c) >= SPILL_AT);
        if busy && self.conns.iter().filter(open).count() < self.conf().pool_size {
            match self.connect() {
                Ok(c) => return Ok(c),
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

    /// A failure: the first of an outage is logged with its reason, and the breaker's opening
    /// once; an opening starts the background probes.
    pub(super) fn failed(&mut self, why: &RedisError) {
        self.metrics.failure(why.kind());
        if !self.reported() {
            ngx_log_error!(
                NGX_LOG_ERR,
                log(),
                "ratelimit: redis {} {why}, requests follow ratelimit_fail",
                self.shown()
            );
        }
        if self.breaker.failure() == Some(Transition::Opened) {
            self.breaker_gauge(true);
            ngx_log_error!(
                NGX_LOG_WARN,
                log(),
                "ratelimit: redis {} failed {} times in a row, not asked until it \
                 answers a probe (every {}ms at most)",
                self.shown(),
                self.conf().fail_threshold,
                self.breaker.backoff()
            );
            if self.role != Role::Primary {
                // A Sentinel group's primary is replaced on its first failure instead:
                // probing it would only reconnect to what was dropped.
                self.arm_probe();
            }
        }
        if let Some((owner, told)) = self.watcher {
            if *why != RedisError::Overloaded {
                // SAFETY: the watcher outlives the nodes it watches, and only takes note here:
                // it frees nothing while this node is borrowed.
                unsafe { told(owner, NonNull::from(&mut *self), why) };
            }
        }
    }

    /// The server closed an idle connection: no failure, but a watcher wants to know.
    pub(super) fn closed_idle(&mut self) {
        if let Some((owner, told)) = self.watcher {
            // SAFETY: as in `failed`.
            unsafe { told(owner, NonNull::from(&mut *self), &RedisError::Closed) };
        }
    }

    fn arm_probe(&mut self) {
        if let Some(delay) = self.breaker.probe_delay() {
            // SAFETY: the event is this pinned pool's; `destroy` deletes the timer.
            unsafe { ngx_add_timer(&mut self.probe_ev, delay as _) };
        }
    }

    /// The probe timer: a `PING` on a connection of its own, past the breaker.
    unsafe fn probe_now(&mut self) {
        if self.probe.is_some() || !self.breaker.probe_started() {
            return;
        }
        let owner = self as *mut NodePool as *mut c_void;
        let timeout = self.conf().timeout;
        let node = NonNull::from(&mut *self);
        match Query::start(node, PING.into(), true, MAX_REPLY_LEN, timeout, owner, probe_done) {
            Ok(q) => self.probe = Some(q),
            Err(e) => {
                // The connect failed at once (a refused loopback port): no connection was
                // made to report it.
                self.failed(&e);
                self.probe_failed();
            }
        }
    }

    fn probe_failed(&mut self) {
        let Some(delay) = self.breaker.probe_failed() else { return };
        if delay == self.breaker.backoff() {
            // Logged at the pace the probes settle to, not at each of the first quick ones.
            ngx_log_error!(
                NGX_LOG_INFO,
                log(),
                "ratelimit: redis {} probe failed, next in {delay}ms",
                self.shown()
            );
        }
        self.arm_probe();
    }

    /// No more probes: the pool goes away.
    fn stop_probing(&mut self) {
        if self.probe_ev.timer_set() != 0 {
            // SAFETY: the timer is this pool's own and set.
            unsafe { ngx_del_timer(&mut self.probe_ev) };
        }
        if let Some(q) = self.probe.take() {
            // SAFETY: a probe is in `self.probe` until its `done` runs.
            unsafe { Query::cancel(q) };
        }
    }

    /// Whether a script call may carry decisions of several of the slots this node serves.
    pub(super) fn per_node(&self) -> bool {
        self.role == Role::Cluster && !self.per_slot
    }

    /// A decision of a node's batch had a key this node would not let the script use (`why`,
    /// Redis's error); it goes again alone.
    pub(super) fn not_local(&mut self, why: &[u8]) {
        self.metrics.count(Counter::Rerouted);
        if batch::refuses_other_slots(why) && !self.per_slot {
            self.per_slot = true;
            ngx_log_error!(
                NGX_LOG_NOTICE,
                log(),
                "ratelimit: redis {} refuses undeclared keys of other slots in scripts \
                 ({}): its decisions are batched per slot",
                self.shown(),
                String::from_utf8_lossy(why)
            );
        }
    }

    /// A reply: usable ones close the breaker, errors meaning Redis cannot serve count as
    /// failures (but a Cluster node's `CLUSTERDOWN`, which is asked again). A `late` one (past
    /// its deadline, its request long answered) proves nothing either way. Returns whether the
    /// connection should be replaced (`READONLY`: a replica after a failover, whose address may
    /// lead to the new primary on a fresh connection).
    pub(super) fn replied(&mut self, reply: View<'_>, late: bool) -> bool {
        if let Some(e) = reply.error() {
            self.metrics.error_reply(e);
            if breaker::from_cluster(e) && self.role != Role::Cluster && !self.cluster_logged {
                self.cluster_logged = true;
                ngx_log_error!(
                    NGX_LOG_ERR,
                    log(),
                    "ratelimit: redis {} is a Redis Cluster node: set cluster=on in \
                     \"ratelimit_redis\"",
                    self.shown()
                );
            }
            if self.role == Role::Cluster && e.starts_with(b"CLUSTERDOWN") {
                // The node answers, its cluster mends (a failover's moments): the decision asks
                // again a little later (`follow`), and the breaker, whose probe this node would
                // answer at once, is no help.
                return false;
            }
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
        self.quiet = false;
        self.breaker.success();
        self.breaker_gauge(false);
        if was_failing {
            // A decision's reply may close it first; the probe then finds nothing to do.
            if self.probe_ev.timer_set() != 0 {
                // SAFETY: the timer is this pool's own and set.
                unsafe { ngx_del_timer(&mut self.probe_ev) };
            }
            ngx_log_error!(
                NGX_LOG_NOTICE,
                log(),
                "ratelimit: redis {} answers again",
                self.shown()
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

unsafe extern "C" fn on_probe_timer(ev: *mut ngx_event_t) {
    // SAFETY: the event's data is its pool, which deletes the timer before it goes.
    (*((*ev).data as *mut NodePool)).probe_now();
}

/// The probe's outcome. A usable reply has already closed the breaker on its way (`replied`).
unsafe fn probe_done(owner: *mut c_void, result: Result<Reply, RedisError>) {
    // SAFETY: the pool cancels its probe before it goes, so it is alive when this runs.
    let node = &mut *(owner as *mut NodePool);
    node.probe = None;
    match result {
        Ok(Reply::Error(_)) | Err(_) => node.probe_failed(),
        Ok(_) => {}
    }
}

/// A server in a log line: `"ADDR"`, or `"ADDR" (backend "NAME")`.
pub struct Shown<'a> {
    addr: &'a str,
    backend: &'a str,
}

impl core::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.backend {
            "" => write!(f, "\"{}\"", self.addr),
            b => write!(f, "\"{}\" (backend \"{b}\")", self.addr),
        }
    }
}

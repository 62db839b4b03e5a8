//! Redis Cluster as one worker sees it: a slot table from `CLUSTER SLOTS`, one `NodePool` (and
//! so one breaker) per node, and the refreshes that keep the table true.
//!
//! The table is refreshed on first use, after `MOVED` (the slot is patched at once), when a
//! node fails or its breaker refuses, and every 30 s ± 5 s; at most one query at a time and
//! one a second, because every worker of every gateway does the same during a failover. Nodes
//! that leave the table are closed once idle.

use core::ffi::c_void;
use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_add_timer, ngx_current_msec, ngx_cycle, ngx_del_timer, ngx_event_t, ngx_msec_t, ngx_pid,
    NGX_LOG_ERR, NGX_LOG_NOTICE,
};
use ngx::ngx_log_error;

use super::conf::RedisConf;
use super::node::{Addr, NodePool, Role};
use super::pool::{log, now, RedisError};
use super::query::Query;
use super::topology::{parse_cluster_slots, NodeAddr, SlotTable};
use crate::codec::resp::{self, Reply, MAX_TOPOLOGY_REPLY_LEN};
use crate::metrics::Metrics;

/// At most one topology query a second per worker.
const REFRESH_EVERY: u64 = 1000;
const PERIOD: ngx_msec_t = 30_000;
const JITTER: ngx_msec_t = 5_000;

pub struct Cluster {
    conf: *const RedisConf,
    metrics: Metrics,
    table: SlotTable,
    /// Every node this worker has a pool for, seeds first.
    pools: Vec<(NodeAddr, NonNull<NodePool>)>,
    seeds: usize,
    query: Option<(NonNull<Query>, NodeAddr)>,
    last_query: Option<u64>,
    /// The next refresh: periodic, or one held back by the once-a-second rule.
    timer: ngx_event_t,
    /// Round robin over the nodes asked for the topology.
    next: usize,
    /// "not a cluster node" or a host name in the table: logged once per worker.
    warned: bool,
}

impl Cluster {
    /// The worker's cluster, pinned: its timer and queries point back to it.
    pub fn create(conf: &RedisConf, metrics: Metrics) -> NonNull<Cluster> {
        let mut pools = Vec::new();
        for seed in &conf.seeds {
            // Known by the address it resolved to, as the cluster's own tables name nodes.
            let addr = Addr::configured(seed);
            let Some(node) = addr.node_addr() else { continue };
            pools.push((node, NodePool::create(conf, addr, metrics, Role::Cluster)));
        }
        let seeds = pools.len();
        let cluster = Box::new(Cluster {
            conf,
            metrics,
            table: SlotTable::default(),
            pools,
            seeds,
            query: None,
            last_query: None,
            // SAFETY: an all-zero event is nginx's idle event.
            timer: unsafe { core::mem::zeroed() },
            next: 0,
            warned: false,
        });
        let p = NonNull::from(Box::leak(cluster));
        // SAFETY: `p` is pinned until `destroy`, which deletes the timer.
        unsafe {
            let c = &mut *p.as_ptr();
            c.timer.handler = Some(on_timer);
            c.timer.data = p.as_ptr() as *mut c_void;
            c.timer.log = (*ngx_cycle).log;
            // Graceful shutdown must not wait for a refresh nobody needs.
            c.timer.set_cancelable(1);
            for i in 0..c.pools.len() {
                c.watch(c.pools[i].1);
            }
            c.refresh();
        }
        p
    }

    /// A failing node may have been replaced: each failure asks for the table (throttled).
    fn watch(&mut self, mut node: NonNull<NodePool>) {
        // SAFETY: the node is this cluster's, and the cluster is pinned and outlives it.
        unsafe { node.as_mut().watch((self as *mut Cluster as _, node_failed)) };
    }

    /// # Safety
    /// `p` came from `create`; no request is pending any more.
    pub unsafe fn destroy(p: NonNull<Cluster>) {
        let c = Box::from_raw(p.as_ptr());
        if let Some((q, _)) = c.query {
            Query::cancel(q);
        }
        if c.timer.timer_set() != 0 {
            ngx_del_timer(ptr::addr_of!(c.timer) as *mut _);
        }
        for &(_, node) in &c.pools {
            NodePool::destroy(node);
        }
    }

    fn conf(&self) -> &'static RedisConf {
        // SAFETY: the configuration outlives the worker's pools.
        unsafe { &*self.conf }
    }

    /// The node that serves `slot`; a seed while the table does not know it yet (it answers
    /// `MOVED` if it does not serve it either).
    pub fn route(&mut self, slot: u16) -> Result<NonNull<NodePool>, RedisError> {
        match self.table.node_of(slot) {
            Some(i) => {
                let addr = self.table.nodes()[i].clone();
                self.node(&addr)
            }
            None => {
                self.refresh();
                let seed = self.pools.get(slot as usize % self.seeds.max(1));
                seed.map(|&(_, p)| p).ok_or(RedisError::Unavailable)
            }
        }
    }

    /// The node the table says serves `slot`, if it knows.
    pub fn owner(&mut self, slot: u16) -> Option<NonNull<NodePool>> {
        let i = self.table.node_of(slot)?;
        let addr = self.table.nodes()[i].clone();
        self.node(&addr).ok()
    }

    /// The pool of node `addr`, created on first use.
    pub fn node(&mut self, addr: &NodeAddr) -> Result<NonNull<NodePool>, RedisError> {
        if let Some(&(_, p)) = self.pools.iter().find(|(a, _)| a == addr) {
            return Ok(p);
        }
        let name = addr.to_string();
        let Some(a) = Addr::learned(&name) else {
            if !core::mem::replace(&mut self.warned, true) {
                ngx_log_error!(
                    NGX_LOG_ERR,
                    log(),
                    "ratelimit: redis cluster node \"{name}\" is announced by host name, which \
                     is not resolved at run time; set cluster-preferred-endpoint-type ip"
                );
            }
            return Err(RedisError::Unavailable);
        };
        let p = NodePool::create(self.conf(), a, self.metrics, Role::Cluster);
        self.watch(p);
        self.pools.push((addr.clone(), p));
        Ok(p)
    }

    /// After `MOVED`: the slot is patched now, the rest of the table follows soon.
    pub fn moved(&mut self, slot: u16, to: &NodeAddr) {
        self.table.patch(slot, to.clone());
        self.refresh();
    }

    /// Asks a node for the table now, or as soon as the once-a-second rule allows.
    pub fn refresh(&mut self) {
        if self.query.is_some() {
            return;
        }
        let now = now();
        if let Some(last) = self.last_query {
            let since = now.wrapping_sub(last);
            if since < REFRESH_EVERY {
                self.arm((REFRESH_EVERY - since) as ngx_msec_t);
                return;
            }
        }
        self.last_query = Some(now);
        // Healthy nodes first, in turn; then any, seeds included.
        let n = self.pools.len();
        let healthy = |p: &NonNull<NodePool>| {
            // SAFETY: every pool in the list is alive.
            unsafe { !p.as_ref().breaker.failing() }
        };
        let pick = (0..n).map(|i| (self.next + i) % n).find(|&i| healthy(&self.pools[i].1));
        let pick = pick.or((n > 0).then(|| self.next % n));
        let Some(i) = pick else {
            self.arm(REFRESH_EVERY as ngx_msec_t);
            return;
        };
        self.next = i + 1;
        let (addr, node) = self.pools[i].clone();
        let cmd = resp::command(&[b"CLUSTER", b"SLOTS"]).into_boxed_slice();
        let owner = self as *mut Cluster as *mut c_void;
        // SAFETY: the cluster outlives its query: `destroy` cancels it.
        match unsafe {
            Query::start(
                node,
                cmd,
                false,
                MAX_TOPOLOGY_REPLY_LEN,
                self.conf().timeout,
                owner,
                refreshed,
            )
        } {
            Ok(q) => self.query = Some((q, addr)),
            // The node's breaker or connect refused: the next trigger asks another.
            Err(_) => self.arm(REFRESH_EVERY as ngx_msec_t),
        }
    }

    /// Sets the timer to `delay` from now, unless it fires sooner already.
    fn arm(&mut self, delay: ngx_msec_t) {
        // SAFETY: the timer belongs to this pinned cluster; the clock is the worker's.
        unsafe {
            let due = ngx_current_msec.wrapping_add(delay);
            if self.timer.timer_set() != 0 {
                if (self.timer.timer.key.wrapping_sub(due) as isize) <= 0 {
                    return;
                }
                ngx_del_timer(&mut self.timer);
            }
            ngx_add_timer(&mut self.timer, delay);
        }
    }

    fn installed(&mut self, reply: Reply, asked: NodeAddr, took: u64) {
        if let Reply::Error(e) = &reply {
            if !core::mem::replace(&mut self.warned, true) {
                let msg = String::from_utf8_lossy(e);
                ngx_log_error!(
                    NGX_LOG_ERR,
                    log(),
                    "ratelimit: redis \"{asked}\" answered CLUSTER SLOTS with \"{msg}\"; is it \
                     a cluster node? (\"cluster=on\" of \"ratelimit_redis\")"
                );
            }
            return;
        }
        let ranges = match parse_cluster_slots(&reply, &asked) {
            Ok(r) if !r.is_empty() => r,
            Ok(_) => return,
            Err(e) => {
                ngx_log_error!(NGX_LOG_ERR, log(), "ratelimit: redis \"{asked}\" {e}");
                return;
            }
        };
        let table = SlotTable::from_ranges(&ranges);
        if table.nodes() != self.table.nodes() {
            ngx_log_error!(
                NGX_LOG_NOTICE,
                log(),
                "ratelimit: redis cluster map from \"{asked}\": {} primaries, {} slots served, \
                 read in {took}ms",
                table.nodes().len(),
                table.served()
            );
        }
        self.table = table;
        // Nodes that left the map go once idle; seeds stay, to ask when all else fails.
        let mut i = self.seeds;
        while i < self.pools.len() {
            let (addr, node) = &self.pools[i];
            // SAFETY: every pool in the list is alive.
            if self.table.index_of(addr).is_none() && unsafe { node.as_ref().idle() } {
                let (_, node) = self.pools.remove(i);
                // SAFETY: idle: no waiter is pending on it.
                unsafe { NodePool::destroy(node) };
            } else {
                i += 1;
            }
        }
    }
}

unsafe fn refreshed(owner: *mut c_void, result: Result<Reply, RedisError>) {
    let c = &mut *(owner as *mut Cluster);
    let Some((_, asked)) = c.query.take() else { return };
    if let Ok(reply) = result {
        // How long decisions went by an older table, or through seeds and `MOVED`.
        let took = c.last_query.map_or(0, |at| now().wrapping_sub(at));
        c.installed(reply, asked, took);
    }
    // Workers (and gateways) that started together must not refresh together.
    let jitter = (ngx_pid as ngx_msec_t).wrapping_mul(7919).wrapping_add(now() as ngx_msec_t);
    let jitter = jitter % (2 * JITTER);
    c.arm(PERIOD - JITTER + jitter);
}

/// Called from inside the node's failure path, maybe with one of its connections borrowed in
/// the middle of a read or a close: the refresh, which may queue on that very connection, runs
/// from the timer instead, at the next turn of the event loop.
unsafe fn node_failed(cluster: *mut c_void, _node: NonNull<NodePool>, _why: &RedisError) {
    (*(cluster as *mut Cluster)).arm(0);
}

unsafe extern "C" fn on_timer(ev: *mut ngx_event_t) {
    let c = &mut *((*ev).data as *mut Cluster);
    c.refresh();
}

//! The per-worker pool of Redis connections, and the waiter protocol between a pending decision
//! and the connection that carries it.
//!
//! A waiter is owned by its request. The pool only ever completes a waiter by storing the result
//! and posting the waiter's event: it never calls back into HTTP code, so no connection state is
//! borrowed while a request runs. A request that goes away cancels its slot, leaving a tombstone
//! whose reply is read and dropped, because pipelined replies are matched strictly in order.

use core::cell::Cell;
use core::fmt;
use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_current_msec, ngx_cycle, ngx_event_t, ngx_pnalloc, ngx_pool_t, ngx_post_event,
    ngx_posted_events,
};

use super::batch::Shape;
use super::cluster::Cluster;
use super::conf::RedisConf;
use super::conn::{Conn, MAX_OUTSTANDING};
use super::node::{Addr, NodePool, Role};
use super::sentinel::Sentinel;
use super::topology::Redirect;
use crate::codec::buffers::Buffers;
use crate::codec::call::Args;
use crate::codec::resp::{ProtocolError, View, MAX_REPLY_LEN};
use crate::codec::slot::key_slot;
use crate::metrics::{ErrorKind, Metrics};

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
    /// A Sentinel group's primary is one no more: `ROLE` said this instead of `master`.
    NotPrimary(String),
    /// No sentinel has named a primary of this group yet (or since the last one failed).
    NoPrimary(String),
}

impl RedisError {
    /// For the metrics; `None` for what is not Redis failing: an open breaker (not asked) and
    /// error replies, which are counted by their class.
    pub(super) fn kind(&self) -> Option<ErrorKind> {
        Some(match self {
            RedisError::Connect | RedisError::Tls(_) => ErrorKind::Refused,
            RedisError::Timeout => ErrorKind::Timeout,
            RedisError::Closed => ErrorKind::Closed,
            RedisError::Io => ErrorKind::Io,
            RedisError::Protocol(_) | RedisError::UnexpectedReply => ErrorKind::Protocol,
            RedisError::Overloaded => ErrorKind::Overloaded,
            RedisError::Unavailable
            | RedisError::Refused(_)
            | RedisError::NotPrimary(_)
            | RedisError::NoPrimary(_) => return None,
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
            RedisError::NotPrimary(role) if role.is_empty() => {
                f.write_str("is not a primary (unexpected ROLE reply)")
            }
            RedisError::NotPrimary(role) => write!(f, "is not a primary (ROLE says \"{role}\")"),
            RedisError::NoPrimary(name) => {
                write!(f, "has no primary known for sentinel group \"{name}\" yet")
            }
        }
    }
}

/// The part of a pending decision the pool may touch.
pub struct Waiter {
    pub result: Option<Result<Frame, RedisError>>,
    pub token: Option<Token>,
    /// Posted when `result` is set.
    pub ev: *mut ngx_event_t,
    /// Where its reply's bytes are kept: its owner's nginx pool (a request's), which outlives
    /// the waiter and whatever it was answered; null: the heap.
    pub pool: *mut ngx_pool_t,
}

impl Waiter {
    /// A waiter with nothing sent, its replies kept in `pool` (null: the heap).
    pub fn new(pool: *mut ngx_pool_t) -> Waiter {
        Waiter { result: None, token: None, ev: ptr::null_mut(), pool }
    }
}

/// A reply's bytes as its waiter gets them: framed whole by the connection, then copied out of
/// the read buffer, which the next read reuses, to where the waiter's owner keeps them. A
/// request's reply goes to its pool, which is no heap allocation and needs no freeing; the
/// bytes are read where they lie ([`Frame::view`]) instead of built into a `Reply` tree.
pub struct Frame(Kept);

enum Kept {
    /// In the waiter's pool, freed with it.
    Pooled(NonNull<[u8]>),
    Heap(Vec<u8>),
}

impl Frame {
    /// A copy of `bytes` in `pool` (null, or out of memory there: on the heap, in a buffer a
    /// frame dropped earlier left).
    ///
    /// # Safety
    /// `pool` is null or a live pool that outlives the frame.
    unsafe fn copy(bytes: &[u8], pool: *mut ngx_pool_t) -> Frame {
        let to = if pool.is_null() { ptr::null_mut() } else { ngx_pnalloc(pool, bytes.len()) };
        if to.is_null() {
            let mut room = SPARE_FRAMES.with(|s| s.borrow_mut().take());
            room.extend_from_slice(bytes);
            return Frame(Kept::Heap(room));
        }
        ptr::copy_nonoverlapping(bytes.as_ptr(), to as *mut u8, bytes.len());
        let kept = ptr::slice_from_raw_parts_mut(to as *mut u8, bytes.len());
        Frame(Kept::Pooled(NonNull::new_unchecked(kept)))
    }

    pub fn view(&self) -> View<'_> {
        View::of(match &self.0 {
            // SAFETY: copied there by `copy`, in a pool that outlives the frame.
            Kept::Pooled(bytes) => unsafe { bytes.as_ref() },
            Kept::Heap(bytes) => bytes,
        })
    }
}

std::thread_local! {
    /// Heap buffers of replies whose frames were dropped, 16 of 4 KiB at most: the replies of
    /// decisions sent without a request (give-backs, checks, renewals) come and go all the time,
    /// a `CLUSTER SLOTS` answer rarely. A worker is one thread.
    static SPARE_FRAMES: core::cell::RefCell<Buffers> = const {
        core::cell::RefCell::new(Buffers::new(16, 4096))
    };
}

impl Drop for Frame {
    fn drop(&mut self) {
        if let Kept::Heap(bytes) = &mut self.0 {
            let room = core::mem::take(bytes);
            // Not at the worker's exit, once the list is gone.
            let _ = SPARE_FRAMES.try_with(|s| s.borrow_mut().keep(room));
        }
    }
}

/// What a waiter sends. Its bytes are read only while the waiter is pending, and a cancelled
/// command is never written.
#[derive(Clone, Copy)]
pub enum Payload {
    /// One decision's share of a script call, in the request's pool.
    Decision(NonNull<Args>),
    /// A command of its own, RESP-encoded, owned by the pool (`PING`, `CLUSTER SLOTS`, ...).
    Raw(NonNull<[u8]>),
}

#[derive(Clone, Copy)]
pub struct Command {
    pub payload: Payload,
    /// Redis lost the script: `SCRIPT LOAD` it before the call that carries this decision.
    pub reload: bool,
    /// After a Cluster `ASK`: sent alone, right after `ASKING`.
    pub asking: bool,
    /// In a call of its own: its call with others was refused for one decision's keys.
    pub alone: bool,
    /// The most bytes a raw command's reply may take (decisions: `resp::MAX_REPLY_LEN`).
    pub max_reply: usize,
    /// On a Cluster, the slot of the decision's keys: one script call never spans two.
    /// `None` on one server, where any decisions may share a call.
    pub slot: Option<u16>,
}

impl Command {
    pub fn decision(args: &Args, reload: bool) -> Command {
        let payload = Payload::Decision(NonNull::from(args));
        Command {
            payload,
            reload,
            asking: false,
            alone: false,
            max_reply: MAX_REPLY_LEN,
            slot: None,
        }
    }

    /// What decides which calls it may join.
    pub(super) fn shape(&self) -> Shape {
        Shape { slot: self.slot, alone: self.alone || self.asking }
    }

    /// The command as a Cluster sends it: with its keys' slot.
    ///
    /// # Safety
    /// The decision's arguments are alive (the command is pending).
    unsafe fn in_slot(self) -> Command {
        match self.payload {
            Payload::Decision(args) => Command { slot: args.as_ref().slot(), ..self },
            Payload::Raw(_) => self,
        }
    }
}

/// Where a waiter's command sits: valid while the waiter is pending, because closing a
/// connection completes (and so detaches) every waiter on it.
#[derive(Clone, Copy)]
pub struct Token {
    pub(super) conn: NonNull<Conn>,
    pub(super) seq: u64,
}

/// This worker's way to Redis.
pub struct WorkerPool {
    mode: Mode,
}

/// Which node serves a command.
enum Mode {
    /// One server.
    Single(NonNull<NodePool>),
    Cluster(NonNull<Cluster>),
    /// The primary a Sentinel group names.
    Sentinel(NonNull<Sentinel>),
}

impl WorkerPool {
    /// This worker's pool for `conf`, kept in `cell` and created on first use: its nodes count
    /// what happens to them in `metrics`.
    pub fn get(
        cell: &Cell<*mut WorkerPool>,
        conf: &RedisConf,
        metrics: Metrics,
    ) -> Option<&'static mut WorkerPool> {
        let mut p = cell.get();
        if p.is_null() {
            let mode = if conf.cluster {
                Mode::Cluster(Cluster::create(conf, metrics))
            } else if conf.sentinel.is_some() {
                Mode::Sentinel(Sentinel::create(conf, metrics))
            } else {
                let addr = Addr::configured(&conf.seeds[0]);
                Mode::Single(NodePool::create(conf, addr, metrics, Role::Single))
            };
            p = Box::into_raw(Box::new(WorkerPool { mode }));
            cell.set(p);
        }
        // SAFETY: the pool lives until `destroy` at worker exit, and a worker is one thread.
        Some(unsafe { &mut *p })
    }

    /// Whether it serves a Redis Cluster, where redirections lead somewhere.
    pub fn cluster(&self) -> bool {
        matches!(self.mode, Mode::Cluster(_))
    }

    /// Closes every connection; at worker exit no request is pending any more.
    pub fn destroy(cell: &Cell<*mut WorkerPool>) {
        let p = cell.replace(ptr::null_mut());
        if p.is_null() {
            return;
        }
        // SAFETY: created by `get` with Box::into_raw; its nodes were created for it.
        unsafe {
            match Box::from_raw(p).mode {
                Mode::Single(node) => NodePool::destroy(node),
                Mode::Cluster(cluster) => Cluster::destroy(cluster),
                Mode::Sentinel(s) => Sentinel::destroy(s),
            }
        }
    }

    /// Whether a decision would be refused at once, its one server known down (the breaker
    /// open): its caller need not write it out. Only a single server is known that cheaply;
    /// `false` for a Cluster or a Sentinel group, whose refusals `submit` finds.
    pub fn refusing(&self) -> bool {
        match self.mode {
            // SAFETY: the nodes are alive while the pool is.
            Mode::Single(node) => unsafe { !node.as_ref().breaker.admit() },
            Mode::Cluster(_) | Mode::Sentinel(_) => false,
        }
    }

    /// Queues a command for `waiter` on the node that serves it.
    ///
    /// # Safety
    /// `cmd`'s bytes stay valid while `waiter` is pending.
    pub unsafe fn submit(
        &mut self,
        waiter: NonNull<Waiter>,
        cmd: Command,
    ) -> Result<Token, RedisError> {
        let (node, cmd) = match self.mode {
            Mode::Single(node) => (node, cmd),
            Mode::Sentinel(s) => ((*s.as_ptr()).primary()?, cmd),
            Mode::Cluster(cluster) => {
                let cmd = cmd.in_slot();
                ((*cluster.as_ptr()).route(cmd.slot.unwrap_or(0))?, cmd)
            }
        };
        let sent = (*node.as_ptr()).submit(waiter, cmd);
        if let (Err(_), Mode::Cluster(cluster)) = (&sent, &self.mode) {
            // A node that fails or is not asked may have been replaced by its replica.
            (*cluster.as_ptr()).refresh();
        }
        sent
    }

    /// Asks the node that holds `key` to tell this worker when it changes, so that a rejection
    /// of it may be remembered; false when that cannot be had now.
    pub fn track(&mut self, key: &[&[u8]]) -> bool {
        // SAFETY: the nodes are alive while the pool is.
        unsafe {
            let node = match self.mode {
                Mode::Single(node) => Ok(node),
                Mode::Sentinel(s) => (*s.as_ptr()).primary(),
                // Only where the table knows the key's node: a seed that does not hold it would
                // never tell of its changes.
                Mode::Cluster(c) => {
                    (*c.as_ptr()).owner(key_slot(key)).ok_or(RedisError::Unavailable)
                }
            };
            node.is_ok_and(|n| (*n.as_ptr()).track(key))
        }
    }

    /// Follows a Cluster redirection: `MOVED` patches the table and goes where it now points,
    /// `ASK` sends this one command, after `ASKING`, to the node importing the slot. Without
    /// `cluster=on` there is nowhere to follow it to.
    ///
    /// # Safety
    /// As for [`WorkerPool::submit`].
    pub unsafe fn redirect(
        &mut self,
        waiter: NonNull<Waiter>,
        cmd: Command,
        to: &Redirect,
    ) -> Result<Token, RedisError> {
        let Mode::Cluster(cluster) = self.mode else { return Err(RedisError::Unavailable) };
        let cluster = &mut *cluster.as_ptr();
        match to {
            Redirect::Moved { slot, to } => {
                cluster.moved(*slot, to);
                self.submit(waiter, cmd)
            }
            Redirect::Ask { to, .. } => {
                let node = cluster.node(to)?;
                (*node.as_ptr()).submit(waiter, Command { asking: true, ..cmd.in_slot() })
            }
        }
    }

    /// Detaches a waiter from its slot; the reply, when it comes, is dropped. True if the
    /// command had been written: Redis may still run it.
    pub fn cancel(token: Token) -> bool {
        // SAFETY: a token is only held by a pending waiter, whose connection is alive.
        unsafe { Conn::cancel(token) }
    }

    /// A decision's deadline passed before its node answered: a Redis too slow for the traffic
    /// counts as failing, or the breaker would never spare requests the wait.
    pub fn timed_out(token: Token) {
        // SAFETY: as for `cancel`; the node outlives its connections.
        unsafe {
            (*Conn::node(token)).failed(&RedisError::Timeout);
            Conn::cancel(token);
        }
    }
}

pub(super) fn now() -> u64 {
    // SAFETY: a worker's cached clock, read on its only thread.
    unsafe { ngx_current_msec as u64 }
}

pub(super) fn log() -> *mut ngx::ffi::ngx_log_t {
    // SAFETY: the cycle (and its log) exists whenever a worker runs event handlers.
    unsafe { (*ngx_cycle).log }
}

/// Stores a waiter's result, the reply's bytes copied where it keeps them, and wakes its
/// request through its posted event.
///
/// # Safety
/// `w` is a pending waiter: its request has not run its cleanup.
pub(super) unsafe fn complete(w: NonNull<Waiter>, result: Result<View<'_>, RedisError>) {
    let w = &mut *w.as_ptr();
    w.result = Some(result.map(|reply| Frame::copy(reply.bytes(), w.pool)));
    w.token = None;
    ngx_post_event(w.ev, ptr::addr_of_mut!(ngx_posted_events));
}

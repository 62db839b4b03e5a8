//! One Redis connection on nginx's event loop: connect, batched writes, incremental reads, and
//! replies matched in order to the decisions waiting for them.
//!
//! Bounded whatever Redis does: decisions wait in `queued` (a pointer each, no bytes) until the
//! previous write has left, at most `MAX_IN_FLIGHT` of them are on the wire, the output buffer
//! stays near `OUT_HIGH`, and a decision whose request has given up before it was written is
//! never sent. Every command must be answered within `timeout` of being written, the oldest
//! first: a Redis that reads or answers too slowly loses the connection, which counts as a
//! failure for the breaker. The writing side is [`write`], the reading side [`read`].

use core::ffi::{c_int, c_void};
use core::ptr::{self, NonNull};
use std::collections::VecDeque;
use std::time::Instant;

use ngx::ffi::{
    getsockopt, linger, ngx_add_timer, ngx_close_connection, ngx_connection_t, ngx_current_msec,
    ngx_cycle, ngx_del_timer, ngx_delete_posted_event, ngx_event_connect_peer, ngx_event_get_peer,
    ngx_event_t, ngx_log_t, ngx_msec_int_t, ngx_msec_t, ngx_peer_connection_t, ngx_post_event,
    ngx_posted_events, ngx_str_t, ngx_tcp_nodelay, setsockopt, socklen_t, NGX_AGAIN, NGX_LOG_EMERG,
    NGX_OK, SOL_SOCKET, SO_ERROR, SO_LINGER,
};

use super::node::NodePool;
use super::pool::{complete, Command, RedisError, Token, Waiter};
use super::tls;
use super::tracker::Tracker;
use crate::codec::call::MAX_BATCH_DECISIONS;
use crate::codec::resp;
use crate::metrics::Gauge;

mod read;
mod write;

const READ_CHUNK: usize = 4096;
/// Decisions written and not yet answered, per connection. Redis runs them one after another,
/// so a deeper pipeline adds latency, not throughput; the rest wait in `queued`, where a request
/// that gives up costs nothing.
const MAX_IN_FLIGHT: usize = 512;
/// Decisions per connection, queued and in flight: past this the pool answers `Overloaded`.
pub const MAX_OUTSTANDING: usize = 4096;
/// Queued decisions are written while the output buffer holds less than this.
const OUT_HIGH: usize = 256 * 1024;
/// Buffers grown past this by a burst are given back once empty.
const KEEP_CAPACITY: usize = 64 * 1024;

/// A decision not yet written.
struct Queued {
    seq: u64,
    waiter: NonNull<Waiter>,
    cmd: Command,
}

impl Queued {
    /// A decision of a call that must be sent again, in a call of its own.
    fn alone(seq: u64, waiter: NonNull<Waiter>, cmd: Command) -> Queued {
        Queued { seq, waiter, cmd: Command { alone: true, ..cmd } }
    }
}

/// A set-up command, sent first on every new connection; nothing else is written until each
/// has been answered, as Redis answers an unauthenticated command of more than 10 arguments
/// with a protocol error, not `NOAUTH`, and a decision must never reach the wrong database or
/// a primary that is one no more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    Auth,
    Select,
    /// Checked to say `master` (a Sentinel group's primary).
    Role,
}

/// A command written and not yet answered.
struct Sent {
    /// When it was written: its reply is due `timeout` later.
    at: ngx_msec_t,
    /// How many of the oldest decisions in flight its reply answers; 0 for commands whose
    /// reply is dropped (`SCRIPT LOAD`, `ASKING`) and for set-up.
    decides: usize,
    /// A set-up command: its reply is judged by the node.
    setup: Option<Setup>,
    /// The same moment on a clock finer than nginx's ms, for the round-trip histogram.
    written: Instant,
    /// The most bytes its reply may take.
    max_reply: usize,
    /// A node's batch of decisions of several slots.
    mixed: bool,
}

impl Sent {
    /// A command that is no set-up, whose reply answers `decides` decisions (0: dropped, or a
    /// tracker's).
    fn new(at: ngx_msec_t, decides: usize, written: Instant, max_reply: usize) -> Sent {
        Sent { at, decides, setup: None, written, max_reply, mixed: false }
    }
}

pub struct Conn {
    pool: *mut NodePool,
    pc: ngx_peer_connection_t,
    /// A copy of the cycle log: a connection outlives the requests it serves and must never log
    /// through one of theirs.
    log: ngx_log_t,
    name: ngx_str_t,
    connected: bool,
    out: Vec<u8>,
    out_pos: usize,
    inbuf: Vec<u8>,
    /// The framing of the reply at the start of `inbuf` so far.
    framer: resp::Framer,
    queued: VecDeque<Queued>,
    /// Decisions written, in the order written (their replies' order), with their sequence
    /// number and what was sent for them; `None` is a request that went away, whose reply is read
    /// and dropped.
    in_flight: VecDeque<(u64, Option<NonNull<Waiter>>, Command)>,
    /// Commands written, oldest first: one reply each.
    sent: VecDeque<Sent>,
    next_seq: u64,
    /// Set-up commands not answered yet: nothing else is written meanwhile.
    setting_up: usize,
    /// Posted by the first command of an event-loop iteration; writes the whole batch.
    flush_ev: ngx_event_t,
    /// A connection of the node's tracker (`true`: its subscriber), never used for decisions:
    /// every reply goes to the tracker, asked for or not (invalidation messages).
    dedicated: Option<(NonNull<Tracker>, bool)>,
    /// Made for one command whose reply may take long to read (`make_private`).
    private: bool,
    /// When it last went idle: the keepalive counts from here, whatever its timer says.
    idle_since: ngx_msec_t,
}

impl Conn {
    /// Decisions this connection carries, queued or in flight.
    pub fn load(&self) -> usize {
        self.queued.len() + self.in_flight.len()
    }

    pub fn private(&self) -> bool {
        self.private
    }

    /// Reserves a new connection for one command whose reply may take long to read: no
    /// decision is given to it, and it closes once idle.
    ///
    /// # Safety
    /// `this` is a live connection.
    pub unsafe fn make_private(this: NonNull<Conn>) {
        (*this.as_ptr()).private = true;
    }

    /// Whether decisions wait to be written in a call that has room for one more.
    pub fn batch_open(&self) -> bool {
        (1..MAX_BATCH_DECISIONS).contains(&self.queued.len())
    }

    fn c(&self) -> *mut ngx_connection_t {
        self.pc.connection
    }

    /// Starts a non-blocking connect. Commands may be queued at once; they go out when the
    /// connection is writable.
    pub fn connect(pool: *mut NodePool) -> Result<NonNull<Conn>, RedisError> {
        // SAFETY: `pool` is this worker's live pool; ngx_cycle is set in a worker.
        unsafe {
            let conf = (*pool).conf();
            let name = &(*pool).addr.name;
            let mut conn = Box::new(Conn {
                pool,
                pc: core::mem::zeroed(),
                log: *(*ngx_cycle).log,
                name: ngx_str_t { len: name.len(), data: name.as_ptr() as *mut u8 },
                connected: false,
                out: Vec::with_capacity(READ_CHUNK),
                out_pos: 0,
                inbuf: Vec::with_capacity(READ_CHUNK),
                framer: resp::Framer::default(),
                queued: VecDeque::new(),
                in_flight: VecDeque::new(),
                sent: VecDeque::new(),
                next_seq: 0,
                setting_up: 0,
                flush_ev: core::mem::zeroed(),
                dedicated: None,
                private: false,
                idle_since: 0,
            });
            if (*pool).reported() {
                // nginx logs each failed connect() itself; an outage was already reported.
                conn.log.log_level = NGX_LOG_EMERG as _;
            }
            let this: *mut Conn = &mut *conn;
            let pc = &mut (*this).pc;
            (pc.sockaddr, pc.socklen) = (*pool).addr.sockaddr();
            pc.name = &mut (*this).name;
            pc.get = Some(ngx_event_get_peer);
            pc.log = &mut (*this).log;
            pc.set_log_error(ngx::ffi::ngx_connection_log_error_e_NGX_ERROR_ERR as _);

            let rc = ngx_event_connect_peer(pc);
            if rc != NGX_OK as isize && rc != NGX_AGAIN as isize {
                // The caller counts and logs the failure.
                return Err(RedisError::Connect);
            }
            conn.log.log_level = (*(*ngx_cycle).log).log_level;
            let c = pc.connection;
            // A reset by Redis (a restart) is reported once by the pool; nginx's own recv()
            // line would repeat it for every connection.
            (*c).set_log_error(
                ngx::ffi::ngx_connection_log_error_e_NGX_ERROR_IGNORE_ECONNRESET as _,
            );
            (*c).data = this as *mut c_void;
            (*(*c).read).handler = Some(on_read);
            (*(*c).write).handler = Some(on_write);
            conn.flush_ev.handler = Some(on_flush);
            conn.flush_ev.data = c as *mut c_void;
            conn.flush_ev.log = &mut (*this).log;
            if rc == NGX_AGAIN as isize {
                ngx_add_timer((*c).write, conf.connect_timeout);
            } else if conf.tls.is_some() {
                // TLS: on_write starts the handshake, within the connect deadline.
                ngx_add_timer((*c).write, conf.connect_timeout);
                ngx_post_event((*c).write, ptr::addr_of_mut!(ngx_posted_events));
            } else {
                conn.connected = true;
            }
            // First on the wire, in one write (they are short, so Redis accepts them before
            // authentication); each reply is checked by the node. Their deadline runs from the
            // connect, as they are written as soon as the connection is.
            for (step, bytes) in (*pool).setup() {
                conn.out.extend_from_slice(bytes);
                let sent = Sent::new(ngx_current_msec, 0, Instant::now(), resp::MAX_REPLY_LEN);
                conn.sent.push_back(Sent { setup: Some(step), ..sent });
                conn.setting_up += 1;
            }
            if conn.setting_up > 0 {
                ngx_add_timer((*c).read, conf.timeout);
            }
            if !(*pool).addr.is_unix {
                // Small pipelined writes must not wait for Nagle and delayed ACKs.
                ngx_tcp_nodelay(c);
            }
            Ok(NonNull::new_unchecked(Box::into_raw(conn)))
        }
    }

    /// A connection for `tracker` alone, outside the node's pool: set up like the others
    /// (`AUTH`, ...), then written to with [`Conn::send`].
    pub fn dedicated(
        pool: *mut NodePool,
        tracker: NonNull<Tracker>,
        subscriber: bool,
    ) -> Result<NonNull<Conn>, RedisError> {
        let conn = Conn::connect(pool)?;
        // SAFETY: just made, and not yet known to anything else.
        unsafe { (*conn.as_ptr()).dedicated = Some((tracker, subscriber)) };
        Ok(conn)
    }

    /// Writes a command of a dedicated connection (`write` appends it to the output, where it
    /// is encoded); its reply goes to the tracker.
    ///
    /// # Safety
    /// `this` is a live dedicated connection.
    pub unsafe fn send(this: NonNull<Conn>, write: impl FnOnce(&mut Vec<u8>)) {
        let conn = &mut *this.as_ptr();
        write(&mut conn.out);
        let sent = Sent::new(ngx_current_msec, 0, Instant::now(), resp::MAX_REPLY_LEN);
        conn.sent.push_back(sent);
        ngx_post_event(&mut conn.flush_ev, ptr::addr_of_mut!(ngx_posted_events));
    }

    /// Closes a dedicated connection without telling its tracker, which is closing it.
    ///
    /// # Safety
    /// `this` is a live dedicated connection.
    pub unsafe fn close_dedicated(this: NonNull<Conn>) {
        (*this.as_ptr()).dedicated = None;
        Conn::close(this, RedisError::Closed, false);
    }

    /// Queues a decision; everything queued in one event-loop iteration goes out in one write.
    ///
    /// # Safety
    /// `this` is a live connection of the worker's pool, and `cmd`'s arguments stay valid while
    /// `waiter` is pending.
    pub unsafe fn push(this: NonNull<Conn>, waiter: NonNull<Waiter>, cmd: Command) -> Token {
        let conn = &mut *this.as_ptr();
        if conn.load() == 0 && conn.sent.is_empty() {
            // Leaving idle. Its timer stays: writing sets it to the reply deadline, which nginx
            // does not move within 300 ms of where it is, so a busy connection's calls mostly
            // leave nginx's timer tree alone (each took the keepalive off and put the deadline
            // on, and the reverse on its reply).
            (*conn.c()).set_idle(0);
        }
        let seq = conn.next_seq;
        conn.next_seq += 1;
        conn.queued.push_back(Queued { seq, waiter, cmd });
        ngx_post_event(&mut conn.flush_ev, ptr::addr_of_mut!(ngx_posted_events));
        Token { conn: this, seq }
    }

    /// Detaches a waiter: a queued decision is dropped unsent, one in flight leaves a tombstone.
    /// True if it was in flight: Redis may still run it.
    ///
    /// # Safety
    /// The token's waiter is pending, so its connection is alive.
    pub unsafe fn cancel(token: Token) -> bool {
        let conn = &mut *token.conn.as_ptr();
        let seq = token.seq;
        let i = conn.queued.partition_point(|q| q.seq < seq);
        if conn.queued.get(i).is_some_and(|q| q.seq == seq) {
            conn.queued.remove(i);
            return false;
        }
        // Looked at one by one, not halved: a decision written again (its call refused for one
        // of its keys, a redirection) keeps its number, to keep its place by age in `queued`,
        // and comes after decisions with higher ones here.
        if let Some(slot) = conn.in_flight.iter_mut().find(|(s, _, _)| *s == seq) {
            slot.1 = None;
            return true;
        }
        false
    }

    /// Closes the connection and fails every decision still waiting on it. Nothing may touch
    /// `this` afterwards.
    pub fn close(this: NonNull<Conn>, why: RedisError, log: bool) {
        // SAFETY: `this` was created by `connect` and is still owned by its pool, which is
        // reached through the raw pointer only.
        unsafe {
            let conn = Box::from_raw(this.as_ptr());
            // A tracker's connection is no decision's: the node's own connections report Redis
            // failing, and count in its gauges.
            if let Some((tracker, _)) = conn.dedicated {
                (*tracker.as_ptr()).closed(this);
            } else {
                if log {
                    (*conn.pool).failed(&why);
                }
                (*conn.pool).metrics.gauge(Gauge::InFlight, -(conn.in_flight.len() as i64));
                (*conn.pool).forget(this);
            }
            if conn.flush_ev.posted() != 0 {
                ngx_delete_posted_event(ptr::addr_of!(conn.flush_ev) as *mut _);
            }
            if matches!(why, RedisError::Timeout) {
                // What was written and not answered may still wait in the kernel's send
                // buffer: when a partition heals, TCP would deliver it and Redis would run
                // decisions given up on long ago (a request ratelimit_fail denied counted, an
                // ended request's slot written back). A reset drops it, as nginx's
                // `reset_timedout_connection` does. What already reached Redis's socket may still
                // run: what such a late decision grants is released by the orphan sweep.
                reset_on_close(conn.c());
            }
            let tls_pool = tls::shutdown(conn.c());
            ngx_close_connection(conn.c());
            tls::destroy_pool(tls_pool);
            let queued = conn.queued.iter().map(|q| q.waiter);
            for w in conn.in_flight.iter().filter_map(|&(_, w, _)| w).chain(queued) {
                complete(w, Err(why.clone()));
            }
        }
    }

    /// The node a pending waiter's command went to.
    ///
    /// # Safety
    /// The token's waiter is pending, so its connection is alive.
    pub unsafe fn node(token: Token) -> *mut NodePool {
        (*token.conn.as_ptr()).pool
    }
}

/// # Safety
/// `c->data` of every connection this module creates is its `Conn`.
unsafe fn conn_of(ev: *mut ngx_event_t) -> NonNull<Conn> {
    let c = (*ev).data as *mut ngx_connection_t;
    NonNull::new_unchecked((*c).data as *mut Conn)
}

unsafe extern "C" fn on_flush(ev: *mut ngx_event_t) {
    Conn::flush(conn_of(ev));
}

unsafe extern "C" fn on_write(wev: *mut ngx_event_t) {
    let this = conn_of(wev);
    let conn = &mut *this.as_ptr();
    if !conn.connected {
        if (*wev).timedout() != 0 {
            return Conn::close(this, RedisError::Timeout, true);
        }
        if !connect_succeeded(conn.c()) {
            return Conn::close(this, RedisError::Connect, true);
        }
        if let Some(t) = &(*conn.pool).conf().tls {
            // Nothing is written before the handshake ends: `connected` stays false.
            let quiet = (*conn.pool).breaker.failing();
            return match tls::start(conn.c(), &conn.pc, t, on_handshake, quiet) {
                Ok(true) => on_handshake(conn.c()),
                Ok(false) => {}
                Err(e) => Conn::close(this, e, true),
            };
        }
        conn.connected = true;
        if (*wev).timer_set() != 0 {
            ngx_del_timer(wev);
        }
    } else if (*wev).timedout() != 0 {
        return Conn::close(this, RedisError::Timeout, true);
    } else if conn.out_pos == conn.out.len() {
        // Nothing left over to write: edge-triggered epoll reports the socket writable with
        // every reply that arrives, mid-iteration. The decisions queued so far go with the rest
        // of the iteration's, from the flush their first push posted.
        return;
    }
    Conn::flush(this);
}

/// `c->ssl->handler`: the TLS handshake ended, failed or timed out. On success the connection
/// is ours again, connected, and what waited for it (`AUTH`, decisions) goes out.
unsafe extern "C" fn on_handshake(c: *mut ngx_connection_t) {
    let this = NonNull::new_unchecked((*c).data as *mut Conn);
    let conn = &mut *this.as_ptr();
    let t = (*conn.pool).conf().tls.as_ref().expect("a TLS connection has TLS settings");
    if let Err(e) = tls::finish(c, t) {
        return Conn::close(this, e, true);
    }
    (*(*c).read).handler = Some(on_read);
    (*(*c).write).handler = Some(on_write);
    conn.connected = true;
    if (*(*c).write).timer_set() != 0 {
        ngx_del_timer((*c).write);
    }
    Conn::flush(this);
}

unsafe extern "C" fn on_read(rev: *mut ngx_event_t) {
    let this = conn_of(rev);
    let conn = &*this.as_ptr();
    let c = conn.c();
    if (*c).close() != 0 {
        // Graceful shutdown closing idle connections.
        return Conn::close(this, RedisError::Closed, false);
    }
    if (*rev).timedout() != 0 {
        (*rev).set_timedout(0);
        if conn.sent.is_empty() {
            if !conn.queued.is_empty() {
                // Used again in this iteration: the flush sets the reply deadline.
                return;
            }
            // Idle: the keepalive, or a reply deadline left armed when it went idle.
            let keepalive = (*conn.pool).conf().keepalive_timeout;
            let left = conn.idle_since.wrapping_add(keepalive).wrapping_sub(ngx_current_msec);
            if (left as ngx_msec_int_t) > 0 {
                ngx_add_timer(rev, left);
                return;
            }
            return Conn::close(this, RedisError::Closed, false);
        }
        if conn.overdue() {
            // Counted once, unless each decision that waited for it counted its own deadline
            // already (which gave up its place): a decision whose deadline falls in the same
            // timer pass, after this one, learns of the timeout from the close and counts none.
            let uncounted = conn.in_flight.iter().any(|&(_, w, _)| w.is_some());
            return Conn::close(this, RedisError::Timeout, uncounted);
        }
        (*this.as_ptr()).arm_reply_deadline();
        return;
    }
    if !conn.connected {
        // Readable before writable means the connect failed; on_write reports it.
        if !connect_succeeded(c) {
            return Conn::close(this, RedisError::Connect, true);
        }
        return;
    }
    Conn::read(this);
}

/// Makes the coming close send a reset and drop unsent data (`SO_LINGER` of 0), as
/// `ngx_http_free_request` does for `reset_timedout_connection`. Best effort: a failure
/// leaves the ordinary close.
unsafe fn reset_on_close(c: *mut ngx_connection_t) {
    let l = linger { l_onoff: 1, l_linger: 0 };
    let len = size_of::<linger>() as socklen_t;
    setsockopt((*c).fd, SOL_SOCKET as c_int, SO_LINGER as c_int, ptr::addr_of!(l).cast(), len);
}

/// The outcome of a non-blocking connect, as `ngx_http_upstream_test_connect` reads it.
unsafe fn connect_succeeded(c: *mut ngx_connection_t) -> bool {
    let mut err: c_int = 0;
    let mut len = size_of::<c_int>() as socklen_t;
    let rc = getsockopt(
        (*c).fd,
        SOL_SOCKET as c_int,
        SO_ERROR as c_int,
        &mut err as *mut c_int as *mut c_void,
        &mut len,
    );
    rc == 0 && err == 0
}

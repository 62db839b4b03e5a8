//! One Redis connection on nginx's event loop: connect, batched writes, incremental reads, and
//! replies matched in order to the decisions waiting for them.

use core::ffi::{c_int, c_void};
use core::ptr::{self, NonNull};
use std::collections::VecDeque;

use ngx::ffi::{
    getsockopt, ngx_add_timer, ngx_close_connection, ngx_connection_t, ngx_cycle, ngx_del_timer,
    ngx_delete_posted_event, ngx_event_connect_peer, ngx_event_get_peer, ngx_event_t, ngx_exiting,
    ngx_handle_read_event, ngx_handle_write_event, ngx_log_t, ngx_peer_connection_t,
    ngx_post_event, ngx_posted_events, ngx_str_t, ngx_tcp_nodelay, socklen_t, NGX_AGAIN,
    NGX_LOG_EMERG, NGX_OK, SOL_SOCKET, SO_ERROR,
};

use super::pool::{complete, RedisError, Token, Waiter, WorkerPool};
use super::resp;

const READ_CHUNK: usize = 4096;

pub struct Conn {
    pool: *mut WorkerPool,
    pc: ngx_peer_connection_t,
    /// A copy of the cycle log: a connection outlives the requests it serves and must never log
    /// through one of theirs.
    log: ngx_log_t,
    name: ngx_str_t,
    connected: bool,
    out: Vec<u8>,
    out_pos: usize,
    inbuf: Vec<u8>,
    /// One slot per command sent or queued, oldest first; `None` is a cancelled waiter.
    slots: VecDeque<Option<NonNull<Waiter>>>,
    /// Sequence number of `slots[0]`.
    head_seq: u64,
    /// Posted by the first command of an event-loop iteration; writes the whole batch.
    flush_ev: ngx_event_t,
}

impl Conn {
    pub fn in_flight(&self) -> usize {
        self.slots.len()
    }

    fn c(&self) -> *mut ngx_connection_t {
        self.pc.connection
    }

    /// Starts a non-blocking connect. Commands may be queued at once; they go out when the
    /// connection is writable.
    pub fn connect(pool: *mut WorkerPool) -> Result<NonNull<Conn>, RedisError> {
        // SAFETY: `pool` is this worker's live pool; ngx_cycle is set in a worker.
        unsafe {
            let conf = (*pool).conf();
            let mut conn = Box::new(Conn {
                pool,
                pc: core::mem::zeroed(),
                log: *(*ngx_cycle).log,
                name: ngx_str_t { len: conf.name.len(), data: conf.name.as_ptr() as *mut u8 },
                connected: false,
                out: Vec::with_capacity(READ_CHUNK),
                out_pos: 0,
                inbuf: Vec::with_capacity(READ_CHUNK),
                slots: VecDeque::new(),
                head_seq: 0,
                flush_ev: core::mem::zeroed(),
            });
            if (*pool).breaker.failing() {
                // nginx logs each failed connect() itself; an outage was already reported.
                conn.log.log_level = NGX_LOG_EMERG as _;
            }
            let this: *mut Conn = &mut *conn;
            let pc = &mut (*this).pc;
            pc.sockaddr = conf.sockaddr;
            pc.socklen = conf.socklen;
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
            } else {
                conn.connected = true;
            }
            if let Some(auth) = &conf.auth {
                // First on the wire; its reply is checked by the pool like any other (a
                // `WRONGPASS` counts as a failure) and then dropped.
                conn.out.extend_from_slice(auth);
                conn.slots.push_back(None);
                ngx_add_timer((*c).read, conf.timeout);
            }
            if !conf.is_unix {
                // Small pipelined writes must not wait for Nagle and delayed ACKs.
                ngx_tcp_nodelay(c);
            }
            Ok(NonNull::new_unchecked(Box::into_raw(conn)))
        }
    }

    /// # Safety
    /// `this` is a live connection of the worker's pool.
    pub unsafe fn push(
        this: NonNull<Conn>,
        waiter: NonNull<Waiter>,
        discarded: usize,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> Token {
        let conn = &mut *this.as_ptr();
        let was_idle = conn.slots.is_empty();
        write(&mut conn.out);
        conn.slots.extend(core::iter::repeat_n(None, discarded));
        let seq = conn.head_seq + conn.slots.len() as u64;
        conn.slots.push_back(Some(waiter));
        let rev = (*conn.c()).read;
        if was_idle {
            // Leaving idle: the keepalive timer becomes the reply deadline.
            (*conn.c()).set_idle(0);
            ngx_add_timer(rev, (*conn.pool).conf().timeout);
        }
        ngx_post_event(&mut conn.flush_ev, ptr::addr_of_mut!(ngx_posted_events));
        Token { conn: this, seq }
    }

    /// # Safety
    /// The token's waiter is pending, so its connection is alive.
    pub unsafe fn cancel(token: Token) {
        let conn = &mut *token.conn.as_ptr();
        if let Some(slot) = conn.slots.get_mut((token.seq - conn.head_seq) as usize) {
            *slot = None;
        }
    }

    /// Closes the connection and fails every decision still waiting on it. Nothing may touch
    /// `this` afterwards.
    pub fn close(this: NonNull<Conn>, why: RedisError, log: bool) {
        // SAFETY: `this` was created by `connect` and is still owned by its pool.
        unsafe {
            let conn = Box::from_raw(this.as_ptr());
            let pool = &mut *conn.pool;
            if log {
                pool.failed(&why);
            }
            pool.forget(this);
            if conn.flush_ev.posted() != 0 {
                ngx_delete_posted_event(ptr::addr_of!(conn.flush_ev) as *mut _);
            }
            ngx_close_connection(conn.c());
            for w in conn.slots.iter().flatten() {
                complete(*w, Err(why.clone()));
            }
        }
    }

    /// Writes as much of the queued output as the socket takes.
    unsafe fn flush(this: NonNull<Conn>) {
        let conn = &mut *this.as_ptr();
        let c = conn.c();
        while conn.connected && conn.out_pos < conn.out.len() {
            let rest = &conn.out[conn.out_pos..];
            let n = ((*c).send.expect("send"))(c, rest.as_ptr() as *mut u8, rest.len());
            if n > 0 {
                conn.out_pos += n as usize;
            } else if n == NGX_AGAIN as isize {
                break;
            } else {
                return Conn::close(this, RedisError::Io, true);
            }
        }
        let wev = (*c).write;
        if conn.out_pos == conn.out.len() {
            conn.out.clear();
            conn.out_pos = 0;
            if conn.connected && (*wev).timer_set() != 0 {
                ngx_del_timer(wev);
            }
        } else if conn.connected {
            ngx_add_timer(wev, (*conn.pool).conf().timeout);
        }
        if ngx_handle_write_event(wev, 0) != NGX_OK as isize {
            Conn::close(this, RedisError::Io, true);
        }
    }

    unsafe fn read(this: NonNull<Conn>) {
        let conn = &mut *this.as_ptr();
        let c = conn.c();
        let pool = &mut *conn.pool;
        let mut progressed = false;
        let mut replace = false;
        // Read in rounds of at most one reply's worth, decoding between them: the socket is
        // edge-triggered, so it is read until EAGAIN, but never buffered without bound.
        let eof = loop {
            let mut drained = false;
            let mut eof = false;
            while conn.inbuf.len() <= resp::MAX_REPLY_LEN {
                conn.inbuf.reserve(READ_CHUNK);
                let len = conn.inbuf.len();
                let spare = conn.inbuf.capacity() - len;
                let dst = conn.inbuf.as_mut_ptr().add(len);
                let n = ((*c).recv.expect("recv"))(c, dst, spare);
                if n > 0 {
                    conn.inbuf.set_len(len + n as usize);
                } else if n == 0 {
                    eof = true;
                    break;
                } else if n == NGX_AGAIN as isize {
                    drained = true;
                    break;
                } else {
                    return Conn::close(this, RedisError::Io, true);
                }
            }
            let mut pos = 0;
            loop {
                match resp::decode(&conn.inbuf[pos..]) {
                    Ok(Some((reply, used))) => {
                        pos += used;
                        let Some(slot) = conn.slots.pop_front() else {
                            return Conn::close(this, RedisError::UnexpectedReply, true);
                        };
                        conn.head_seq += 1;
                        progressed = true;
                        replace |= pool.replied(&reply);
                        if let Some(w) = slot {
                            complete(w, Ok(reply));
                        }
                    }
                    Ok(None) => break,
                    Err(e) => return Conn::close(this, RedisError::Protocol(e), true),
                }
            }
            conn.inbuf.drain(..pos);
            if eof || drained {
                break eof;
            }
        };
        if eof {
            // Redis closing an idle connection (its `timeout`, a restart) is no outage.
            let busy = !conn.slots.is_empty();
            return Conn::close(this, RedisError::Closed, busy);
        }
        if replace {
            // Already counted as a failure; what is still pending follows the fail policy.
            return Conn::close(this, RedisError::Closed, false);
        }
        let rev = (*c).read;
        if conn.slots.is_empty() {
            if ngx_exiting != 0 {
                return Conn::close(this, RedisError::Closed, false);
            }
            // Idle: graceful shutdown may close it (`c->close`), the keepalive timer too.
            (*c).set_idle(1);
            ngx_add_timer(rev, pool.conf().keepalive_timeout);
        } else if progressed {
            ngx_add_timer(rev, pool.conf().timeout);
        }
        if ngx_handle_read_event(rev, 0) != NGX_OK as isize {
            Conn::close(this, RedisError::Io, true);
        }
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
        conn.connected = true;
        if (*wev).timer_set() != 0 {
            ngx_del_timer(wev);
        }
    } else if (*wev).timedout() != 0 {
        return Conn::close(this, RedisError::Timeout, true);
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
        let busy = !conn.slots.is_empty();
        return Conn::close(this, RedisError::Timeout, busy);
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

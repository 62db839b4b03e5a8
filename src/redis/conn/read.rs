//! A connection's reading side: replies framed as they arrive and matched in order to what was
//! written: set-up answers judged by the node, a call's replies handed to its decisions as their
//! bytes, those to send again requeued, a tracking connection's kept for its tracker, and the
//! connection kept idle, closed or replaced after.

use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_add_timer, ngx_current_msec, ngx_del_timer, ngx_exiting, ngx_handle_read_event,
    ngx_msec_int_t, ngx_post_event, ngx_posted_events, NGX_AGAIN, NGX_OK,
};

use super::{Conn, Queued, KEEP_CAPACITY, READ_CHUNK};
use crate::codec::call;
use crate::codec::resp::{self, View};
use crate::metrics::Gauge;
use crate::redis::batch;
use crate::redis::pool::{complete, RedisError};
use crate::redis::topology::redirect_from;

impl Conn {
    /// Puts decisions of an answered call back in the queue, in their place by age: before
    /// anything queued after them, and in the order `cancel` looks them up in there. Written
    /// again, they come after decisions with higher numbers in `in_flight`.
    fn requeue(&mut self, again: Vec<Queued>) {
        for q in again {
            let i = self.queued.partition_point(|x| x.seq < q.seq);
            self.queued.insert(i, q);
        }
    }

    pub(super) unsafe fn read(this: NonNull<Conn>) {
        let conn = &mut *this.as_ptr();
        let c = conn.c();
        let pool = &mut *conn.pool;
        let mut replace = false;
        // Read in rounds of at most one reply's worth, framing between them: the socket is
        // edge-triggered, so it is read until EAGAIN, but never buffered without bound.
        let eof = loop {
            let mut drained = false;
            let mut eof = false;
            let limit =
                |conn: &Conn| conn.sent.front().map_or(resp::MAX_REPLY_LEN, |s| s.max_reply);
            while conn.inbuf.len() <= limit(conn) {
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
            // Out of the connection while its replies are handed on: they are read where they
            // lie, and the connection changes meanwhile (its queues, or closed).
            let inbuf = core::mem::take(&mut conn.inbuf);
            loop {
                let max = limit(conn);
                match conn.framer.frame(&inbuf[pos..], max) {
                    Ok(Some(used)) => {
                        let mut reply = View::of(&inbuf[pos..pos + used]);
                        pos += used;
                        // `MOVED 3999 :6381` means this node's host; other error replies
                        // (NOSCRIPT, a key's refusal) need no address worked out.
                        let redirected;
                        if let Some(e) = reply.error() {
                            let redirect = e.starts_with(b"MOVED ") || e.starts_with(b"ASK ");
                            let asked = || pool.addr.node_addr();
                            if let Some(e) =
                                redirect.then(asked).flatten().and_then(|a| redirect_from(e, &a))
                            {
                                redirected = resp::error_reply(&e);
                                reply = View::of(&redirected);
                            }
                        }
                        let late = conn.overdue();
                        let sent = conn.sent.pop_front();
                        if let Some((tracker, sub)) = conn.dedicated {
                            if sent.as_ref().is_none_or(|s| s.setup.is_none()) {
                                // Asked for or not: an invalidation comes unasked.
                                (*tracker.as_ptr()).replied(sub, reply);
                                continue;
                            }
                        }
                        let Some(sent) = sent else {
                            return Conn::close(this, RedisError::UnexpectedReply, true);
                        };
                        if let Some(step) = sent.setup {
                            if let Err(why) = pool.set_up(step, reply) {
                                // What waits here follows the fail policy; a new connection
                                // tries again (or a Sentinel group asks for its primary).
                                return Conn::close(this, why, true);
                            }
                            conn.setting_up -= 1;
                            if conn.setting_up == 0 {
                                ngx_post_event(
                                    &mut conn.flush_ev,
                                    ptr::addr_of_mut!(ngx_posted_events),
                                );
                            }
                            continue;
                        }
                        replace |= pool.replied(reply, late);
                        if sent.decides == 0 {
                            continue;
                        }
                        let n = sent.decides;
                        pool.metrics.gauge(Gauge::InFlight, -(n as i64));
                        pool.metrics.round_trip(sent.written.elapsed().as_micros() as u64);
                        let reply = match call::split_batch(reply, n, conn.framer.ends()) {
                            Ok(replies) => {
                                let mut again = Vec::new();
                                for ((seq, w, cmd), reply) in conn.in_flight.drain(..n).zip(replies)
                                {
                                    let Some(w) = w else { continue };
                                    if let Some(e) = reply.error().filter(|_| sent.mixed) {
                                        if let Some(why) = batch::not_local(e) {
                                            pool.not_local(why);
                                            again.push(Queued::alone(seq, w, cmd));
                                            continue;
                                        }
                                    }
                                    complete(w, Ok(reply));
                                }
                                conn.requeue(again);
                                continue;
                            }
                            Err(reply) => reply,
                        };
                        if n > 1 && reply.error().is_some_and(|e| batch::redo_alone(e, sent.mixed))
                        {
                            // Refused or redirected before it ran, for the keys of one of its
                            // decisions (`NOPERM`; in a node's batch, the declared ones):
                            // nothing was applied. Each goes again in a call of its own, so that
                            // only the one at fault gets the refusal or follows the redirection.
                            let again = conn
                                .in_flight
                                .drain(..n)
                                .filter_map(|(seq, w, cmd)| Some(Queued::alone(seq, w?, cmd)))
                                .collect();
                            conn.requeue(again);
                            continue;
                        }
                        // Concerns the whole call (`NOSCRIPT`): every decision of it.
                        for (_, w, _) in conn.in_flight.drain(..n) {
                            if let Some(w) = w {
                                complete(w, Ok(reply));
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(e) => return Conn::close(this, RedisError::Protocol(e), true),
                }
            }
            conn.inbuf = inbuf;
            conn.inbuf.drain(..pos);
            if eof || drained {
                break eof;
            }
        };
        if conn.inbuf.is_empty() && conn.inbuf.capacity() > KEEP_CAPACITY {
            conn.inbuf.shrink_to(READ_CHUNK);
        }
        if eof {
            // Redis closing an idle connection (its `timeout`, a restart) is no outage.
            let busy = !conn.sent.is_empty() || !conn.queued.is_empty();
            if !busy {
                // Still news for a Sentinel group: Sentinel cuts the clients of a node it
                // reconfigures, and a primary killed and restarted meanwhile is stale.
                pool.closed_idle();
            }
            return Conn::close(this, RedisError::Closed, busy);
        }
        if replace {
            // Already counted as a failure; what is still pending follows the fail policy.
            return Conn::close(this, RedisError::Closed, false);
        }
        let rev = (*c).read;
        if conn.sent.is_empty() && conn.queued.is_empty() {
            if ngx_exiting != 0 {
                return Conn::close(this, RedisError::Closed, false);
            }
            // A tracker's connection stays, to hear of changes; `keepalive_timeout=0`, as
            // nginx's: no keepalive, a decision connection is closed as soon as idle. A private
            // one has done its one job.
            let keepalive = pool.conf().keepalive_timeout;
            if (keepalive == 0 && conn.dedicated.is_none()) || conn.private {
                return Conn::close(this, RedisError::Closed, false);
            }
            // Idle: graceful shutdown may close it (`c->close`), the keepalive too. The reply
            // deadline still armed stays when it comes first: firing, it finds the connection
            // idle and sets the keepalive's rest (`on_read`), or finds it busy again and is
            // the new call's deadline already, within nginx's 300 ms.
            (*c).set_idle(1);
            conn.idle_since = ngx_current_msec;
            let left = (*rev).timer.key.wrapping_sub(ngx_current_msec) as ngx_msec_int_t;
            let set = (*rev).timer_set() != 0;
            if set && (conn.dedicated.is_some() || left > keepalive as ngx_msec_int_t) {
                // A later timer is taken off, not moved: nginx would not move it by < 300 ms.
                ngx_del_timer(rev);
            }
            if conn.dedicated.is_none() && (*rev).timer_set() == 0 {
                ngx_add_timer(rev, keepalive);
            }
        } else {
            conn.arm_reply_deadline();
            if !conn.queued.is_empty() {
                // Replies made room on the wire.
                ngx_post_event(&mut conn.flush_ev, ptr::addr_of_mut!(ngx_posted_events));
            }
        }
        if ngx_handle_read_event(rev, 0) != NGX_OK as isize {
            Conn::close(this, RedisError::Io, true);
        }
    }
}

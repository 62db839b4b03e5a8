//! A connection's writing side: queued decisions put into script calls, as many per call as
//! may share one, and the output written as far as the socket takes it; the deadline of the
//! oldest command written.

use core::ptr::NonNull;
use std::time::Instant;

use ngx::ffi::{
    ngx_add_timer, ngx_current_msec, ngx_del_timer, ngx_handle_write_event, ngx_msec_int_t,
    ngx_msec_t, NGX_AGAIN, NGX_OK,
};

use super::{Conn, Sent, KEEP_CAPACITY, MAX_IN_FLIGHT, OUT_HIGH, READ_CHUNK};
use crate::codec::call::{self, MAX_BATCH_BYTES, MAX_BATCH_DECISIONS};
use crate::codec::resp;
use crate::metrics::{Counter, Gauge};
use crate::redis::batch;
use crate::redis::pool::{Payload, RedisError};

impl Conn {
    /// Moves queued commands into the output buffer while there is room on the wire, in order:
    /// decisions as script calls of up to `MAX_BATCH_DECISIONS` decisions and
    /// `MAX_BATCH_BYTES` each, all of one Cluster slot; a raw command, or a decision after
    /// `ASK`, alone. A batch only ever holds what was queued already: nothing waits for more.
    pub(super) fn fill(&mut self) {
        // Nothing to write: the clock is not read (a flush asks once more after its last write).
        if self.setting_up > 0 || self.queued.is_empty() {
            return;
        }
        // SAFETY: a worker's cached clock, read on its only thread.
        let now = unsafe { ngx_current_msec };
        let written = Instant::now();
        // SAFETY: the pool outlives its connections.
        let (metrics, per_node, script) =
            unsafe { ((*self.pool).metrics, (*self.pool).per_node(), (*self.pool).conf().script) };
        while self.in_flight.len() < MAX_IN_FLIGHT && self.out.len() < OUT_HIGH {
            let Some(head) = self.queued.front().map(|q| q.cmd) else { break };
            if let Payload::Raw(bytes) = head.payload {
                // SAFETY: a queued command is pending, and its owner keeps its bytes meanwhile.
                self.out.extend_from_slice(unsafe { bytes.as_ref() });
                self.sent.push_back(Sent::new(now, 1, written, head.max_reply));
                metrics.gauge(Gauge::InFlight, 1);
                let q = self.queued.pop_front().expect("head");
                self.in_flight.push_back((q.seq, Some(q.waiter), q.cmd));
                continue;
            }
            let room = MAX_IN_FLIGHT - self.in_flight.len();
            let most = if head.asking || head.alone { 1 } else { room.min(MAX_BATCH_DECISIONS) };
            let (mut n, mut bytes, mut reload, mut mixed) = (0, 0, false, false);
            for q in self.queued.iter().take(most) {
                let Payload::Decision(args) = q.cmd.payload else { break };
                if n > 0 && !batch::joins(head.shape(), q.cmd.shape(), per_node) {
                    break;
                }
                // SAFETY: a queued decision is pending (a cancelled one left the queue), so
                // its request and the arguments in its pool are alive.
                bytes += unsafe { args.as_ref() }.wire_len();
                if n > 0 && bytes > MAX_BATCH_BYTES {
                    break;
                }
                n += 1;
                reload |= q.cmd.reload;
                mixed |= q.cmd.slot != head.slot;
            }
            if reload {
                // Once for the whole batch; Redis runs it before the call that needs it.
                call::write_script_load(&mut self.out, script);
                self.sent.push_back(Sent::new(now, 0, written, resp::MAX_REPLY_LEN));
                metrics.count(Counter::ScriptLoads);
            }
            if head.asking {
                // Lets the importing node serve the next command only; its `+OK` is dropped.
                self.out.extend_from_slice(b"*1\r\n$6\r\nASKING\r\n");
                self.sent.push_back(Sent::new(now, 0, written, resp::MAX_REPLY_LEN));
            }
            // The first n queued, all decisions: the loop above stopped at anything else.
            let batch = self.queued.iter().take(n).filter_map(|q| match q.cmd.payload {
                // SAFETY: as above.
                Payload::Decision(args) => Some(unsafe { args.as_ref() }),
                Payload::Raw(_) => None,
            });
            call::write_batch(&mut self.out, script, batch, mixed);
            let sent = Sent::new(now, n, written, resp::MAX_REPLY_LEN);
            self.sent.push_back(Sent { mixed, ..sent });
            metrics.gauge(Gauge::InFlight, n as i64);
            for q in self.queued.drain(..n) {
                self.in_flight.push_back((q.seq, Some(q.waiter), q.cmd));
            }
        }
    }

    /// Writes queued decisions and as much of the output as the socket takes.
    pub(super) unsafe fn flush(this: NonNull<Conn>) {
        let conn = &mut *this.as_ptr();
        if !conn.connected {
            // on_write flushes once the connect is done.
            return;
        }
        let c = conn.c();
        loop {
            if conn.out_pos == conn.out.len() {
                conn.out.clear();
                conn.out_pos = 0;
                if conn.out.capacity() > KEEP_CAPACITY {
                    conn.out.shrink_to(READ_CHUNK);
                }
                conn.fill();
                if conn.out.is_empty() {
                    break;
                }
            }
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
        if conn.out.is_empty() {
            if (*wev).timer_set() != 0 {
                ngx_del_timer(wev);
            }
        } else if (*wev).timer_set() == 0 {
            // From the moment the socket stopped taking bytes, not re-armed by later flushes:
            // a Redis that reads too slowly must not keep the deadline sliding.
            ngx_add_timer(wev, (*conn.pool).conf().timeout);
        }
        conn.arm_reply_deadline();
        if ngx_handle_write_event(wev, 0) != NGX_OK as isize {
            Conn::close(this, RedisError::Io, true);
        }
    }

    /// The read timer: the oldest unanswered command's deadline.
    pub(super) unsafe fn arm_reply_deadline(&mut self) {
        let Some(oldest) = self.sent.front() else { return };
        let due = oldest.at.wrapping_add((*self.pool).conf().timeout);
        let left = due.wrapping_sub(ngx_current_msec) as ngx_msec_int_t;
        ngx_add_timer((*self.c()).read, left.max(1) as ngx_msec_t);
    }

    /// Whether the oldest unanswered command is past its deadline (the read timer may fire a
    /// little early: nginx keeps an armed timer that is within 300 ms of a new one).
    pub(super) unsafe fn overdue(&self) -> bool {
        self.sent
            .front()
            .is_some_and(|s| ngx_current_msec.wrapping_sub(s.at) >= (*self.pool).conf().timeout)
    }
}

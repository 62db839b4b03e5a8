//! Redis client-side caching for the deny cache, per node and worker: a rejection is remembered
//! only once Redis tracks its key for this worker, so that any change to the key (an operator's
//! `DEL` or reset, `FLUSHALL`, a new balance, expiry) makes every worker of every gateway forget
//! it within a round trip, instead of when its `Retry-After` runs out.
//!
//! Two connections of their own, never used for decisions: a subscriber (`CLIENT ID`, then
//! `SUBSCRIBE __redis__:invalidate`) and a tracking connection (`CLIENT TRACKING on REDIRECT
//! <id>`), on which each remembered key is read once (`EXISTS`). Losing either loses the
//! tracking, so everything remembered is forgotten and both start again when next needed: at
//! once, or, asked within a second of the last start, when that second is over.

use core::ffi::c_void;
use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_add_timer, ngx_current_msec, ngx_cycle, ngx_del_timer, ngx_delete_posted_event,
    ngx_event_t, ngx_msec_t, ngx_post_event, ngx_posted_events, NGX_LOG_ERR,
};
use ngx::ngx_log_error;

use super::breaker;
use super::conn::Conn;
use super::invalidation::{self, event, Event, CHANNEL};
use super::node::NodePool;
use super::pool::log;
use crate::codec::byte_queue::ByteQueue;
use crate::codec::resp::{self, View};

/// A tracker that lost a connection starts again at most this often.
const RESTART_EVERY: u64 = 1000;
/// A tracker that Redis refused (an ACL, a managed service) asks again at most this often.
const RETRY_REFUSED: u64 = 30_000;
/// `EXISTS` awaiting their reply, at most: past this, rejections are remembered briefly only.
const MAX_PENDING: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    /// `CLIENT ID` sent on the subscriber.
    Identifying,
    /// `SUBSCRIBE` sent.
    Subscribing,
    /// `CLIENT TRACKING on REDIRECT` sent on the tracking connection.
    Enabling,
    Ready,
}

pub struct Tracker {
    node: NonNull<NodePool>,
    state: State,
    sub: Option<NonNull<Conn>>,
    trk: Option<NonNull<Conn>>,
    /// The keys of the `EXISTS` on the wire, in order: one that is gone already changed before
    /// its tracking began.
    pending: ByteQueue<()>,
    /// Replies of the two connections, as they came (tagged true: the subscriber's), handled
    /// from `ev` (never inside a connection's read).
    inbox: ByteQueue<bool>,
    /// A connection closed: handled from `ev` too.
    lost: bool,
    ev: ngx_event_t,
    started: Option<u64>,
    /// How long after `started` it may start again.
    restart_after: u64,
    /// The subscriber's `CLIENT ID`.
    id: i64,
    /// Redis refused tracking (an ACL, a managed service): said once.
    refused_logged: bool,
}

impl Tracker {
    /// # Safety
    /// `node` outlives the tracker ([`Tracker::destroy`] runs first).
    pub unsafe fn create(node: NonNull<NodePool>) -> Box<Tracker> {
        let mut t = Box::new(Tracker {
            node,
            state: State::Idle,
            sub: None,
            trk: None,
            pending: ByteQueue::default(),
            inbox: ByteQueue::default(),
            lost: false,
            ev: core::mem::zeroed(),
            started: None,
            restart_after: RESTART_EVERY,
            id: 0,
            refused_logged: false,
        });
        let p: *mut Tracker = &mut *t;
        t.ev.handler = Some(on_event);
        t.ev.data = p as *mut c_void;
        t.ev.log = (*ngx_cycle).log;
        // A start put off (`start`) is not worth keeping a quitting worker alive for.
        t.ev.set_cancelable(1);
        t
    }

    /// Asks Redis to tell this worker when the key made of `key`'s parts changes. False while
    /// that cannot be had (the tracker connecting, refused, too much pending): then a change
    /// could go unheard.
    pub fn track(&mut self, key: &[&[u8]]) -> bool {
        match self.state {
            State::Ready if self.pending.len() < MAX_PENDING => {
                let Some(trk) = self.trk else { return false };
                let exists = |out: &mut Vec<u8>| {
                    resp::put_array_len(out, 2);
                    resp::put_bulk(out, b"EXISTS");
                    resp::put_bulk_parts(out, key);
                };
                // SAFETY: a connection in `trk` is alive: its closing clears the field first.
                unsafe { Conn::send(trk, exists) };
                self.pending.push(key, ());
                true
            }
            State::Idle => {
                self.start();
                false
            }
            _ => false,
        }
    }

    fn start(&mut self) {
        // SAFETY: the worker's clock.
        let now = unsafe { ngx_current_msec } as u64;
        if let Some(t) = self.started.filter(|&t| now.wrapping_sub(t) < self.restart_after) {
            // Asked for meanwhile: started when the wait is over, not at the next ask after it.
            // Until then what is remembered lives briefly only, and a quiet key may not ask again.
            if self.ev.timer_set() == 0 {
                let left = self.restart_after - now.wrapping_sub(t);
                // SAFETY: the event is this pinned tracker's; `destroy` removes its timer.
                unsafe { ngx_add_timer(&mut self.ev, left as ngx_msec_t) };
            }
            return;
        }
        self.started = Some(now);
        self.restart_after = RESTART_EVERY;
        let me = NonNull::from(&mut *self);
        match Conn::dedicated(self.node.as_ptr(), me, true) {
            Ok(sub) => {
                self.sub = Some(sub);
                // SAFETY: just made.
                unsafe { Conn::send(sub, |out| resp::put_command(out, &[b"CLIENT", b"ID"])) };
                self.state = State::Identifying;
            }
            // The node's own decisions report connect failures.
            Err(_) => self.state = State::Idle,
        }
    }

    /// A reply on one of the two connections (`sub`: the subscriber's), from its read: its
    /// bytes kept for the event, which may write to and close connections.
    pub(super) fn replied(&mut self, sub: bool, reply: View<'_>) {
        self.inbox.push(&[reply.bytes()], sub);
        self.post();
    }

    /// One of the two connections is closing (freed right after).
    pub(super) fn closed(&mut self, conn: NonNull<Conn>) {
        if self.sub == Some(conn) {
            self.sub = None;
        }
        if self.trk == Some(conn) {
            self.trk = None;
        }
        self.lost = true;
        self.post();
    }

    fn post(&mut self) {
        if self.ev.posted() == 0 {
            // SAFETY: the event is this pinned tracker's; `destroy` removes it.
            unsafe { ngx_post_event(&mut self.ev, ptr::addr_of_mut!(ngx_posted_events)) };
        }
    }

    fn run(&mut self) {
        if self.ev.timedout() != 0 {
            self.ev.set_timedout(0);
            if self.state == State::Idle {
                self.start();
            }
        }
        let mut inbox = core::mem::take(&mut self.inbox);
        while let Some((reply, sub)) = inbox.pop_front() {
            if self.state == State::Idle {
                break;
            }
            self.handle(sub, View::of(reply));
        }
        self.inbox.recycle(inbox);
        if self.lost {
            self.stop();
        }
    }

    fn handle(&mut self, sub: bool, reply: View<'_>) {
        match (self.state, sub, event(reply)) {
            // Redis restarted and loading its data: asked again like after a lost connection.
            (_, _, Event::Error(e)) if breaker::passing(e) => self.stop(),
            (_, _, Event::Error(e)) => self.refused(&String::from_utf8_lossy(e)),
            (State::Identifying, true, Event::Ok(id)) => {
                self.send(true, &[b"SUBSCRIBE", CHANNEL]);
                self.state = State::Subscribing;
                self.id = id;
            }
            (State::Subscribing, true, Event::Subscribed) => {
                let me = NonNull::from(&mut *self);
                match Conn::dedicated(self.node.as_ptr(), me, false) {
                    Ok(trk) => {
                        self.trk = Some(trk);
                        let id = self.id.to_string();
                        self.send(
                            false,
                            &[b"CLIENT", b"TRACKING", b"on", b"REDIRECT", id.as_bytes()],
                        );
                        self.state = State::Enabling;
                    }
                    Err(_) => self.stop(),
                }
            }
            (State::Enabling, false, Event::Ok(_)) => self.state = State::Ready,
            (State::Ready, false, Event::Ok(n)) => {
                // A key gone before its tracking began changed meanwhile (`DEL`, `FLUSHALL`).
                if let Some((key, ())) = self.pending.pop_front() {
                    if n == 0 {
                        invalidation::gone(key);
                    } else {
                        invalidation::present(key);
                    }
                }
            }
            (State::Ready | State::Enabling, true, Event::Keys(keys)) => {
                keys.for_each(invalidation::forget);
            }
            (State::Ready | State::Enabling, true, Event::All) => invalidation::forget_all(),
            _ => self.refused("an unexpected reply"),
        }
    }

    fn send(&mut self, sub: bool, args: &[&[u8]]) {
        if let Some(c) = if sub { self.sub } else { self.trk } {
            // SAFETY: a connection held here is alive (see `track`).
            unsafe { Conn::send(c, |out| resp::put_command(out, args)) };
        }
    }

    /// Redis will not track for us: said once per worker and node, and tried again later.
    fn refused(&mut self, why: &str) {
        if !core::mem::replace(&mut self.refused_logged, true) {
            // SAFETY: the node outlives its tracker.
            let name = unsafe { self.node.as_ref().shown() };
            ngx_log_error!(
                NGX_LOG_ERR,
                log(),
                "ratelimit: redis {name} refused client tracking ({why}): rejections are \
                 remembered by the deny cache for 100ms at most (see docs/redis-acl.md)"
            );
        }
        self.stop();
        self.restart_after = RETRY_REFUSED;
    }

    /// Both connections go, and with them what they tracked.
    fn stop(&mut self) {
        for c in [self.sub.take(), self.trk.take()].into_iter().flatten() {
            // SAFETY: alive; detached first, so that its closing does not call back here.
            unsafe { Conn::close_dedicated(c) };
        }
        if self.state == State::Ready || self.lost {
            invalidation::unheard();
        }
        self.pending.clear();
        self.inbox.clear();
        self.lost = false;
        self.state = State::Idle;
    }

    /// # Safety
    /// `t` is not used afterwards; called by its node's `destroy`.
    pub unsafe fn destroy(mut t: Box<Tracker>) {
        t.stop();
        if t.ev.posted() != 0 {
            ngx_delete_posted_event(&mut t.ev);
        }
        if t.ev.timer_set() != 0 {
            ngx_del_timer(&mut t.ev);
        }
    }
}

unsafe extern "C" fn on_event(ev: *mut ngx_event_t) {
    // SAFETY: the event's data is its tracker, which removes the event before it goes.
    (*((*ev).data as *mut Tracker)).run();
}

//! A command the worker sends on its own behalf, not for a request: a probe of a failed node,
//! a Cluster topology query, a sentinel question. It is a waiter like a request's, owned by the
//! pool instead, with its own deadline, and it reports once to its owner's callback.

use core::ffi::c_void;
use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_add_timer, ngx_cycle, ngx_del_timer, ngx_delete_posted_event, ngx_event_t, ngx_msec_t,
};

use super::node::NodePool;
use super::pool::{Command, Payload, RedisError, Waiter, WorkerPool};
use crate::codec::resp::Reply;

/// Called once with the query's outcome; the query is already freed.
pub type Done = unsafe fn(owner: *mut c_void, result: Result<Reply, RedisError>);

pub struct Query {
    waiter: Waiter,
    ev: ngx_event_t,
    bytes: Box<[u8]>,
    owner: *mut c_void,
    done: Done,
}

impl Query {
    /// Sends `bytes` (one RESP command) to `node`, on a fresh connection when `fresh` (a probe
    /// must not ride on a connection that may be stuck), and reports its reply (of at most
    /// `max_reply` bytes), or `Timeout` after `timeout`, to `done(owner, ..)`. An immediate refusal is returned instead, and
    /// `done` is then never called.
    ///
    /// # Safety
    /// `node` is a live pool of this worker; `owner` stays valid until `done` runs or the query
    /// is cancelled.
    pub unsafe fn start(
        node: NonNull<NodePool>,
        bytes: Box<[u8]>,
        fresh: bool,
        max_reply: usize,
        timeout: ngx_msec_t,
        owner: *mut c_void,
        done: Done,
    ) -> Result<NonNull<Query>, RedisError> {
        let q = Box::new(Query {
            waiter: Waiter::new(ptr::null_mut()),
            ev: core::mem::zeroed(),
            bytes,
            owner,
            done,
        });
        let q = Box::into_raw(q);
        (*q).waiter.ev = ptr::addr_of_mut!((*q).ev);
        (*q).ev.handler = Some(on_event);
        (*q).ev.data = q as *mut c_void;
        (*q).ev.log = (*ngx_cycle).log;
        let cmd = Command {
            payload: Payload::Raw(NonNull::from(&*(*q).bytes)),
            reload: false,
            asking: false,
            alone: false,
            max_reply,
            slot: None,
        };
        let waiter = NonNull::new_unchecked(ptr::addr_of_mut!((*q).waiter));
        let node = &mut *node.as_ptr();
        let sent = if fresh { node.submit_fresh(waiter, cmd) } else { node.submit(waiter, cmd) };
        match sent {
            Ok(token) => {
                (*q).waiter.token = Some(token);
                ngx_add_timer(ptr::addr_of_mut!((*q).ev), timeout);
                Ok(NonNull::new_unchecked(q))
            }
            Err(e) => {
                drop(Box::from_raw(q));
                Err(e)
            }
        }
    }

    /// Drops a query whose outcome is no longer wanted; `done` is not called.
    ///
    /// # Safety
    /// `q` came from `start` and its `done` has not run.
    pub unsafe fn cancel(q: NonNull<Query>) {
        let q = Box::from_raw(q.as_ptr());
        Query::detach(&q);
    }

    unsafe fn detach(q: &Query) {
        if let Some(token) = q.waiter.token {
            WorkerPool::cancel(token);
        }
        let ev = ptr::addr_of!(q.ev) as *mut ngx_event_t;
        if q.ev.timer_set() != 0 {
            ngx_del_timer(ev);
        }
        if q.ev.posted() != 0 {
            ngx_delete_posted_event(ev);
        }
    }
}

/// The reply (posted by the pool) or the deadline.
unsafe extern "C" fn on_event(ev: *mut ngx_event_t) {
    let mut q = Box::from_raw((*ev).data as *mut Query);
    let result = match q.waiter.result.take() {
        Some(result) => result.and_then(|r| r.view().to_reply().map_err(RedisError::Protocol)),
        None => {
            // Deadline: the query's node counts it like a request's.
            if let Some(token) = q.waiter.token {
                WorkerPool::timed_out(token);
            }
            Err(RedisError::Timeout)
        }
    };
    q.waiter.token = None;
    Query::detach(&q);
    let (owner, done) = (q.owner, q.done);
    drop(q);
    done(owner, result);
}

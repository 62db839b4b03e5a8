//! A request's own helpers, shared by the access handler and `ratelimit_admin`: the gateway's
//! wall clock, copies in the request's pool, a zone's Redis key for a key
//! value, and a waiter tied to the request's event, which completion and deadline both post.

use core::ffi::c_void;
use core::ops::{Deref, DerefMut};
use core::ptr::{self, NonNull};

use ngx::ffi::{
    ngx_del_timer, ngx_delete_posted_event, ngx_event_t, ngx_http_request_t, ngx_pnalloc,
    ngx_timeofday,
};

use crate::decide::key::{shorten, Key};
use crate::glue::conf::Zone;
use crate::redis::conf::RedisConf;
use crate::redis::pool::{Waiter, WorkerPool};

/// The Redis key of `zone` for the key value a request evaluated (cluster-escaped already), as
/// the request path and `ratelimit_admin` both build it; a value too long is shortened into the
/// request's pool.
pub unsafe fn zone_key(
    r: *mut ngx_http_request_t,
    redis: &RedisConf,
    zone: &Zone,
    value: &'static [u8],
) -> Option<Key<'static>> {
    let value = match shorten(value, &zone.key_text, redis.cluster) {
        Some(short) => pool_copy(r, &short)?,
        None => value,
    };
    Some(if zone.exact_key {
        Key::exact(value)
    } else {
        // SAFETY: the prefix and the zone name live in the configuration, which outlives the
        // request.
        Key::new(
            &*ptr::from_ref(redis.prefix.as_slice()),
            &*ptr::from_ref(zone.name.as_bytes()),
            value,
        )
    })
}

/// `bytes` copied into the request's pool, which outlives everything that keeps them.
pub unsafe fn pool_copy(r: *mut ngx_http_request_t, bytes: &[u8]) -> Option<&'static [u8]> {
    let p = ngx_pnalloc((*r).pool, bytes.len().max(1)) as *mut u8;
    if p.is_null() {
        return None;
    }
    ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
    Some(core::slice::from_raw_parts(p, bytes.len()))
}

/// The gateway's clock: `clock=nginx`'s now, and the time whose calendar period a quota's
/// headers describe.
pub unsafe fn wall_ms() -> u64 {
    let tp = ngx_timeofday();
    tp.sec as u64 * 1000 + tp.msec as u64
}

/// Makes `ev` the event that a completion of `waiter` posts, and that the deadline timer of
/// request `r`'s decision fires, both running `handler`; its replies are kept in `r`'s pool.
pub unsafe fn attach(
    waiter: &mut Waiter,
    ev: &mut ngx_event_t,
    handler: unsafe extern "C" fn(*mut ngx_event_t),
    r: *mut ngx_http_request_t,
) {
    waiter.ev = ev;
    waiter.pool = (*r).pool;
    ev.handler = Some(handler);
    // Timer code logs `ev->data` as a connection; the context is found with container_of.
    ev.data = (*r).connection as *mut c_void;
    ev.log = (*(*r).connection).log;
}

/// Leaves the pool and the event loop: nothing will complete or wake this waiter any more.
pub unsafe fn detach(waiter: &mut Waiter, ev: &mut ngx_event_t) {
    if let Some(token) = waiter.token.take() {
        WorkerPool::cancel(token);
    }
    if ev.timer_set() != 0 {
        ngx_del_timer(ev);
    }
    if ev.posted() != 0 {
        ngx_delete_posted_event(ev);
    }
}

/// A list of at most a fixed number of `T` in the request's pool, which frees it with the
/// request: per-request lists (the request's zones, its parts on other backends) cost no heap
/// allocation. Its items are dropped in place with it; their room goes with the pool. Items
/// never move: a part's event and waiter are registered by address.
pub struct PoolVec<T> {
    ptr: NonNull<T>,
    len: usize,
    cap: usize,
}

impl<T> Default for PoolVec<T> {
    fn default() -> Self {
        PoolVec { ptr: NonNull::dangling(), len: 0, cap: 0 }
    }
}

impl<T> Drop for PoolVec<T> {
    fn drop(&mut self) {
        // SAFETY: the first `len` items are written and dropped once, here; not the room.
        unsafe { ptr::drop_in_place(&mut **self) };
    }
}

impl<T> PoolVec<T> {
    /// An empty list of at most `cap` items, kept at `room`.
    ///
    /// # Safety
    /// `room` has space for `cap` items, aligned for `T`, for as long as the list is used.
    pub unsafe fn in_room(room: NonNull<T>, cap: usize) -> Self {
        PoolVec { ptr: room, len: 0, cap }
    }

    /// Adds `item`; false when the list is full.
    pub fn push(&mut self, item: T) -> bool {
        if self.len == self.cap {
            return false;
        }
        // SAFETY: within the capacity allocated, and aligned.
        unsafe { self.ptr.as_ptr().add(self.len).write(item) };
        self.len += 1;
        true
    }
}

impl<T> Deref for PoolVec<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: the first `len` items are written; a dangling pointer is valid for 0 items.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> DerefMut for PoolVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as `deref`, and the list is borrowed mutably.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

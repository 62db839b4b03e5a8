//! What Redis says about keys that changed, for the deny cache: the messages of its client-side
//! caching (`CLIENT TRACKING`, RESP2: a `SUBSCRIBE __redis__:invalidate` connection), read into
//! events (pure), and the worker's list of keys to forget until the next request looks.
//!
//! The tracker (`super::tracker`) fills the list from its connection's events; the access
//! handler drains it into the deny cache before it trusts a remembered rejection. Nothing is
//! called back into the handler from a connection.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::codec::byte_queue::ByteQueue;
use crate::codec::resp::{Head, Items, View};

/// The channel Redis sends invalidations on, for a client whose tracking is redirected to a
/// subscriber (RESP2).
pub const CHANNEL: &[u8] = b"__redis__:invalidate";

/// A reply on the subscriber connection, or on the tracking connection, read where its bytes
/// lie.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// `SUBSCRIBE` confirmed.
    Subscribed,
    /// These keys changed (written, deleted, expired, evicted).
    Keys(Keys<'a>),
    /// Everything changed (`FLUSHALL`, `FLUSHDB`): Redis sends no key list.
    All,
    /// `+OK` (`CLIENT TRACKING`), or an integer: the subscriber's `CLIENT ID`, an `EXISTS` count.
    Ok(i64),
    Error(&'a [u8]),
    /// Anything else: not what a tracking connection is answered with.
    Strange,
}

/// The keys of an invalidation, each a bulk string (checked before it is handed out).
#[derive(Debug, Clone)]
pub struct Keys<'a>(Items<'a>);

impl<'a> Iterator for Keys<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        match self.0.next_head()? {
            Head::Bulk(Some(key)) => Some(key),
            _ => None,
        }
    }
}

impl PartialEq for Keys<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.clone().eq(other.clone())
    }
}

impl Eq for Keys<'_> {}

pub fn event(reply: View<'_>) -> Event<'_> {
    let mut items = match reply.head() {
        Some(Head::Int(n)) => return Event::Ok(n),
        Some(Head::Status(_)) => return Event::Ok(0),
        Some(Head::Error(e)) => return Event::Error(e),
        _ => match reply.items() {
            Some(items) if items.len() == 3 => items,
            _ => return Event::Strange,
        },
    };
    fn bulk(item: Option<View<'_>>) -> Option<&[u8]> {
        match item.and_then(View::head) {
            Some(Head::Bulk(Some(b))) => Some(b),
            _ => None,
        }
    }
    let (kind, ch, payload) = (bulk(items.next()), bulk(items.next()), items.next());
    if ch != Some(CHANNEL) {
        return Event::Strange;
    }
    match (kind, payload) {
        (Some(b"subscribe"), Some(p)) if matches!(p.head(), Some(Head::Int(_))) => {
            Event::Subscribed
        }
        (Some(b"message"), Some(p)) => match p.head() {
            Some(Head::Array(Some(n))) => match p.items() {
                // Every key a bulk string, or none is taken.
                Some(keys) if Keys(keys.clone()).count() == n => Event::Keys(Keys(keys)),
                _ => Event::Strange,
            },
            Some(Head::Bulk(None) | Head::Array(None)) => Event::All,
            _ => Event::Strange,
        },
        _ => Event::Strange,
    }
}

/// What the next request must forget before it trusts the deny cache.
#[derive(Default)]
struct Pending {
    all: bool,
    /// The tracking was lost: from then on a change could go unheard.
    unheard: bool,
    /// Each key, and what Redis said of it.
    keys: ByteQueue<Said>,
}

/// Keys waiting to be forgotten, at most; past this, everything is.
const MAX_PENDING: usize = 10_000;

thread_local! {
    // A worker is one thread; the list lives as long as it.
    static PENDING: RefCell<Pending> = RefCell::default();
}

/// Something is in `PENDING`: what every request reads, in a plain static, because in a shared
/// object each access to a thread-local is a call (`__tls_get_addr`). The worker is one thread,
/// so it says exactly what its list holds.
static ANY: AtomicBool = AtomicBool::new(false);

/// One of what [`drain`] hands over.
pub enum Forget<'a> {
    /// Anything may have changed (`FLUSHALL`, or more changes than could be listed).
    All,
    /// The tracking was lost: until it is back, a change goes unheard (nothing is known to have
    /// changed).
    Unheard,
    /// Written: remembered rejections go; reservations stand, since every reservation by
    /// another worker writes the key too, and are checked again.
    Key(&'a [u8]),
    /// Not there any more (reset, expired, flushed): reservations of it go as well.
    Gone(&'a [u8]),
    /// Still there when checked after a change: reservations of it may be spent again.
    Present(&'a [u8]),
}

#[derive(Clone, Copy)]
enum Said {
    Changed,
    Gone,
    Present,
}

/// Every remembered rejection must go: Redis flushed.
pub fn forget_all() {
    PENDING.with(|p| {
        let mut p = p.borrow_mut();
        p.all = true;
        p.keys.clear();
    });
    ANY.store(true, Relaxed);
}

/// Every remembered rejection must go: its tracking was lost.
pub fn unheard() {
    PENDING.with(|p| p.borrow_mut().unheard = true);
    ANY.store(true, Relaxed);
}

/// The rejections remembered for `key` must go: Redis says it changed.
pub fn forget(key: &[u8]) {
    push(key, Said::Changed);
}

/// `key` is not in Redis any more.
pub fn gone(key: &[u8]) {
    push(key, Said::Gone);
}

/// `key` is still in Redis (its tracking is renewed).
pub fn present(key: &[u8]) {
    push(key, Said::Present);
}

fn push(key: &[u8], said: Said) {
    PENDING.with(|p| {
        let mut p = p.borrow_mut();
        if p.all {
            return;
        }
        if p.keys.len() >= MAX_PENDING {
            p.all = true;
            p.keys.clear();
        } else {
            p.keys.push(&[key], said);
        }
    });
    ANY.store(true, Relaxed);
}

/// Whether anything waits for [`drain`]: checked on every request, which mostly finds nothing.
pub fn pending() -> bool {
    ANY.load(Relaxed)
}

/// Hands over what must be forgotten, once.
pub fn drain(mut f: impl FnMut(Forget<'_>)) {
    let (all, unheard, mut keys) = PENDING.with(|p| {
        let mut p = p.borrow_mut();
        let p = &mut *p;
        (core::mem::take(&mut p.all), core::mem::take(&mut p.unheard), core::mem::take(&mut p.keys))
    });
    ANY.store(false, Relaxed);
    if all {
        f(Forget::All);
    }
    if unheard {
        f(Forget::Unheard);
    }
    while let Some((k, said)) = keys.pop_front() {
        f(match said {
            Said::Changed => Forget::Key(k),
            Said::Gone => Forget::Gone(k),
            Said::Present => Forget::Present(k),
        });
    }
    PENDING.with(|p| p.borrow_mut().keys.recycle(keys));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(bytes: &[u8]) -> View<'_> {
        View::of(bytes)
    }

    fn keys(e: Event<'_>) -> Option<Vec<&[u8]>> {
        match e {
            Event::Keys(k) => Some(k.collect()),
            _ => None,
        }
    }

    #[test]
    fn redis_messages() {
        // As Redis 7.0.15 sent them (RESP2, tracking redirected to a subscriber).
        assert_eq!(event(ev(b":3\r\n")), Event::Ok(3));
        let sub = ev(b"*3\r\n$9\r\nsubscribe\r\n$20\r\n__redis__:invalidate\r\n:1\r\n");
        assert_eq!(event(sub), Event::Subscribed);
        let one = ev(b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n*1\r\n$2\r\nk1\r\n");
        assert_eq!(keys(event(one)), Some(vec![&b"k1"[..]]));
        let two = ev(
            b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n*2\r\n$2\r\nk1\r\n$0\r\n\r\n",
        );
        assert_eq!(keys(event(two)), Some(vec![&b"k1"[..], b""]));
        let all = ev(b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n$-1\r\n");
        assert_eq!(event(all), Event::All);
        assert_eq!(event(ev(b"+OK\r\n")), Event::Ok(0));
        assert_eq!(event(ev(b"-NOPERM no\r\n")), Event::Error(b"NOPERM no"));
        let other = ev(b"*3\r\n$7\r\nmessage\r\n$5\r\nother\r\n*1\r\n$2\r\nk1\r\n");
        assert_eq!(event(other), Event::Strange);
        let bad = ev(b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n*1\r\n:1\r\n");
        assert_eq!(event(bad), Event::Strange);
    }

    #[test]
    fn pending_keys_are_handed_over_once() {
        let seen = || {
            let mut out = Vec::new();
            drain(|f| {
                out.push(match f {
                    Forget::All => "*".to_string(),
                    Forget::Unheard => "?".to_string(),
                    Forget::Key(k) => String::from_utf8_lossy(k).into_owned(),
                    Forget::Gone(k) => format!("-{}", String::from_utf8_lossy(k)),
                    Forget::Present(k) => format!("+{}", String::from_utf8_lossy(k)),
                })
            });
            out
        };
        assert!(!pending());
        forget(b"a");
        gone(b"b");
        present(b"c");
        assert!(pending());
        assert_eq!(seen(), ["a", "-b", "+c"]);
        assert!(!pending());
        assert!(seen().is_empty());
        forget(b"a");
        forget_all();
        forget(b"c");
        assert_eq!(seen(), ["*"]);
        for i in 0..=MAX_PENDING {
            forget(format!("k{i}").as_bytes());
        }
        assert_eq!(seen(), ["*"]);
        // Lost tracking: nothing known to have changed, the keys heard before still listed.
        forget(b"a");
        unheard();
        assert!(pending());
        assert_eq!(seen(), ["?", "a"]);
        forget_all();
        assert!(pending());
        assert_eq!(seen(), ["*"]);
    }
}

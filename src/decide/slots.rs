//! Concurrency slots (`algorithm=concurrency`) this worker's requests hold: pure bookkeeping.
//! The handler notes a slot when Redis grants it and takes it back when its request ends (to
//! release it); the sweep asks which slots are due for renewal and reports what Redis said.
//!
//! A slot is a lease in Redis: its member is scored by the instant it lapses, the script's time
//! plus the slot's life. It is renewed every third of its life, counted on the worker's
//! monotonic clock from the moment its decision or last renewal was *sent* (never later than
//! Redis scored it), so a renewal is due at least two thirds of a life before the slot lapses:
//! one renewal may fail or time out and the next still lands in time.
//!
//! A decision Redis may run after its request stopped waiting for it (the client went away
//! while it was on the wire, its deadline passed, its connection was lost) can grant a slot no
//! one holds. Its members are kept as *orphans*: the sweep sends their release until Redis says
//! it removed the member, or for one slot life (a slot granted later than that lapses by itself
//! no later than a life after Redis ran the decision; until then it only takes room, never gives
//! too much). Each "not there" doubles the wait before the next release, from one tick: a late
//! decision most often runs within a tick or two or not at all, and a Redis that just came back
//! must not be asked thousands of times a second about members it has never seen.

use std::collections::HashMap;

use crate::decide::script::SlotRef;
use crate::decide::table_key::ByHash;

/// `lease_time`'s default for a concurrency zone: a slot of a worker that died (SIGKILL, OOM, a
/// machine gone) keeps its room taken at most this long, while a slot of a running request
/// costs Redis a renewal every 1.7 s, one decision of a batched script call.
pub const DEFAULT_SLOT_MS: u64 = 5000;

/// The shortest slot life: renewals are due every third of it and sent by a sweep that runs
/// every 100 ms, so that a renewal that times out still leaves room for the next one.
pub const MIN_SLOT_MS: u64 = 1000;

/// The most orphans a worker keeps; beyond, their slots (if Redis grants them) lapse.
const MAX_ORPHANS: usize = 10_000;

/// Keys' and members' buffers of released slots kept for the next ones, at most: a request
/// that takes a slot allocates nothing once the worker has seen as many at once.
const SPARE_BUFFERS: usize = 256;

/// An orphan's release after the first "not there" waits this long, then twice as long each
/// time (the sweep's tick).
const ORPHAN_FIRST_WAIT: u64 = 100;

/// The shortest slot life that leaves a renewal which takes the whole `timeout` (ms) and fails
/// time for the next one: due a third of a life after the last, sent at the next 100 ms tick,
/// answered or failed within `timeout`, the next one sent a tick later and answered within
/// `timeout` again: life / 3 + 2 × (100 + timeout) <= life.
pub fn min_life_for(timeout_ms: u64) -> u64 {
    MIN_SLOT_MS.max(3 * (timeout_ms + 100))
}

/// How long after a slot was scored its renewal is due.
pub fn renew_every(life_ms: u64) -> u64 {
    life_ms / 3
}

/// One slot held by a request of this worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub zone: usize,
    /// The whole Redis key.
    pub key: Vec<u8>,
    /// The request's member: its `$request_id`.
    pub member: Vec<u8>,
    pub limit: u64,
    pub life_ms: u64,
    /// Monotonic ms from which a renewal is due.
    due: u64,
    /// The monotonic ms a renewal on its way was sent: not sent again until it is answered.
    renewing: Option<u64>,
    /// Its request ended while a renewal was on its way: kept until that renewal answers, which
    /// may have written the member back after the release took it.
    ended: bool,
}

impl Held {
    pub fn slot_ref(&self) -> SlotRef<'_> {
        let key = [&self.key[..], &[], &[], &[]];
        SlotRef { key, limit: self.limit, life_ms: self.life_ms, member: &self.member }
    }
}

/// A member to release: that of a request that ended, or one a late decision may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Orphan {
    slot: Held,
    /// Monotonic ms after which it is no longer released: any slot it got has lapsed.
    until: u64,
    /// A release is on its way.
    sending: bool,
    /// The slot of a request that ended (counted taken): any answer of Redis ends its release,
    /// counted released; none within a life, and it lapsed in Redis, counted so. A late
    /// decision's member (counted nowhere) is released until Redis says it removed it.
    held: bool,
    /// Monotonic ms from which its release is due again, and the wait after the next "not
    /// there".
    due: u64,
    wait: u64,
}

/// What Redis answered a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    Kept,
    /// The member was gone (lapsed, or lost with Redis's data) and is written back.
    WrittenBack,
    Failed,
}

/// What Redis answered a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    Removed,
    NotThere,
    Failed,
}

/// The slots of this worker's requests, by an id the request keeps.
#[derive(Debug, Default)]
pub struct Slots {
    map: HashMap<u64, Held>,
    orphans: HashMap<u64, Orphan>,
    next: u64,
    /// `ratelimit_fail local`: this worker's requests in flight per (zone, key) as the local
    /// limiter finds it (`crate::decide::local_limit::LocalZone::hash`), admitted by it alone
    /// while Redis could not decide. An entry goes when its count is back at 0, so the table
    /// holds no more than the requests in flight.
    local: ByHash<u64>,
    /// Buffers of slots gone, written over by the next ones (`SPARE_BUFFERS` at most).
    spare: Vec<Vec<u8>>,
}

/// A slot gone: its buffers kept for the next ones.
fn recycle(spare: &mut Vec<Vec<u8>>, h: &mut Held) {
    for b in [&mut h.key, &mut h.member] {
        if spare.len() < SPARE_BUFFERS {
            spare.push(core::mem::take(b));
        }
    }
}

impl Slots {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty() && self.orphans.is_empty()
    }

    fn held(&mut self, zone: usize, slot: SlotRef<'_>, due: u64) -> Held {
        Held {
            zone,
            key: self.buffer(&slot.key),
            member: self.buffer(&[slot.member]),
            limit: slot.limit,
            life_ms: slot.life_ms,
            due,
            renewing: None,
            ended: false,
        }
    }

    /// `parts` joined, in a spare buffer when there is one.
    fn buffer(&mut self, parts: &[&[u8]]) -> Vec<u8> {
        let mut b = self.spare.pop().unwrap_or_default();
        b.clear();
        parts.iter().for_each(|p| b.extend_from_slice(p));
        b
    }

    /// Notes a slot Redis granted to a decision sent at `sent` (monotonic ms); returns its id.
    pub fn take(&mut self, zone: usize, slot: SlotRef<'_>, sent: u64) -> u64 {
        let held = self.held(zone, slot, sent + renew_every(slot.life_ms));
        self.next += 1;
        self.map.insert(self.next, held);
        self.next
    }

    /// Notes a member that a decision may still grant with no request to hold it, at `now`.
    /// False when the table of orphans is full (the slot, if granted, lapses).
    pub fn orphan(&mut self, zone: usize, slot: SlotRef<'_>, now: u64) -> bool {
        if self.orphans.len() >= MAX_ORPHANS {
            return false;
        }
        let held = self.held(zone, slot, now);
        self.add_orphan(held, now, false, false);
        true
    }

    fn add_orphan(&mut self, slot: Held, now: u64, held: bool, sending: bool) -> u64 {
        self.next += 1;
        let until = now + slot.life_ms;
        let orphan = Orphan { slot, until, sending, held, due: now, wait: ORPHAN_FIRST_WAIT };
        self.orphans.insert(self.next, orphan);
        self.next
    }

    /// The orphans whose release is due at `now` (all but those on their way), marked as sent
    /// and told to `each` with their zone; those past their time are forgotten, and the zones
    /// of the held ones among them (their slots lapsed in Redis) told to `lapsed`.
    pub fn orphans_due(
        &mut self,
        now: u64,
        mut lapsed: impl FnMut(usize),
        mut each: impl FnMut(u64, usize),
    ) {
        let spare = &mut self.spare;
        self.orphans.retain(|_, o| {
            let keep = o.sending || now < o.until;
            if !keep {
                if o.held {
                    lapsed(o.slot.zone);
                }
                recycle(spare, &mut o.slot);
            }
            keep
        });
        for (&id, o) in self.orphans.iter_mut().filter(|(_, o)| !o.sending && now >= o.due) {
            o.sending = true;
            each(id, o.slot.zone);
        }
    }

    /// `ratelimit_fail local`: this worker's requests in flight of the (zone, key) `hash`.
    pub fn local_in_flight(&self, hash: u64) -> u64 {
        self.local.get(&hash).copied().unwrap_or(0)
    }

    /// A request admitted locally holds one more of the (zone, key)'s slots on this worker.
    pub fn local_take(&mut self, hash: u64) {
        *self.local.entry(hash).or_insert(0) += 1;
    }

    /// That request ended.
    pub fn local_release(&mut self, hash: u64) {
        if let Some(n) = self.local.get_mut(&hash) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.local.remove(&hash);
            }
        }
    }

    /// Drops every orphan (a worker on its way out).
    pub fn forget_orphans(&mut self) {
        self.orphans.clear();
        self.spare = Vec::new();
    }

    pub fn orphan_slot(&self, id: u64) -> Option<&Held> {
        self.orphans.get(&id).map(|o| &o.slot)
    }

    /// What Redis said at `now` to an orphan's release: a failed one is sent again at the next
    /// sweep; a held slot's is done at any answer, and its zone returned (counted released); a
    /// late decision's, once Redis removed the member, asked again after a wait that doubles.
    pub fn orphan_answered(&mut self, id: u64, answer: Release, now: u64) -> Option<usize> {
        let o = self.orphans.get_mut(&id)?;
        let done = match answer {
            Release::Removed => true,
            Release::NotThere => o.held,
            Release::Failed => false,
        };
        if !done {
            o.sending = false;
            if answer == Release::NotThere {
                (o.due, o.wait) = (now + o.wait, 2 * o.wait);
            }
            return None;
        }
        let mut o = self.orphans.remove(&id)?;
        recycle(&mut self.spare, &mut o.slot);
        o.held.then_some(o.slot.zone)
    }

    /// The slot's request ended at `now`: its release is to be sent at once, as the orphan
    /// returned (sent already), retried by the sweep until Redis answers. `None` if it was
    /// released already (a request's cleanup runs twice).
    pub fn release(&mut self, id: u64, now: u64) -> Option<u64> {
        let h = self.map.get_mut(&id).filter(|h| !h.ended)?;
        let slot = if h.renewing.is_some() {
            h.ended = true;
            h.clone()
        } else {
            self.map.remove(&id)?
        };
        Some(self.add_orphan(slot, now, true, true))
    }

    /// Every slot due for renewal at `now`, marked as being renewed (sent at `now`) and told to
    /// `each` with its zone. All go in one sweep, so the pool writes them as one script call
    /// (up to 64 renewals a call).
    pub fn due(&mut self, now: u64, mut each: impl FnMut(u64, usize)) {
        for (&id, h) in self.map.iter_mut() {
            if !h.ended && h.renewing.is_none() && now >= h.due {
                h.renewing = Some(now);
                each(id, h.zone);
            }
        }
    }

    pub fn get(&self, id: u64) -> Option<&Held> {
        self.map.get(&id)
    }

    /// What Redis answered the renewal of `id`, at `now`; true when it found the slot gone (it
    /// lapsed, or Redis lost it) and wrote it back, to be counted lapsed. The next renewal is
    /// due a third of a life after this one was sent; a failed one is sent at the next sweep.
    /// A slot whose request ended meanwhile goes: if the renewal wrote it back after its
    /// release took it, it is released again.
    pub fn renewal_answered(&mut self, id: u64, answer: Renewal, now: u64) -> bool {
        let Some(h) = self.map.get_mut(&id) else { return false };
        if h.ended {
            let mut h = self.map.remove(&id).expect("present");
            if answer == Renewal::WrittenBack {
                self.add_orphan(h, now, false, false);
            } else {
                recycle(&mut self.spare, &mut h);
            }
            return false;
        }
        let sent = h.renewing.take();
        if answer == Renewal::Failed {
            return false;
        }
        if let Some(sent) = sent {
            h.due = sent + renew_every(h.life_ms);
        }
        answer == Renewal::WrittenBack
    }

    /// Whether a renewal or an orphan's release may still be due: the sweep keeps running
    /// while this holds.
    pub fn renewing_any(&self) -> bool {
        !self.orphans.is_empty() || !self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(s: &mut Slots, now: u64) -> Vec<u64> {
        let mut ids = Vec::new();
        s.due(now, |id, _| ids.push(id));
        ids
    }

    fn orphans_due(s: &mut Slots, now: u64, lapsed: &mut Vec<usize>) -> Vec<u64> {
        let mut ids = Vec::new();
        s.orphans_due(now, |zone| lapsed.push(zone), |id, _| ids.push(id));
        ids
    }

    fn slot(member: &[u8]) -> SlotRef<'_> {
        SlotRef { key: [b"rl:conc:a", b"", b"", b""], limit: 5, life_ms: 3000, member }
    }

    #[test]
    fn a_slot_keeps_its_key_whole_in_the_buffers_of_slots_gone() {
        let mut s = Slots::new();
        let parts =
            SlotRef { key: [b"rl:", b"conc", b":", b"a"], limit: 5, life_ms: 3000, member: b"m1" };
        let a = s.take(0, parts, 0);
        assert_eq!(
            s.get(a).map(|h| (&h.key[..], &h.member[..])),
            Some((&b"rl:conc:a"[..], &b"m1"[..]))
        );
        let r = s.release(a, 10).unwrap();
        assert_eq!(s.orphan_answered(r, Release::Removed, 20), Some(0));
        assert_eq!(s.spare.len(), 2, "its key's and its member's buffers kept");
        let b = s.take(1, slot(b"m2"), 30);
        assert!(s.spare.is_empty(), "and written over by the next slot");
        assert_eq!(
            s.get(b).map(|h| (&h.key[..], &h.member[..])),
            Some((&b"rl:conc:a"[..], &b"m2"[..]))
        );
    }

    #[test]
    fn a_slot_is_renewed_every_third_of_its_life_from_when_the_renewal_was_sent() {
        let mut s = Slots::new();
        let a = s.take(0, slot(b"a"), 1000);
        assert!(due(&mut s, 1999).is_empty(), "a third of 3 s after the decision was sent");
        assert_eq!(due(&mut s, 2000), vec![a]);
        assert!(due(&mut s, 2100).is_empty(), "not sent again while on its way");
        assert!(!s.renewal_answered(a, Renewal::Kept, 2100));
        assert!(due(&mut s, 2999).is_empty());
        assert_eq!(due(&mut s, 3000), vec![a], "due a third of a life after the renewal was sent");
        assert!(!s.renewal_answered(a, Renewal::Failed, 3050));
        assert_eq!(due(&mut s, 3100), vec![a], "a failed renewal is tried again at the next sweep");
    }

    #[test]
    fn due_slots_go_together_and_one_found_gone_is_written_back_and_renewed_on() {
        let mut s = Slots::new();
        let a = s.take(0, slot(b"a"), 0);
        let b = s.take(1, slot(b"b"), 50);
        let mut ids = due(&mut s, 1100);
        ids.sort();
        assert_eq!(ids, vec![a, b], "one sweep, one batch");
        assert!(s.renewal_answered(a, Renewal::WrittenBack, 1150), "counted lapsed");
        assert!(!s.renewal_answered(b, Renewal::Kept, 1150));
        let mut ids = due(&mut s, 2100);
        ids.sort();
        assert_eq!(ids, vec![a, b], "still renewed: its request runs");
        assert_eq!(s.get(a).map(|h| h.member.as_ref()), Some(&b"a"[..]));
    }

    #[test]
    fn an_orphan_is_released_until_redis_removed_it_or_for_one_life() {
        let mut s = Slots::new();
        let mut lapsed = Vec::new();
        assert!(s.orphan(1, slot(b"late"), 1000));
        assert!(!s.is_empty() && s.renewing_any());
        let o = orphans_due(&mut s, 1000, &mut lapsed);
        assert_eq!(o.len(), 1);
        assert_eq!(s.orphan_slot(o[0]).map(|h| h.slot_ref()), Some(slot(b"late")));
        assert!(
            orphans_due(&mut s, 1100, &mut lapsed).is_empty(),
            "not sent again while on its way"
        );
        assert_eq!(s.orphan_answered(o[0], Release::NotThere, 1010), None);
        assert!(orphans_due(&mut s, 1100, &mut lapsed).is_empty());
        assert_eq!(
            orphans_due(&mut s, 1110, &mut lapsed),
            o,
            "not there yet: sent again a tick later"
        );
        assert_eq!(s.orphan_answered(o[0], Release::NotThere, 1120), None);
        assert!(orphans_due(&mut s, 1310, &mut lapsed).is_empty(), "then after 200 ms");
        assert_eq!(orphans_due(&mut s, 1320, &mut lapsed), o);
        assert_eq!(s.orphan_answered(o[0], Release::NotThere, 1330), None);
        assert!(orphans_due(&mut s, 1720, &mut lapsed).is_empty(), "then after 400 ms");
        assert_eq!(orphans_due(&mut s, 1730, &mut lapsed), o);
        assert_eq!(s.orphan_answered(o[0], Release::Removed, 1740), None, "counted nowhere");
        assert!(s.is_empty(), "removed: done");

        assert!(s.orphan(1, slot(b"never"), 0));
        let o = orphans_due(&mut s, 0, &mut lapsed);
        s.orphan_answered(o[0], Release::Failed, 0);
        assert!(orphans_due(&mut s, 3000, &mut lapsed).is_empty(), "a life later: forgotten");
        assert!(s.is_empty() && lapsed.is_empty(), "never taken: nothing lapsed");
    }

    #[test]
    fn a_release_is_retried_until_redis_answers_and_counted_once() {
        let mut s = Slots::new();
        let mut lapsed = Vec::new();
        let a = s.take(2, slot(b"m"), 0);
        let r = s.release(a, 500).unwrap();
        assert_eq!(s.orphan_slot(r).map(|h| (h.zone, h.slot_ref())), Some((2, slot(b"m"))));
        assert_eq!(s.release(a, 500), None, "a second release finds nothing");
        assert!(orphans_due(&mut s, 600, &mut lapsed).is_empty(), "sent at once, not by the sweep");
        assert_eq!(s.orphan_answered(r, Release::Failed, 0), None);
        assert_eq!(orphans_due(&mut s, 600, &mut lapsed), vec![r], "failed: sent again");
        assert_eq!(
            s.orphan_answered(r, Release::NotThere, 0),
            Some(2),
            "gone either way: released"
        );
        assert!(s.is_empty());

        let b = s.take(3, slot(b"n"), 0);
        let r = s.release(b, 0).unwrap();
        s.orphan_answered(r, Release::Failed, 0);
        orphans_due(&mut s, 100, &mut lapsed);
        s.orphan_answered(r, Release::Failed, 0);
        assert!(orphans_due(&mut s, 3000, &mut lapsed).is_empty());
        assert_eq!(lapsed, vec![3], "never answered for a life: it lapsed in Redis");
        assert!(!s.renewal_answered(b, Renewal::WrittenBack, 3000), "released: not renewed");
    }

    #[test]
    fn a_renewal_that_wrote_back_a_released_slot_is_released_again() {
        let mut s = Slots::new();
        let mut lapsed = Vec::new();
        let a = s.take(0, slot(b"m"), 0);
        assert_eq!(due(&mut s, 1000), vec![a]);
        let r = s.release(a, 1010).unwrap();
        assert!(due(&mut s, 2100).is_empty(), "ended: never renewed again");
        assert_eq!(s.orphan_answered(r, Release::Removed, 0), Some(0));
        // The release ran before the renewal, which found the member gone and wrote it back.
        assert!(!s.renewal_answered(a, Renewal::WrittenBack, 1020), "not a lapse");
        let again = orphans_due(&mut s, 1020, &mut lapsed);
        assert_eq!(again.len(), 1);
        assert_eq!(s.orphan_slot(again[0]).map(|h| h.slot_ref()), Some(slot(b"m")));
        assert_eq!(s.orphan_answered(again[0], Release::Removed, 0), None);
        assert!(s.is_empty());

        let b = s.take(0, slot(b"k"), 0);
        due(&mut s, 1000);
        let r = s.release(b, 1010).unwrap();
        assert!(!s.renewal_answered(b, Renewal::Kept, 1020), "the renewal ran first");
        assert_eq!(s.orphan_answered(r, Release::Removed, 0), Some(0));
        assert!(s.is_empty());
    }

    #[test]
    fn the_shortest_life_leaves_room_for_a_failed_renewal() {
        assert_eq!(min_life_for(200), 1000, "the default timeout: 1 s, the floor");
        assert_eq!(min_life_for(1000), 3300);
        let (t, life) = (1000, min_life_for(1000));
        assert!(renew_every(life) + 2 * (100 + t) <= life);
    }

    #[test]
    fn local_slots_count_this_workers_requests_in_flight() {
        let mut s = Slots::new();
        for _ in 0..2 {
            s.local_take(7);
        }
        assert_eq!((s.local_in_flight(7), s.local_in_flight(8)), (2, 0));
        s.local_release(7);
        s.local_release(7);
        s.local_release(7);
        assert_eq!(s.local_in_flight(7), 0, "never below 0");
        assert!(s.local.is_empty(), "an entry goes at 0");
    }
}

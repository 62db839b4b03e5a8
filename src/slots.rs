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
//! one holds. Its members are kept as *orphans*: the sweep sends their release every tick until
//! Redis says it removed the member, or for one slot life (a slot granted later than that
//! lapses by itself no later than a life after Redis ran the decision; until then it only
//! takes room, never gives too much).

use std::collections::HashMap;

use crate::lease::Grant;
use crate::script::{Decision, SlotRef, ZoneVerdict};

/// `lease_time`'s default for a concurrency zone: a slot of a worker that died (SIGKILL, OOM, a
/// machine gone) keeps its room taken at most this long, while a slot of a running request
/// costs Redis a renewal every 1.7 s, one decision of a batched script call.
pub const DEFAULT_SLOT_MS: u64 = 5000;

/// The shortest slot life: renewals are due every third of it and sent by a sweep that runs
/// every 100 ms, so that a renewal that times out still leaves room for the next one.
pub const MIN_SLOT_MS: u64 = 1000;

/// The most orphans a worker keeps; beyond, their slots (if Redis grants them) lapse.
const MAX_ORPHANS: usize = 10_000;

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
    pub key: Box<[u8]>,
    /// The request's member: its `$request_id`.
    pub member: Box<[u8]>,
    pub limit: u64,
    pub life_ms: u64,
    /// Monotonic ms from which a renewal is due.
    due: u64,
    /// The monotonic ms a renewal on its way was sent: not sent again until it is answered.
    renewing: Option<u64>,
    /// A renewal found the slot gone (its life ran out, or the key was reset): not renewed any
    /// more. Its request keeps running; its release at the end is harmless.
    lapsed: bool,
}

impl Held {
    pub fn slot_ref(&self) -> SlotRef<'_> {
        SlotRef { key: &self.key, limit: self.limit, life_ms: self.life_ms, member: &self.member }
    }
}

/// A member a late decision may hold, released until Redis says it removed it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Orphan {
    slot: Held,
    /// Monotonic ms after which it is no longer released: any slot it got has lapsed.
    until: u64,
    /// A release is on its way.
    sending: bool,
}

/// The slots of this worker's requests, by an id the request keeps.
#[derive(Debug, Default)]
pub struct Slots {
    map: HashMap<u64, Held>,
    orphans: HashMap<u64, Orphan>,
    next: u64,
    /// `ratelimit_fail local`: this worker's requests in flight per (zone, whole key), admitted
    /// by it alone while Redis could not decide. An entry goes when its count is back at 0, so
    /// the table holds no more than the requests in flight.
    local: HashMap<(usize, Box<[u8]>), u64>,
}

/// One zone of a request decided by `ratelimit_fail local`, for [`local_decision`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalPart {
    /// A concurrency zone: this worker's requests of the key in flight, and its share of the
    /// limit.
    Concurrency { in_flight: u64, limit: u64 },
    /// A rate zone, decided by the local limiter.
    Rate { limit: u64 },
}

/// A request's local decision over all its zones, in order: admitted when every concurrency
/// zone has room for one more of this worker's requests and the local limiter admits the rate
/// zones. `rate` is that limiter's decision over the rate zones, in order; `None` when it was
/// not asked (a concurrency zone had no room: nothing is counted against the rates, as with
/// Redis).
pub fn local_decision(parts: &[LocalPart], rate: Option<&Decision>) -> Decision {
    let room = parts.iter().all(|p| match *p {
        LocalPart::Concurrency { in_flight, limit } => in_flight < limit,
        LocalPart::Rate { .. } => true,
    });
    let allowed = room && rate.is_none_or(|d| d.allowed);
    let mut rates = rate.into_iter().flat_map(|d| d.zones.iter().copied());
    let zones = parts
        .iter()
        .map(|p| match *p {
            LocalPart::Concurrency { in_flight, limit } => {
                let ok = in_flight < limit;
                let after = in_flight + u64::from(allowed);
                let reset_ms = if ok { 0 } else { 1000 };
                ZoneVerdict {
                    ok,
                    remaining: limit.saturating_sub(after),
                    reset_ms,
                    grant: Grant::default(),
                }
            }
            LocalPart::Rate { limit } => rates.next().unwrap_or(ZoneVerdict {
                ok: true,
                remaining: limit,
                reset_ms: 0,
                grant: Grant::default(),
            }),
        })
        .collect();
    Decision { allowed, zones }
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

    fn held(zone: usize, slot: SlotRef<'_>, due: u64) -> Held {
        Held {
            zone,
            key: slot.key.into(),
            member: slot.member.into(),
            limit: slot.limit,
            life_ms: slot.life_ms,
            due,
            renewing: None,
            lapsed: false,
        }
    }

    /// Notes a slot Redis granted to a decision sent at `sent` (monotonic ms); returns its id.
    pub fn take(&mut self, zone: usize, slot: SlotRef<'_>, sent: u64) -> u64 {
        self.next += 1;
        self.map.insert(self.next, Self::held(zone, slot, sent + renew_every(slot.life_ms)));
        self.next
    }

    /// Notes a member that a decision may still grant with no request to hold it, at `now`.
    /// False when the table of orphans is full (the slot, if granted, lapses).
    pub fn orphan(&mut self, zone: usize, slot: SlotRef<'_>, now: u64) -> bool {
        if self.orphans.len() >= MAX_ORPHANS {
            return false;
        }
        self.next += 1;
        let until = now + slot.life_ms;
        let orphan = Orphan { slot: Self::held(zone, slot, now), until, sending: false };
        self.orphans.insert(self.next, orphan);
        true
    }

    /// The orphans whose release is due at `now` (all but those on their way), marked as sent;
    /// those past their time are forgotten.
    pub fn orphans_due(&mut self, now: u64) -> Vec<u64> {
        self.orphans.retain(|_, o| o.sending || now < o.until);
        let mut ids = Vec::new();
        for (&id, o) in self.orphans.iter_mut().filter(|(_, o)| !o.sending) {
            o.sending = true;
            ids.push(id);
        }
        ids
    }

    /// `ratelimit_fail local`: this worker's requests of `key` in flight in `zone`.
    pub fn local_in_flight(&self, zone: usize, key: &[u8]) -> u64 {
        // The tuple key borrows as a whole only when owned; keys are short and this runs only
        // while Redis is failing.
        self.local.get(&(zone, key.into())).copied().unwrap_or(0)
    }

    /// A request admitted locally holds one more of `zone`'s slots of `key` on this worker.
    pub fn local_take(&mut self, zone: usize, key: &[u8]) {
        *self.local.entry((zone, key.into())).or_insert(0) += 1;
    }

    /// That request ended.
    pub fn local_release(&mut self, zone: usize, key: &[u8]) {
        let k = (zone, Box::<[u8]>::from(key));
        if let Some(n) = self.local.get_mut(&k) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.local.remove(&k);
            }
        }
    }

    /// Drops every orphan (a worker on its way out).
    pub fn forget_orphans(&mut self) {
        self.orphans.clear();
    }

    pub fn orphan_slot(&self, id: u64) -> Option<&Held> {
        self.orphans.get(&id).map(|o| &o.slot)
    }

    /// What Redis said to an orphan's release: `removed`, the member was there and is gone, so
    /// the orphan is done; otherwise (not there yet, or the release failed) it is sent again.
    pub fn orphan_answered(&mut self, id: u64, removed: bool) {
        if removed {
            self.orphans.remove(&id);
        } else if let Some(o) = self.orphans.get_mut(&id) {
            o.sending = false;
        }
    }

    /// The slot's request ended: the slot leaves the table, to be released in Redis. `None` if
    /// it was taken back already (a request's cleanup runs twice).
    pub fn release(&mut self, id: u64) -> Option<Held> {
        self.map.remove(&id)
    }

    /// Every slot due for renewal at `now`, marked as being renewed (sent at `now`). All go in
    /// one sweep, so the pool writes them as one script call (up to 64 renewals a call).
    pub fn due(&mut self, now: u64) -> Vec<u64> {
        let mut ids = Vec::new();
        for (&id, h) in self.map.iter_mut() {
            if !h.lapsed && h.renewing.is_none() && now >= h.due {
                h.renewing = Some(now);
                ids.push(id);
            }
        }
        ids
    }

    pub fn get(&self, id: u64) -> Option<&Held> {
        self.map.get(&id)
    }

    /// Redis renewed the slot: the next renewal is due a third of a life after this one was
    /// sent.
    pub fn renewed(&mut self, id: u64) {
        if let Some(h) = self.map.get_mut(&id) {
            if let Some(sent) = h.renewing.take() {
                h.due = sent + renew_every(h.life_ms);
            }
        }
    }

    /// The renewal failed (Redis down, a timeout): the next sweep tries again.
    pub fn renew_failed(&mut self, id: u64) {
        if let Some(h) = self.map.get_mut(&id) {
            h.renewing = None;
        }
    }

    /// The renewal found the slot gone: it lapsed. False if its request had ended meanwhile
    /// (then the release took it, and nothing lapsed that was still wanted).
    pub fn lapsed(&mut self, id: u64) -> bool {
        match self.map.get_mut(&id) {
            Some(h) => {
                h.renewing = None;
                h.lapsed = true;
                true
            }
            None => false,
        }
    }

    /// Whether a renewal or an orphan's release may still be due: the sweep keeps running
    /// while this holds.
    pub fn renewing_any(&self) -> bool {
        !self.orphans.is_empty() || self.map.values().any(|h| !h.lapsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(member: &[u8]) -> SlotRef<'_> {
        SlotRef { key: b"rl:conc:a", limit: 5, life_ms: 3000, member }
    }

    #[test]
    fn a_slot_is_renewed_every_third_of_its_life_from_when_the_renewal_was_sent() {
        let mut s = Slots::new();
        let a = s.take(0, slot(b"a"), 1000);
        assert!(s.due(1999).is_empty(), "a third of 3 s after the decision was sent");
        assert_eq!(s.due(2000), vec![a]);
        assert!(s.due(2100).is_empty(), "not sent again while on its way");
        s.renewed(a);
        assert!(s.due(2999).is_empty());
        assert_eq!(s.due(3000), vec![a], "due a third of a life after the renewal was sent");
        s.renew_failed(a);
        assert_eq!(s.due(3100), vec![a], "a failed renewal is tried again at the next sweep");
    }

    #[test]
    fn due_slots_go_together_and_a_lapsed_one_is_not_renewed() {
        let mut s = Slots::new();
        let a = s.take(0, slot(b"a"), 0);
        let b = s.take(1, slot(b"b"), 50);
        let mut due = s.due(1100);
        due.sort();
        assert_eq!(due, vec![a, b], "one sweep, one batch");
        assert!(s.lapsed(a));
        s.renewed(b);
        assert!(s.renewing_any());
        assert_eq!(s.due(5000), vec![b]);
        assert_eq!(s.get(a).map(|h| h.member.as_ref()), Some(&b"a"[..]));
        s.release(b);
        assert!(!s.renewing_any(), "only a lapsed slot left: nothing to renew");
    }

    #[test]
    fn an_orphan_is_released_until_redis_removed_it_or_for_one_life() {
        let mut s = Slots::new();
        assert!(s.orphan(1, slot(b"late"), 1000));
        assert!(!s.is_empty() && s.renewing_any());
        let o = s.orphans_due(1000);
        assert_eq!(o.len(), 1);
        assert_eq!(s.orphan_slot(o[0]).map(|h| h.slot_ref()), Some(slot(b"late")));
        assert!(s.orphans_due(1100).is_empty(), "not sent again while on its way");
        s.orphan_answered(o[0], false);
        assert_eq!(s.orphans_due(1100), o, "not there yet: sent again");
        s.orphan_answered(o[0], true);
        assert!(s.is_empty(), "removed: done");

        let b = s.orphan(1, slot(b"never"), 0);
        assert!(b);
        let o = s.orphans_due(0);
        s.orphan_answered(o[0], false);
        assert!(s.orphans_due(3000).is_empty(), "a life later: forgotten");
        assert!(s.is_empty());
    }

    #[test]
    fn a_local_decision_counts_this_workers_requests_in_flight() {
        let mut s = Slots::new();
        for _ in 0..2 {
            s.local_take(0, b"k");
        }
        assert_eq!((s.local_in_flight(0, b"k"), s.local_in_flight(1, b"k")), (2, 0));
        s.local_release(0, b"k");
        s.local_release(0, b"k");
        s.local_release(0, b"k");
        assert_eq!(s.local_in_flight(0, b"k"), 0, "never below 0");
        assert!(s.local.is_empty(), "an entry goes at 0");

        let ok =
            |remaining| ZoneVerdict { ok: true, remaining, reset_ms: 0, grant: Grant::default() };
        let rate = Decision { allowed: true, zones: vec![ok(7)] };
        let parts =
            [LocalPart::Rate { limit: 10 }, LocalPart::Concurrency { in_flight: 1, limit: 2 }];
        let d = local_decision(&parts, Some(&rate));
        assert!(d.allowed);
        assert_eq!((d.zones[0].remaining, d.zones[1].remaining), (7, 0), "the 2nd of 2 in flight");
        // Full: rejected without asking the rates, which are not charged.
        let full =
            [LocalPart::Rate { limit: 10 }, LocalPart::Concurrency { in_flight: 2, limit: 2 }];
        let d = local_decision(&full, None);
        assert!(!d.allowed);
        assert_eq!((d.zones[1].ok, d.zones[1].reset_ms, d.deciding_zone()), (false, 1000, 1));
        // The rates reject: no slot.
        let no = Decision { allowed: false, zones: vec![ZoneVerdict { ok: false, ..ok(0) }] };
        let d = local_decision(&parts, Some(&no));
        assert!(!d.allowed);
        assert_eq!(d.zones[1].remaining, 1, "not taken");
    }

    #[test]
    fn the_shortest_life_leaves_room_for_a_failed_renewal() {
        assert_eq!(min_life_for(200), 1000, "the default timeout: 1 s, the floor");
        assert_eq!(min_life_for(1000), 3300);
        let (t, life) = (1000, min_life_for(1000));
        assert!(renew_every(life) + 2 * (100 + t) <= life);
    }

    #[test]
    fn release_takes_the_slot_once() {
        let mut s = Slots::new();
        let a = s.take(2, slot(b"m"), 0);
        let h = s.release(a).unwrap();
        assert_eq!((h.zone, h.slot_ref()), (2, slot(b"m")));
        assert_eq!(s.release(a), None, "a second release finds nothing");
        assert!(!s.lapsed(a), "a renewal answered after the release: nothing lapsed");
        s.renewed(a);
        assert!(s.is_empty());
    }
}

//! What Redis says of a leased key after the fact: a change (a write, a reset, a flush) stops
//! the spending of its reservations until a check by rid says they are still of the key's life;
//! lost tracking leaves them spendable until they can be checked again.

use super::{Check, Checking, Leases, OWN_WRITE_MS, RECHECK_MS};
use crate::decide::table_key::{stored_key, stored_zone, TableKey};

impl Leases {
    /// Reservations of `key` (a whole Redis key) in any of `zones` zones are dropped, nothing
    /// given back: whether they are still of the key's life cannot be checked.
    pub fn revoke(&mut self, zones: usize, key: &[u8]) {
        for zone in 0..zones {
            if let Some(e) = self.entry(&TableKey::new(zone, &[key])) {
                e.held = None;
            }
        }
    }

    /// Redis says `key` (a whole Redis key) changed: its reservations are checked by rid, after
    /// the key's tracking is renewed so that a later change is heard of too. A change this
    /// worker did not make may be a reset: not spent until the check answers. One that most
    /// likely is this worker's own decision (Redis answered one since the key's tracking was
    /// renewed) is checked while they are spent on: every write of the key tells of a change, and a
    /// reservation stopped at each would hardly be spent (each stop sends a decision, whose
    /// write tells of the next change); a reset at that very moment is then found within the
    /// check's two round trips. Returns a zone of the key whose tracking is to be renewed
    /// (`EXISTS`, on that zone's backend), which starts the check (or, while a check waits for
    /// a renewal, renews the tracking again: the check reads the key after the change); `None`
    /// when none is: a change heard once the check is sent asks for another after it, and stops
    /// the spending until then unless it is most likely this worker's own.
    pub fn changed(&mut self, zones: usize, key: &[u8], now: u64) -> Option<usize> {
        let mut track = None;
        for zone in 0..zones {
            let Some(e) = self.entry(&TableKey::new(zone, &[key])) else { continue };
            let own = e.wrote.take().is_some_and(|at| now.saturating_sub(at) <= OWN_WRITE_MS);
            let Some(h) = e.held.as_mut() else { continue };
            if h.checking != Checking::Rid {
                // The write ended the key's tracking: renewed again. A check not sent yet goes
                // when a renewal answers, after this change was heard: it reads the key after
                // the change.
                (h.checking, h.checking_since) = (Checking::Tracking, now);
                h.suspect |= !own;
                track = Some(zone);
            } else {
                // The check on its way may have run before this change: another follows it,
                // and a change not of this worker stops the spending until that one answers.
                h.recheck = true;
                h.recheck_suspect |= !own;
                h.suspect |= !own;
            }
        }
        track
    }

    /// The checks to send for `key` now that its tracking is renewed (`EXISTS` answered, `gone`
    /// if the key was not there), each handed to `send`: one per reservation of the key being
    /// checked, and when it is gone, one per reservation, none spent until its check answers.
    pub fn checks(
        &mut self,
        zones: usize,
        key: &[u8],
        gone: bool,
        now: u64,
        mut send: impl FnMut(Check),
    ) {
        for zone in 0..zones {
            let Some(h) = self.entry(&TableKey::new(zone, &[key])).and_then(|e| e.held.as_mut())
            else {
                continue;
            };
            h.suspect |= gone;
            if h.checking == Checking::Tracking || (gone && h.checking == Checking::No) {
                (h.checking, h.checking_since) = (Checking::Rid, now);
                send(Check { zone, rid: h.grant.rid });
            }
        }
    }

    /// Redis answered a check of `key` (`None`: it did not): a reservation still of the key's
    /// life is spent again, one of an older life dropped without a give-back (Redis no longer
    /// counts its units). An answer about another reservation (one replaced since) is ignored.
    /// Returns whether the key's tracking is to be renewed for the check again that a change
    /// heard meanwhile asks for.
    pub fn checked(&mut self, key: &[u8], c: Check, present: Option<bool>, now: u64) -> bool {
        let Some(e) = self.entry(&TableKey::new(c.zone, &[key])) else { return false };
        let Some(h) = e.held.as_mut().filter(|h| h.grant.rid == c.rid) else { return false };
        if h.checking != Checking::Rid {
            return false;
        }
        match present {
            Some(true) => {
                (h.suspect, h.unverified) = (core::mem::take(&mut h.recheck_suspect), false);
                h.checking = if h.recheck { Checking::Tracking } else { Checking::No };
                h.checking_since = now;
                core::mem::take(&mut h.recheck)
            }
            Some(false) => {
                e.held = None;
                false
            }
            None => {
                h.give_up_check();
                false
            }
        }
    }

    /// Anything may have changed (`FLUSHALL`): every reservation is checked as one whose key
    /// was found gone, not spent until then, starting with its key's tracking (`track`); one
    /// whose tracking cannot be had goes.
    pub fn suspect_all(&mut self, now: u64, mut track: impl FnMut(usize, &[u8]) -> bool) {
        for e in self.map.values_mut() {
            let Some(h) = e.held.as_mut() else { continue };
            if h.checking == Checking::Rid {
                // As for a change not of this worker: another check after the one on its way,
                // nothing spent until it answers.
                (h.recheck, h.recheck_suspect, h.suspect) = (true, true, true);
            } else if track(stored_zone(&e.key), stored_key(&e.key)) {
                (h.suspect, h.checking, h.checking_since) = (true, Checking::Tracking, now);
            } else {
                e.held = None;
            }
        }
    }

    /// Redis's tracking was lost: a reset could go unheard from now on. Reservations stay
    /// spendable while the tracking cannot be had, and are checked once it can.
    pub fn unverify_all(&mut self) {
        for h in self.map.values_mut().filter_map(|e| e.held.as_mut()) {
            h.unverified = true;
            self.unverified = true;
        }
    }

    /// Checks the reservations the tracking was lost for (or whose check Redis did not answer),
    /// where `track` (renewing a key's tracking, false while it cannot) says it can be had:
    /// spent on meanwhile, as they were while unchecked, and dropped if the check finds them of
    /// an older life. At most once per [`RECHECK_MS`], so that a silent Redis is not asked every
    /// tick.
    pub fn verify_unverified(&mut self, now: u64, mut track: impl FnMut(usize, &[u8]) -> bool) {
        if !self.unverified || now < self.verify_at {
            return;
        }
        self.verify_at = now + RECHECK_MS;
        let mut left = false;
        for e in self.map.values_mut() {
            let Some(h) = e.held.as_mut().filter(|h| h.unverified && h.checking == Checking::No)
            else {
                continue;
            };
            if track(stored_zone(&e.key), stored_key(&e.key)) {
                (h.checking, h.checking_since) = (Checking::Tracking, now);
            } else {
                left = true;
            }
        }
        self.unverified = left;
    }
}

//! Reservations (`lease=`): units one worker took from Redis in advance for one key, spent on
//! that key's requests without asking Redis until they run out or their time is up; what is left
//! then goes back to Redis. Pure bookkeeping: the handler asks "admit locally?" and "how many to
//! ask for?", and sends what [`Leases::sweep`] and [`Leases::drain`] hand back.
//!
//! Redis records reserved units as used until the latest instant they may be spent (the script's
//! time plus the reservation's life), so the limit holds whoever spends them and when: see
//! `lua/decide.lua`. A reservation belongs to the life of its key it was granted in: Redis names
//! it with a rid in the key's ledger, which a reset empties, so its give-back and the check after
//! a change name that rid and can never touch a newer life of the key, whatever order the
//! answers come in. This side must only never spend a unit after that instant. It measures the
//! life from the moment the request that asked was *started* (before Redis ran the script), on the
//! worker's monotonic clock, and stops [`margin_ms`] early: nginx's cached clock can lag the real
//! one by an event-loop iteration, and two machines' clocks may run at slightly different rates.

use std::collections::HashMap;

/// How many units a zone asks for: `auto` sizes them from the demand this worker sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseSize {
    Auto,
    Fixed(u64),
}

/// `lease=` and `lease_time=` of a zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConf {
    pub size: LeaseSize,
    pub time_ms: u64,
}

/// `lease_time`'s default: long enough that a key busy at tens of requests a second asks Redis a
/// few times a second at most, short enough that a worker killed while holding units leaves them
/// unusable for one second only, and that a unit reserved and spent late stays counted in a
/// minute's window less than 2 % longer than it had to.
pub const DEFAULT_LEASE_MS: u64 = 1000;

impl LeaseConf {
    /// The life asked for, for a window of `window_ms`: `lease_time`, at most a quarter of the
    /// window, so that reserved units never hold a short window for most of its length.
    pub fn life_ms(&self, window_ms: u64) -> u64 {
        self.time_ms.min(window_ms / 4)
    }
}

/// `auto` reserves for a key only once this worker's requests took this many of its units
/// within a reservation's life: a smaller reservation saves a call or two, and one left unspent
/// costs a give-back, as much as the call it saved (measured with a Zipf load: reservations for
/// keys seen twice were mostly given back).
const AUTO_MIN_UNITS: u64 = 4;

/// How often reservations that could not be checked are tried again.
const RECHECK_MS: u64 = 1000;

/// How much earlier than Redis's end of a reservation this worker stops spending it.
pub fn margin_ms(life_ms: u64) -> u64 {
    (life_ms / 50).max(10)
}

/// What Redis granted with a decision: `units` recorded as used until `life_ms` after the
/// script ran; `token` names them for a give-back, `rid` the reservation in the key's ledger
/// (`lua/decide.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Grant {
    pub units: u64,
    pub life_ms: u64,
    pub token: u64,
    pub rid: u64,
}

/// Units to return to Redis: a `G` decision of `lua/decide.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GiveBack {
    pub zone: usize,
    /// The whole Redis key.
    pub key: Vec<u8>,
    pub units: u64,
    /// Names the unspent units: for the log the first unspent member, else the grant's token.
    pub token: u64,
    /// The reservation in the key's ledger: units of another life of the key are not returned.
    pub rid: u64,
    pub limit: u64,
    pub window_ms: u64,
}

/// A reservation to check after Redis said its key changed: whether `rid` is still of the key's
/// present life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check {
    pub zone: usize,
    pub rid: u64,
}

/// Where the check of a reservation is, after Redis said its key changed: `EXISTS` renews the
/// key's tracking first, so that a change after the check is heard of; then the check by rid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checking {
    No,
    Tracking,
    Rid,
}

/// The figures a request decides a zone with; a reservation serves only requests with the same
/// limit and window (they may come from variables: a plan change must ask Redis).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figures {
    pub limit: u64,
    pub window_ms: u64,
}

/// A reservation being spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    grant: Grant,
    spent: u64,
    /// Monotonic ms after which no unit may be spent.
    until: u64,
    figures: Figures,
    /// What the zone admitted besides the reservation when it was granted, and when its
    /// reset was due: the headers of requests admitted from it.
    remaining: u64,
    reset_at: u64,
    /// Not spent until a check answers: Redis told of a change this worker did not make (it
    /// may be a reset), the key was found gone, or Redis flushed.
    suspect: bool,
    /// Redis's tracking was lost, so a reset could have gone unheard: spent while it cannot be
    /// checked (Redis counted these units; refusing them helps no one while Redis is away), and
    /// checked as soon as the tracking is back.
    unverified: bool,
    checking: Checking,
    /// When the check on its way started: one Redis has not answered within `timeout` leaves
    /// the reservation `unverified` (spent while Redis is silent, checked again later).
    checking_since: u64,
    /// Redis told of another change while a check was on its way: checked again once that check
    /// has answered.
    recheck: bool,
}

impl Held {
    fn left(&self) -> u64 {
        self.grant.units - self.spent
    }

    /// Redis did not answer a check: while it cannot be asked, the reservation is spent (Redis
    /// counted its units; a reset that came just before Redis fell silent is the one thing that
    /// goes unchecked meanwhile), and it is checked again later.
    fn give_up_check(&mut self) {
        (self.checking, self.recheck, self.suspect, self.unverified) =
            (Checking::No, false, false, true);
    }

    fn give_back(&self, zone: usize, key: &[u8], algorithm_is_log: bool) -> Option<GiveBack> {
        (self.left() > 0).then(|| GiveBack {
            zone,
            key: key.to_vec(),
            units: self.left(),
            // The log's reserved members are consecutive from the token; the spent ones first.
            token: if algorithm_is_log { self.grant.token + self.spent } else { self.grant.token },
            rid: self.grant.rid,
            limit: self.figures.limit,
            window_ms: self.figures.window_ms,
        })
    }
}

/// What this worker knows of one key of one zone.
#[derive(Debug, Clone, Copy)]
struct Entry {
    held: Option<Held>,
    /// Units asked for in the current measuring interval, which started at `from` and lasts
    /// `interval` (the reservation's life), and in the one before.
    from: u64,
    interval: u64,
    now_units: u64,
    last_units: u64,
    /// The log's give-back names members: set for `sliding_log` zones.
    log: bool,
    /// A reservation was asked for and not answered yet: until then (or this time), the key's
    /// other requests are decided exactly instead of each asking for one more reservation.
    asking_until: u64,
    /// The last request of the key: a key idle for two lives is forgotten.
    touched: u64,
    /// Redis answered a decision of this worker for the key, which wrote it, since the key's
    /// tracking was renewed: the next change told of is most likely that write.
    wrote: bool,
}

impl Entry {
    /// Rolls the demand counters forward to `now`.
    fn roll(&mut self, now: u64) {
        let elapsed = now.saturating_sub(self.from);
        if elapsed >= 2 * self.interval {
            (self.last_units, self.now_units, self.from) = (0, 0, now);
        } else if elapsed >= self.interval {
            (self.last_units, self.now_units) = (self.now_units, 0);
            self.from += self.interval;
        }
    }

    fn idle(&self, now: u64) -> bool {
        self.held.is_none() && now.saturating_sub(self.touched) >= 2 * self.interval
    }
}

/// One zone of a request, as the table sees it.
pub struct Ask<'a> {
    pub zone: usize,
    /// The parts of the whole Redis key.
    pub key: [&'a [u8]; 4],
    pub cost: u64,
    pub figures: Figures,
}

/// A bounded table of (zone, key) → reservation and demand, per worker. Keys beyond the bound
/// are decided exactly: nothing is evicted, so no reservation is dropped to make room.
pub struct Leases {
    /// The zone index's bytes followed by the key, so lookups borrow one flat string. SipHash
    /// because keys come from clients.
    map: HashMap<Box<[u8]>, Entry>,
    capacity: usize,
    scratch: Vec<u8>,
    /// Expired reservations met by [`Leases::want`], to give back before the decision that asks
    /// for the next one: in the same call, ahead of it, a `gcra` give-back still finds the TAT
    /// it left.
    back: Vec<GiveBack>,
    /// Some reservation is `unverified`, to be checked from `verify_at` on.
    unverified: bool,
    verify_at: u64,
}

impl Leases {
    pub fn new(capacity: usize) -> Self {
        Leases {
            map: HashMap::new(),
            capacity: capacity.max(1),
            scratch: Vec::new(),
            back: Vec::new(),
            unverified: false,
            verify_at: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn slot(&mut self, zone: usize, key: &[&[u8]]) -> &[u8] {
        self.scratch.clear();
        self.scratch.extend_from_slice(&zone.to_ne_bytes());
        key.iter().for_each(|p| self.scratch.extend_from_slice(p));
        &self.scratch
    }

    /// Spends `cost` units of each zone's reservation if every zone has them, and nothing
    /// otherwise (a request is admitted by all its zones or goes to Redis). Returns the zone
    /// with the least left, as after a Redis decision: its index, remaining units and reset in
    /// ms, for the headers.
    pub fn try_spend(&mut self, asks: &[Ask<'_>], now: u64) -> Option<(usize, u64, u64)> {
        for a in asks {
            self.slot(a.zone, &a.key);
            let h = self.map.get(self.scratch.as_slice())?.held.as_ref()?;
            if h.left() < a.cost || now >= h.until || h.figures != a.figures || h.suspect {
                return None;
            }
        }
        let mut out: Option<(usize, u64, u64)> = None;
        for (i, a) in asks.iter().enumerate() {
            self.slot(a.zone, &a.key);
            let e = self.map.get_mut(self.scratch.as_slice())?;
            e.roll(now);
            e.now_units += a.cost;
            e.touched = now;
            let h = e.held.as_mut()?;
            h.spent += a.cost;
            let remaining = h.remaining + h.left();
            if out.is_none_or(|(_, least, _)| remaining < least) {
                out = Some((i, remaining, h.reset_at.saturating_sub(now)));
            }
            if h.left() == 0 {
                e.held = None;
            }
        }
        out
    }

    /// The units to ask Redis to reserve with a decision of this zone, and notes the demand.
    /// `auto`: what this worker's requests of the key took over the last reservation's life,
    /// nothing for a key that took fewer than `AUTO_MIN_UNITS` (a plain exact decision); at most
    /// the limit.
    pub fn want(
        &mut self,
        ask: &Ask<'_>,
        size: LeaseSize,
        life_ms: u64,
        log: bool,
        now: u64,
    ) -> u64 {
        let interval = life_ms.max(1);
        let full = self.map.len() >= self.capacity;
        self.slot(ask.zone, &ask.key);
        let e = match self.map.get_mut(self.scratch.as_slice()) {
            Some(e) => e,
            None if full => return 0,
            None => {
                let key: Box<[u8]> = self.scratch.as_slice().into();
                let entry = Entry {
                    held: None,
                    from: now,
                    interval,
                    now_units: 0,
                    last_units: 0,
                    log,
                    asking_until: 0,
                    touched: now,
                    wrote: false,
                };
                self.map.entry(key).or_insert(entry)
            }
        };
        e.interval = interval;
        e.touched = now;
        e.roll(now);
        let seen = e.now_units.max(e.last_units);
        e.now_units += ask.cost;
        if now < e.asking_until {
            return 0;
        }
        if let Some(h) = e.held {
            if now < h.until && h.figures == ask.figures {
                // Still held (being checked, or short of this request's cost): a new grant would
                // replace it, and a replaced `gcra` reservation cannot be given back once the
                // new one moved the TAT. It is spent again once checked.
                return 0;
            }
            // Over, or for other figures: back first, in the same call as the next ask.
            self.back.extend(h.give_back(ask.zone, &flat_key(&self.scratch), log));
            e.held = None;
        }
        let want = match size {
            LeaseSize::Fixed(n) => n,
            // Busy enough: expect as much again over the next life.
            LeaseSize::Auto if seen >= AUTO_MIN_UNITS => seen.max(ask.cost).min(ask.figures.limit),
            LeaseSize::Auto => 0,
        };
        if want > 0 {
            e.asking_until = now + interval;
        }
        want
    }

    /// Redis answered a decision of this zone's key (granted or not): the next request may ask
    /// again, and the change Redis tells of next is most likely this decision's write.
    pub fn answered(&mut self, ask: &Ask<'_>) {
        self.slot(ask.zone, &ask.key);
        if let Some(e) = self.map.get_mut(self.scratch.as_slice()) {
            (e.asking_until, e.wrote) = (0, true);
        }
    }

    /// Installs what Redis granted for a request started at `started` (monotonic ms), with the
    /// zone's remaining (the grant excluded) and reset. A reservation still held for the key is
    /// replaced, and returned for giving back.
    #[allow(clippy::too_many_arguments)]
    pub fn granted(
        &mut self,
        ask: &Ask<'_>,
        grant: Grant,
        started: u64,
        remaining: u64,
        reset_ms: u64,
        log: bool,
    ) -> Option<GiveBack> {
        if grant.units == 0 || grant.life_ms <= margin_ms(grant.life_ms) {
            return None;
        }
        let full = self.map.len() >= self.capacity;
        self.slot(ask.zone, &ask.key);
        let key = self.scratch.clone();
        if full && !self.map.contains_key(key.as_slice()) {
            // Not kept: given back at once.
            let held = held(grant, 0, ask.figures, remaining, started, reset_ms);
            return held.give_back(ask.zone, &flat_key(&key), log);
        }
        let interval = grant.life_ms;
        let e = self.map.entry(key.clone().into_boxed_slice()).or_insert(Entry {
            held: None,
            from: started,
            interval,
            now_units: 0,
            last_units: 0,
            log,
            asking_until: 0,
            touched: started,
            wrote: false,
        });
        // The handler has just renewed the key's tracking, after this decision's write.
        (e.asking_until, e.wrote) = (0, false);
        let old = e.held.replace(held(
            grant,
            margin_ms(grant.life_ms),
            ask.figures,
            remaining,
            started,
            reset_ms,
        ));
        old.and_then(|h| h.give_back(ask.zone, &flat_key(&key), log))
    }

    /// Reservations whose time is up give back what is left; checks Redis has not answered
    /// within `timeout_ms` are given up (the reservation `unverified`); keys idle for two lives
    /// are forgotten.
    pub fn sweep(&mut self, now: u64, timeout_ms: u64) -> Vec<GiveBack> {
        let mut out = Vec::new();
        let mut unverified = false;
        self.map.retain(|k, e| {
            if let Some(h) = e.held.filter(|h| now >= h.until) {
                out.extend(h.give_back(zone_of(k), &flat_key(k), e.log));
                e.held = None;
            }
            if let Some(h) = e.held.as_mut() {
                if h.checking != Checking::No && now >= h.checking_since + timeout_ms {
                    h.give_up_check();
                }
                unverified |= h.unverified;
            }
            if e.idle(now) {
                return false;
            }
            e.roll(now);
            true
        });
        self.unverified = unverified;
        out
    }

    /// Every reservation's unspent units, the table emptied: at worker exit and reload.
    pub fn drain(&mut self) -> Vec<GiveBack> {
        let out = self
            .map
            .iter()
            .filter_map(|(k, e)| e.held.and_then(|h| h.give_back(zone_of(k), &flat_key(k), e.log)))
            .collect();
        self.map.clear();
        out
    }

    /// The give-backs [`Leases::want`] set aside, to send before the decision.
    pub fn take_back(&mut self) -> Vec<GiveBack> {
        core::mem::take(&mut self.back)
    }

    /// Reservations of `key` (a whole Redis key) in any of `zones` zones are dropped, nothing
    /// given back: whether they are still of the key's life cannot be checked.
    pub fn revoke(&mut self, zones: usize, key: &[u8]) {
        for zone in 0..zones {
            self.slot(zone, &[key]);
            if let Some(e) = self.map.get_mut(self.scratch.as_slice()) {
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
    /// check's two round trips. Returns whether the key's tracking is to be renewed (`EXISTS`),
    /// which starts the check; a change heard during a check asks for another after it, which
    /// does not stop the spending.
    pub fn changed(&mut self, zones: usize, key: &[u8], now: u64) -> bool {
        let mut track = false;
        for zone in 0..zones {
            self.slot(zone, &[key]);
            let Some(e) = self.map.get_mut(self.scratch.as_slice()) else { continue };
            let own = core::mem::take(&mut e.wrote);
            let Some(h) = e.held.as_mut() else { continue };
            if h.checking == Checking::No {
                (h.checking, h.checking_since) = (Checking::Tracking, now);
                h.suspect |= !own;
                track = true;
            } else {
                h.recheck = true;
            }
        }
        track
    }

    /// The checks to send for `key` now that its tracking is renewed (`EXISTS` answered, `gone`
    /// if the key was not there): one per reservation of the key being checked, and when it is
    /// gone, one per reservation, none spent until its check answers.
    pub fn checks(&mut self, zones: usize, key: &[u8], gone: bool, now: u64) -> Vec<Check> {
        let mut out = Vec::new();
        for zone in 0..zones {
            self.slot(zone, &[key]);
            let Some(h) = self.map.get_mut(self.scratch.as_slice()).and_then(|e| e.held.as_mut())
            else {
                continue;
            };
            h.suspect |= gone;
            if h.checking == Checking::Tracking || (gone && h.checking == Checking::No) {
                (h.checking, h.checking_since) = (Checking::Rid, now);
                out.push(Check { zone, rid: h.grant.rid });
            }
        }
        out
    }

    /// Redis answered a check of `key` (`None`: it did not): a reservation still of the key's
    /// life is spent again, one of an older life dropped without a give-back (Redis no longer
    /// counts its units). An answer about another reservation (one replaced since) is ignored.
    /// Returns whether the key's tracking is to be renewed for the check again that a change
    /// heard meanwhile asks for.
    pub fn checked(&mut self, key: &[u8], c: Check, present: Option<bool>, now: u64) -> bool {
        self.slot(c.zone, &[key]);
        let Some(e) = self.map.get_mut(self.scratch.as_slice()) else { return false };
        let Some(h) = e.held.as_mut().filter(|h| h.grant.rid == c.rid) else { return false };
        if h.checking != Checking::Rid {
            return false;
        }
        match present {
            Some(true) => {
                (h.suspect, h.unverified) = (false, false);
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
    pub fn suspect_all(&mut self, now: u64, mut track: impl FnMut(&[u8]) -> bool) {
        for (k, e) in self.map.iter_mut() {
            let Some(h) = e.held.as_mut() else { continue };
            if h.checking != Checking::No {
                h.recheck = true;
            } else if track(&k[ZONE_LEN..]) {
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
    pub fn verify_unverified(&mut self, now: u64, mut track: impl FnMut(&[u8]) -> bool) {
        if !self.unverified || now < self.verify_at {
            return;
        }
        self.verify_at = now + RECHECK_MS;
        let mut left = false;
        for (k, e) in self.map.iter_mut() {
            let Some(h) = e.held.as_mut().filter(|h| h.unverified && h.checking == Checking::No)
            else {
                continue;
            };
            if track(&k[ZONE_LEN..]) {
                (h.checking, h.checking_since) = (Checking::Tracking, now);
            } else {
                left = true;
            }
        }
        self.unverified = left;
    }
}

fn held(
    grant: Grant,
    margin: u64,
    figures: Figures,
    remaining: u64,
    started: u64,
    reset_ms: u64,
) -> Held {
    Held {
        grant,
        spent: 0,
        until: started + grant.life_ms.saturating_sub(margin),
        figures,
        remaining,
        reset_at: started + reset_ms,
        suspect: false,
        unverified: false,
        checking: Checking::No,
        checking_since: 0,
        recheck: false,
    }
}

#[cfg(test)]
impl Leases {
    fn held_mut(&mut self, key: &[u8]) -> Option<&mut Held> {
        self.slot(0, &[key]);
        self.map.get_mut(self.scratch.as_slice())?.held.as_mut()
    }
}

const ZONE_LEN: usize = core::mem::size_of::<usize>();

fn zone_of(slot: &[u8]) -> usize {
    let mut b = [0u8; ZONE_LEN];
    b.copy_from_slice(&slot[..ZONE_LEN]);
    usize::from_ne_bytes(b)
}

fn flat_key(slot: &[u8]) -> Vec<u8> {
    slot[ZONE_LEN..].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: Figures = Figures { limit: 100, window_ms: 60_000 };

    fn ask(key: &[u8], cost: u64) -> Ask<'_> {
        Ask { zone: 0, key: [b"rl:", b"api", b":", key], cost, figures: F }
    }

    fn grant(units: u64) -> Grant {
        Grant { units, life_ms: 1000, token: 500, rid: 7 }
    }

    #[test]
    fn life_is_lease_time_at_most_a_quarter_of_the_window() {
        let c = LeaseConf { size: LeaseSize::Auto, time_ms: 1000 };
        assert_eq!(c.life_ms(60_000), 1000);
        assert_eq!(c.life_ms(2000), 500);
        assert_eq!(margin_ms(1000), 20);
        assert_eq!(margin_ms(100), 10);
    }

    #[test]
    fn auto_asks_nothing_for_a_key_seen_once_then_what_it_took_over_a_life() {
        let mut l = Leases::new(10);
        let a = ask(b"k", 1);
        for t in 0..4 {
            assert_eq!(l.want(&a, LeaseSize::Auto, 1000, false, t), 0, "seen {t}");
        }
        assert_eq!(l.want(&a, LeaseSize::Auto, 1000, false, 10), 4);
        // While that is asked for, the key's other requests are decided exactly.
        for t in 11..40 {
            assert_eq!(l.want(&a, LeaseSize::Auto, 1000, false, t), 0);
        }
        l.answered(&a);
        assert_eq!(l.want(&a, LeaseSize::Auto, 1000, false, 50), 34);
        // Unanswered for a whole life: asked again. The next life asks for what the last took.
        assert_eq!(l.want(&a, LeaseSize::Auto, 1000, false, 1100), 35);
        // Never more than the limit; a key quiet for two lives starts over.
        assert_eq!(l.want(&a, LeaseSize::Auto, 1000, false, 5000), 0);
        let big = Ask { cost: 500, ..ask(b"k", 500) };
        assert_eq!(l.want(&big, LeaseSize::Auto, 1000, false, 5001), 0);
        assert_eq!(l.want(&big, LeaseSize::Auto, 1000, false, 5002), 100);
        l.answered(&a);
        assert_eq!(l.want(&a, LeaseSize::Fixed(7), 1000, false, 5003), 7);
    }

    #[test]
    fn spends_locally_until_spent_or_expired_with_the_margin() {
        let mut l = Leases::new(10);
        let a = ask(b"k", 2);
        assert_eq!(l.try_spend(&[ask(b"k", 1)], 0), None);
        assert_eq!(l.granted(&a, grant(5), 100, 40, 3000, false), None);
        assert_eq!(l.try_spend(&[ask(b"k", 2)], 150), Some((0, 43, 2950)));
        assert_eq!(l.try_spend(&[ask(b"k", 2)], 200), Some((0, 41, 2900)));
        // One left: a request of two goes to Redis, one of one spends it.
        assert_eq!(l.try_spend(&[ask(b"k", 2)], 200), None);
        assert_eq!(l.try_spend(&[ask(b"k", 1)], 200), Some((0, 40, 2900)));
        assert_eq!(l.try_spend(&[ask(b"k", 1)], 200), None);
        // Expiry: life 1000 from the start at 100, less a 20 ms margin.
        l.granted(&a, grant(5), 1000, 40, 0, false);
        assert!(l.try_spend(&[ask(b"k", 1)], 1979).is_some());
        assert_eq!(l.try_spend(&[ask(b"k", 1)], 1980), None);
    }

    #[test]
    fn a_request_spends_from_every_zone_or_from_none() {
        let mut l = Leases::new(10);
        let b = Ask { zone: 1, ..ask(b"k", 1) };
        l.granted(&ask(b"k", 1), grant(3), 0, 0, 0, false);
        assert_eq!(l.try_spend(&[ask(b"k", 1), Ask { zone: 1, ..ask(b"k", 1) }], 10), None);
        l.granted(&b, grant(1), 0, 0, 0, false);
        // Zone 1 has the least left: it describes the request.
        assert_eq!(
            l.try_spend(&[ask(b"k", 1), Ask { zone: 1, ..ask(b"k", 1) }], 10),
            Some((1, 0, 0))
        );
        // Zone 1 is spent: zone 0 keeps its two.
        assert_eq!(l.try_spend(&[ask(b"k", 1), Ask { zone: 1, ..ask(b"k", 1) }], 10), None);
        assert_eq!(l.drain().iter().map(|g| g.units).sum::<u64>(), 2);
    }

    #[test]
    fn other_figures_are_not_served_from_a_reservation() {
        let mut l = Leases::new(10);
        l.granted(&ask(b"k", 1), grant(3), 0, 0, 0, false);
        let other = Ask { figures: Figures { limit: 50, window_ms: 60_000 }, ..ask(b"k", 1) };
        assert_eq!(l.try_spend(&[other], 10), None);
    }

    #[test]
    fn what_is_left_goes_back_at_expiry_replacement_and_drain() {
        let mut l = Leases::new(10);
        let a = ask(b"k", 1);
        l.granted(&a, grant(5), 0, 0, 0, true);
        l.try_spend(&[ask(b"k", 1)], 10).unwrap();
        l.try_spend(&[ask(b"k", 1)], 10).unwrap();
        assert_eq!(l.sweep(500, 500), vec![]);
        let back = l.sweep(980, 500);
        // The log names the unspent members: the token plus the two spent.
        assert_eq!(
            back,
            vec![GiveBack {
                zone: 0,
                key: b"rl:api:k".to_vec(),
                units: 3,
                token: 502,
                rid: 7,
                limit: 100,
                window_ms: 60_000
            }]
        );
        assert_eq!(l.sweep(990, 500), vec![]);
        l.granted(&a, grant(4), 1000, 0, 0, false);
        let old = l.granted(&a, grant(4), 1100, 0, 0, false).unwrap();
        assert_eq!((old.units, old.token), (4, 500));
        assert_eq!(l.drain().len(), 1);
        assert!(l.is_empty());
    }

    const KEY: &[u8] = b"rl:api:k";

    fn check_of(l: &mut Leases, gone: bool) -> Check {
        let c = l.checks(3, KEY, gone, 0);
        assert_eq!(c.len(), 1);
        c[0]
    }

    #[test]
    fn a_change_is_checked_by_rid_and_stops_the_spending_unless_it_is_most_likely_our_own() {
        let mut l = Leases::new(10);
        l.granted(&ask(b"k", 1), grant(5), 0, 0, 0, false);
        assert!(l.changed(3, KEY, 0), "the key's tracking to renew");
        assert_eq!(l.try_spend(&[ask(b"k", 1)], 10), None, "someone else's change: stopped");
        let c = check_of(&mut l, false);
        assert_eq!((c.zone, c.rid), (0, 7));
        assert!(l.checks(3, KEY, false, 0).is_empty(), "one check at a time");
        // Still of the key's life.
        assert!(!l.checked(KEY, c, Some(true), 0));
        assert!(l.try_spend(&[ask(b"k", 1)], 10).is_some());
        // Redis answered this worker's own decision of the key: its write is the change told of.
        l.answered(&ask(b"k", 5));
        assert!(l.changed(3, KEY, 10));
        assert!(l.try_spend(&[ask(b"k", 1)], 10).is_some(), "spent during that check");
        let c = check_of(&mut l, false);
        // Of an older life (a reset, whoever re-created the key since): dropped, nothing back.
        assert!(!l.checked(KEY, c, Some(false), 0));
        assert_eq!(l.try_spend(&[ask(b"k", 1)], 10), None);
        assert_eq!(l.drain(), vec![]);
    }

    #[test]
    fn a_key_found_gone_stops_the_spending_until_the_check_answers() {
        let mut l = Leases::new(10);
        l.granted(&ask(b"k", 1), grant(5), 0, 0, 0, false);
        l.changed(3, KEY, 0);
        let c = check_of(&mut l, true);
        assert_eq!(l.try_spend(&[ask(b"k", 1)], 10), None);
        // Granted since the reset (a stale "gone"): its rid says so, and it is spent again.
        assert!(!l.checked(KEY, c, Some(true), 0));
        assert!(l.try_spend(&[ask(b"k", 1)], 10).is_some());
        // Found gone by another's EXISTS, no check on its way: checked too.
        let c = check_of(&mut l, true);
        assert_eq!(l.try_spend(&[ask(b"k", 1)], 10), None);
        assert!(!l.checked(KEY, c, Some(false), 0));
        assert_eq!(l.drain(), vec![]);
    }

    #[test]
    fn a_change_heard_during_a_check_is_checked_after_it() {
        let mut l = Leases::new(10);
        l.granted(&ask(b"k", 1), grant(5), 0, 0, 0, false);
        l.changed(3, KEY, 0);
        let first = check_of(&mut l, false);
        assert!(!l.changed(3, KEY, 0), "not a second check at once");
        assert!(l.checked(KEY, first, Some(true), 0), "checked again: the tracking to renew");
        let again = check_of(&mut l, false);
        assert!(!l.checked(KEY, again, Some(false), 0), "that check finds a reset");
        assert_eq!(l.try_spend(&[ask(b"k", 1)], 10), None);
    }

    #[test]
    fn an_answer_about_an_older_grant_touches_neither_a_newer_grant_nor_its_check() {
        let mut l = Leases::new(10);
        l.granted(&ask(b"k", 1), grant(5), 0, 0, 0, false);
        l.changed(3, KEY, 0);
        let old = check_of(&mut l, true);
        // The key's reset is answered late: meanwhile its next life granted another.
        l.held_mut(KEY).unwrap().spent = 5;
        l.granted(&ask(b"k", 1), Grant { rid: 8, ..grant(5) }, 20, 0, 0, false);
        assert!(!l.checked(KEY, old, Some(false), 0));
        assert!(l.try_spend(&[ask(b"k", 1)], 30).is_some(), "the new life's grant stands");
        // No answer (Redis silent): spent while Redis cannot be asked, checked again later.
        l.changed(3, KEY, 0);
        let c = check_of(&mut l, true);
        assert!(!l.checked(KEY, c, None, 0));
        assert!(l.try_spend(&[ask(b"k", 1)], 30).is_some());
        assert_eq!(
            l.sweep(1000, 500).iter().map(|g| (g.units, g.rid)).collect::<Vec<_>>(),
            [(3, 8)]
        );
    }

    #[test]
    fn a_check_redis_does_not_answer_in_time_is_given_up_and_tried_again() {
        let mut l = Leases::new(10);
        l.granted(&ask(b"k", 1), grant(5), 0, 0, 0, false);
        assert!(l.changed(3, KEY, 100));
        let _ = l.checks(3, KEY, true, 100);
        assert_eq!(l.try_spend(&[ask(b"k", 1)], 200), None);
        // The check unanswered for the whole timeout (300 ms): Redis is silent.
        assert_eq!(l.sweep(399, 300), vec![]);
        assert_eq!(l.try_spend(&[ask(b"k", 1)], 399), None);
        assert_eq!(l.sweep(400, 300), vec![]);
        assert!(l.try_spend(&[ask(b"k", 1)], 400).is_some(), "spent while Redis is silent");
        // Tried again, spent meanwhile; at most once a second.
        let mut tracked = 0;
        l.verify_unverified(400, |_| {
            tracked += 1;
            true
        });
        l.verify_unverified(900, |_| panic!("not within a second"));
        assert_eq!(tracked, 1);
        assert!(l.try_spend(&[ask(b"k", 1)], 450).is_some(), "a check in the background");
        let c = check_of(&mut l, false);
        assert!(!l.checked(KEY, c, Some(false), 460), "Redis back: the reservation was reset");
        assert_eq!(l.try_spend(&[ask(b"k", 1)], 470), None);
    }

    #[test]
    fn lost_tracking_keeps_reservations_spendable_until_they_can_be_checked() {
        let mut l = Leases::new(10);
        l.granted(&ask(b"k", 1), grant(5), 0, 0, 0, false);
        l.unverify_all();
        assert!(l.try_spend(&[ask(b"k", 1)], 10).is_some(), "Redis away: what it counted is spent");
        l.verify_unverified(0, |_| false);
        assert!(l.try_spend(&[ask(b"k", 1)], 10).is_some(), "still no tracking");
        let mut tracked = Vec::new();
        l.verify_unverified(1000, |k| {
            tracked.push(k.to_vec());
            true
        });
        assert_eq!(tracked, [KEY.to_vec()]);
        assert!(l.try_spend(&[ask(b"k", 1)], 10).is_some(), "tracked again: checked meanwhile");
        let c = check_of(&mut l, false);
        assert!(!l.checked(KEY, c, Some(true), 0));
        assert!(l.try_spend(&[ask(b"k", 1)], 10).is_some());
        l.verify_unverified(5000, |_| panic!("nothing left to check"));
    }

    #[test]
    fn a_held_reservation_is_not_replaced_and_an_expired_one_goes_back_before_the_next_ask() {
        let mut l = Leases::new(10);
        let a = ask(b"k", 1);
        for t in 0..5 {
            l.want(&a, LeaseSize::Auto, 1000, false, t);
        }
        l.granted(&a, grant(5), 0, 0, 0, false);
        l.changed(3, KEY, 0);
        let _ = l.checks(3, KEY, true, 0);
        // Not spent (its key was found gone): decided exactly, asking for nothing (a gcra
        // reservation replaced by another cannot be given back).
        assert_eq!(l.want(&a, LeaseSize::Fixed(9), 1000, false, 10), 0);
        assert!(l.take_back().is_empty());
        // Over: given back ahead of the ask for the next one.
        assert_eq!(l.want(&a, LeaseSize::Fixed(9), 1000, false, 980), 9);
        assert_eq!(l.take_back().iter().map(|g| g.units).collect::<Vec<_>>(), [5]);
        assert!(l.take_back().is_empty());
        assert_eq!(l.sweep(990, 500), vec![], "not twice");
    }

    #[test]
    fn the_table_is_bounded_and_new_keys_beyond_it_are_exact() {
        let mut l = Leases::new(2);
        l.want(&ask(b"a", 1), LeaseSize::Auto, 1000, false, 0);
        l.want(&ask(b"b", 1), LeaseSize::Auto, 1000, false, 0);
        assert_eq!(l.want(&ask(b"c", 1), LeaseSize::Fixed(9), 1000, false, 0), 0);
        // A grant for a key that found no room goes straight back.
        let back = l.granted(&ask(b"c", 1), grant(5), 0, 0, 0, false).unwrap();
        assert_eq!(back.units, 5);
        assert_eq!(l.len(), 2);
        // Idle keys leave after two lives, making room, swept every 100 ms as the timer does.
        for t in (100..2000).step_by(100) {
            assert_eq!(l.sweep(t, 500), vec![]);
            assert_eq!(l.len(), 2, "at {t}");
        }
        assert_eq!(l.sweep(2000, 500), vec![]);
        assert!(l.is_empty());
    }
}

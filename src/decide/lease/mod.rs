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

use std::collections::hash_map::Entry as Slot;

use crate::decide::key_buf::KeyBuf;
use crate::decide::table_key::{stored_key, stored_zone, ByHash, TableKey};

#[cfg(test)]
mod tests;
mod verify;

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
/// A change Redis tells of within this long of this worker's own decision for the key is taken
/// for that decision's write. Redis sends both at once; a change heard later is someone else's
/// (a reset, perhaps): the decision may have written while the key was not tracked, so that
/// no change of its own is ever told of.
const OWN_WRITE_MS: u64 = 100;

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
    pub key: KeyBuf,
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
    /// has answered ...
    recheck: bool,
    /// ... and that change was not this worker's own (a reset, perhaps): not spent until the
    /// check after it answers, whatever the one on its way says.
    recheck_suspect: bool,
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
        self.recheck_suspect = false;
    }

    fn give_back(&self, zone: usize, key: &[u8], algorithm_is_log: bool) -> Option<GiveBack> {
        (self.left() > 0).then(|| GiveBack {
            zone,
            key: KeyBuf::of(&[key]),
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
#[derive(Debug, Clone)]
struct Entry {
    /// `TableKey::stored`: the zone and the whole Redis key.
    key: Box<[u8]>,
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
    /// When Redis answered a decision of this worker for the key, which wrote it, since the
    /// key's tracking was renewed: the next change told of soon after is most likely that write.
    wrote: Option<u64>,
}

impl Entry {
    fn new(key: &TableKey<'_>, now: u64, interval: u64, log: bool) -> Self {
        Entry {
            key: key.stored(),
            held: None,
            from: now,
            interval,
            now_units: 0,
            last_units: 0,
            log,
            asking_until: 0,
            touched: now,
            wrote: None,
        }
    }

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
#[derive(Clone, Copy)]
pub struct Ask<'a> {
    /// The zone and the whole Redis key, hashed once per request.
    pub key: TableKey<'a>,
    pub cost: u64,
    pub figures: Figures,
}

/// A bounded table of (zone, key) → reservation and demand, per worker. Keys beyond the bound
/// are decided exactly: nothing is evicted, so no reservation is dropped to make room.
pub struct Leases {
    /// By the key's hash (keyed SipHash, `crate::decide::table_key`); the entry holds the key.
    map: ByHash<Entry>,
    capacity: usize,
    /// Expired reservations met by [`Leases::want`], to give back before the decision that asks
    /// for the next one: in the same call, ahead of it, a `gcra` give-back still finds the TAT
    /// it left.
    back: Vec<GiveBack>,
    /// Some reservation is `unverified`, to be checked from `verify_at` on.
    unverified: bool,
    verify_at: u64,
    /// How far behind the real time the worker's clock may be beyond an iteration: nginx's
    /// `timer_resolution`, which updates the cached clock only when its timer fires, so a unit
    /// read as spent in time could be spent that much after Redis's end of it.
    lag_ms: u64,
}

impl Leases {
    pub fn new(capacity: usize, lag_ms: u64) -> Self {
        Leases {
            map: ByHash::default(),
            capacity: capacity.max(1),
            lag_ms,
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

    fn entry(&mut self, key: &TableKey<'_>) -> Option<&mut Entry> {
        self.map.get_mut(&key.hash).filter(|e| key.is(&e.key))
    }

    /// Spends `cost` units of each zone's reservation if every zone has them, and nothing
    /// otherwise (a request is admitted by all its zones or goes to Redis). Returns the zone
    /// with the least left, as after a Redis decision: its index, remaining units and reset in
    /// ms, for the headers. Each key is looked up once: its units are spent as it is found, and
    /// given back if a later zone cannot admit the request (which then goes to Redis, a round
    /// trip that dwarfs the second lookup). `asks` is an iterator the caller need not collect.
    pub fn try_spend<'k>(
        &mut self,
        asks: impl IntoIterator<Item = Ask<'k>, IntoIter: Clone>,
        now: u64,
    ) -> Option<(usize, u64, u64)> {
        let asks = asks.into_iter();
        let mut out: Option<(usize, u64, u64)> = None;
        let mut used_up = false;
        for (i, a) in asks.clone().enumerate() {
            let spendable = |h: &&mut Held| {
                h.left() >= a.cost && now < h.until && h.figures == a.figures && !h.suspect
            };
            let Some(e) = self.entry(&a.key) else { return self.unspend(asks.take(i)) };
            let Some(h) = e.held.as_mut().filter(spendable) else {
                return self.unspend(asks.take(i));
            };
            h.spent += a.cost;
            let remaining = h.remaining + h.left();
            if out.is_none_or(|(_, least, _)| remaining < least) {
                out = Some((i, remaining, h.reset_at.saturating_sub(now)));
            }
            used_up |= h.left() == 0;
            // What the exact path's `want` does to the key as well, were the request not
            // admitted here.
            e.roll(now);
            e.now_units += a.cost;
            e.touched = now;
        }
        if used_up {
            // Let go once the request is admitted (a zone after it could have given its units
            // back), so that the key's next request asks for another.
            for a in asks {
                if let Some(e) =
                    self.entry(&a.key).filter(|e| e.held.is_some_and(|h| h.left() == 0))
                {
                    e.held = None;
                }
            }
        }
        out
    }

    /// The units `try_spend` took for `asks`, the zones before the one that could not admit
    /// the request, back in their reservations; always `None`, `try_spend`'s answer then.
    fn unspend<'k>(&mut self, asks: impl Iterator<Item = Ask<'k>>) -> Option<(usize, u64, u64)> {
        for a in asks {
            // Found and spent a moment ago, with nothing changed in between.
            if let Some(e) = self.entry(&a.key) {
                e.now_units -= a.cost;
                e.held.iter_mut().for_each(|h| h.spent -= a.cost);
            }
        }
        None
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
        let e = match self.map.entry(ask.key.hash) {
            Slot::Occupied(o) if ask.key.is(&o.get().key) => o.into_mut(),
            // Another key with the same hash has the place: this one is decided exactly.
            Slot::Occupied(_) => return 0,
            Slot::Vacant(_) if full => return 0,
            Slot::Vacant(v) => v.insert(Entry::new(&ask.key, now, interval, log)),
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
            self.back.extend(h.give_back(ask.key.zone, stored_key(&e.key), log));
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

    /// Redis answered a decision of this zone's key (granted or not) at `now`: the next request
    /// may ask again, and the change Redis tells of next, if soon, is most likely this
    /// decision's write.
    pub fn answered(&mut self, ask: &Ask<'_>, now: u64) {
        if let Some(e) = self.entry(&ask.key) {
            (e.asking_until, e.wrote) = (0, Some(now));
        }
    }

    /// Installs what Redis granted for a request started at `started` (monotonic ms), with the
    /// zone's remaining (the grant excluded) and reset. A reservation still held for the key is
    /// replaced, and returned for giving back. `tracked`: the key's tracking was just renewed,
    /// after the decision's write.
    #[allow(clippy::too_many_arguments)]
    pub fn granted(
        &mut self,
        ask: &Ask<'_>,
        grant: Grant,
        started: u64,
        remaining: u64,
        reset_ms: u64,
        log: bool,
        tracked: bool,
    ) -> Option<GiveBack> {
        let margin = margin_ms(grant.life_ms) + self.lag_ms;
        if grant.units == 0 || grant.life_ms <= margin {
            return None;
        }
        let full = self.map.len() >= self.capacity;
        let e = match self.map.entry(ask.key.hash) {
            Slot::Occupied(o) if ask.key.is(&o.get().key) => o.into_mut(),
            Slot::Vacant(v) if !full => v.insert(Entry::new(&ask.key, started, grant.life_ms, log)),
            // Not kept (the table is full, or another key with the same hash has the place):
            // given back at once.
            _ => {
                let held = held(grant, 0, ask.figures, remaining, started, reset_ms);
                return held.give_back(ask.key.zone, &ask.key.key(), log);
            }
        };
        let mut new = held(grant, margin, ask.figures, remaining, started, reset_ms);
        if tracked {
            // Nothing tells of a reset between the decision's write and the renewal of the
            // key's tracking (no longer tracked after the write, or not yet): the reservation
            // is checked by rid once the renewal answers, and spent on meanwhile, as after a
            // write of this worker's own.
            (new.checking, new.checking_since) = (Checking::Tracking, started);
        }
        // A change told of from now on is not taken for this decision's write: one within
        // `OWN_WRITE_MS` of the grant would pass for it, a reset right after it too.
        (e.asking_until, e.wrote) = (0, None);
        let old = e.held.replace(new);
        old.and_then(|h| h.give_back(ask.key.zone, stored_key(&e.key), log))
    }

    /// Reservations whose time is up give back what is left, into `out`; checks Redis has not
    /// answered within `timeout_ms` are given up (the reservation `unverified`); keys idle for
    /// two lives are forgotten.
    pub fn sweep(&mut self, now: u64, timeout_ms: u64, out: &mut Vec<GiveBack>) {
        let mut unverified = false;
        self.map.retain(|_, e| {
            if let Some(h) = e.held.filter(|h| now >= h.until) {
                out.extend(h.give_back(stored_zone(&e.key), stored_key(&e.key), e.log));
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
    }

    /// Every reservation's unspent units, the table emptied: at worker exit and reload.
    pub fn drain(&mut self) -> Vec<GiveBack> {
        let out = self
            .map
            .values()
            .filter_map(|e| {
                e.held.and_then(|h| h.give_back(stored_zone(&e.key), stored_key(&e.key), e.log))
            })
            .collect();
        self.map.clear();
        out
    }

    /// The give-backs [`Leases::want`] set aside, to send before the decision (the list keeps
    /// its room).
    pub fn take_back(&mut self) -> std::vec::Drain<'_, GiveBack> {
        self.back.drain(..)
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
        recheck_suspect: false,
    }
}

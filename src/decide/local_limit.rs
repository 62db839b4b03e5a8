//! `ratelimit_fail local`: while Redis cannot decide, each worker enforces every zone by itself
//! at its share of the limit, with a sliding-window counter per key (two fixed windows, the
//! previous one weighted by how much of it the rolling window still covers), and a concurrency
//! zone from its own requests in flight. Approximate and per worker by design; bounded in
//! memory. A window after a key's last admission nothing of it counts, as in any rolling window,
//! so no rejection lasts longer than the window, as none through Redis does. Pure, so the
//! arithmetic has unit tests.

use crate::decide::lease::Grant;
use crate::decide::script::ZoneVerdict;
use crate::decide::table_key::ByHash;

/// One rate zone of a local decision.
#[derive(Debug, Clone, Copy)]
pub struct LocalZone {
    /// The (zone, key) as the worker's tables find it: [`crate::decide::table_key::TableKey`]'s
    /// hash, a fixed 8 bytes whatever the key's length, so the memory bound is in bytes, not in
    /// entries of the clients' choosing. Keyed with the process's seed, so no client can aim two
    /// keys at one counter; two keys that did share one would share its count, which only
    /// rejects sooner, never admits more.
    pub hash: u64,
    /// The worker's share of the zone's limit, at least 1.
    pub limit: u64,
    pub window_ms: u64,
    pub cost: u64,
}

/// One zone of a request decided locally, in the location's order.
#[derive(Debug, Clone, Copy)]
pub enum LocalPart {
    /// A rate zone, decided by the counters.
    Rate(LocalZone),
    /// A concurrency zone: this worker's requests of the key in flight, and its share of the
    /// limit.
    Concurrency { in_flight: u64, limit: u64 },
}

#[derive(Debug, Clone, Copy, Default)]
struct Counter {
    window: u64,
    /// The window length it was last written with: liveness is per zone.
    window_ms: u64,
    /// Counts of at most a limit (10^9), so that `last_ms` costs the entry no byte.
    cur: u32,
    prev: u32,
    /// When the last unit was taken: every unit counted was taken by then.
    last_ms: u64,
}

impl Counter {
    /// The counts as seen at `now_ms` in window `idx` of `window_ms`.
    fn at(self, idx: u64, window_ms: u64, now_ms: u64) -> (u64, u64) {
        if now_ms >= self.last_ms + window_ms {
            return (0, 0);
        }
        match idx.checked_sub(self.window) {
            Some(0) => (self.cur.into(), self.prev.into()),
            Some(1) => (0, self.cur.into()),
            _ => (0, 0),
        }
    }

    /// Whether the counter still weighs on a decision at `now_ms`.
    fn live(self, now_ms: u64) -> bool {
        self.window + 1 >= now_ms / self.window_ms && now_ms < self.last_ms + self.window_ms
    }
}

/// How often a full table looks for counters that no longer count: sweeping is O(entries), and a
/// flood of new keys against a table full of live ones must not pay it per request.
const SWEEP_EVERY_MS: u64 = 1000;

pub struct LocalLimiter {
    counters: ByHash<Counter>,
    /// The table's size, reserved on its first counter: a location of concurrency zones only
    /// never needs it.
    reserve: usize,
    capacity: usize,
    last_sweep_ms: Option<u64>,
}

/// What one counter costs in the table: its hash and counter, and the table's control byte.
const ENTRY_BYTES: usize = size_of::<(u64, Counter)>() + 1;

impl LocalLimiter {
    /// A table that never takes more than `bytes` (beyond a few hundred bytes of fixed cost).
    /// The std table allocates a power of two of buckets and fills at most 7/8 of them; the
    /// largest such table within `bytes` is allocated once. It never grows as long as at most
    /// half of that is used: removals leave tombstones, and a full table with tombstones is
    /// rehashed in place only while half full, otherwise doubled.
    pub fn with_memory(bytes: usize) -> Self {
        let buckets = 1usize << (bytes / ENTRY_BYTES).max(16).ilog2();
        let (reserve, capacity) = (buckets / 8 * 7, buckets / 16 * 7);
        LocalLimiter { counters: ByHash::default(), reserve, capacity, last_sweep_ms: None }
    }

    /// Decides a request over `parts` at monotonic time `now_ms`, all or nothing, with the same
    /// verdicts a Redis decision has (`reset_ms` of a rejecting zone: when the cost would fit):
    /// admitted when every concurrency zone has room for one more of this worker's requests and
    /// the counters admit the rate zones (not asked, and not charged, when a concurrency zone
    /// has no room, as with Redis). Writes a verdict per part into `out`, in order, and says
    /// whether the request is admitted. `None` when the table is full of live counters and a
    /// rate zone's key is new: forgetting a live counter would hand its key a fresh budget, so
    /// the new key cannot be tracked.
    pub fn decide(
        &mut self,
        parts: impl Iterator<Item = LocalPart> + Clone,
        now_ms: u64,
        out: &mut Vec<ZoneVerdict>,
    ) -> Option<bool> {
        let room = parts.clone().all(|p| match p {
            LocalPart::Concurrency { in_flight, limit } => in_flight < limit,
            LocalPart::Rate(_) => true,
        });
        let ok =
            |remaining| ZoneVerdict { ok: true, remaining, reset_ms: 0, grant: Grant::default() };
        // Every rate zone's verdict before any is charged, as one Redis decision reads them; the
        // keys without a counter are counted on the way, one lookup each.
        let mut new = 0;
        out.clear();
        out.extend(parts.clone().map(|p| match p {
            LocalPart::Rate(z) if room => {
                let counter = self.counters.get(&z.hash).copied();
                new += usize::from(counter.is_none() && z.cost > 0);
                verdict(counter, &z, now_ms)
            }
            LocalPart::Rate(z) => ok(z.limit),
            // Written below, once the request's fate is known.
            LocalPart::Concurrency { .. } => ok(0),
        }));
        let allowed = room && out.iter().all(|v| v.ok);
        if allowed && !self.room_for(new, now_ms) {
            return None;
        }
        for (p, v) in parts.zip(out.iter_mut()) {
            match p {
                LocalPart::Rate(z) if allowed => self.take(&z, v, now_ms),
                LocalPart::Rate(_) => {}
                LocalPart::Concurrency { in_flight, limit } => {
                    *v = ZoneVerdict {
                        ok: in_flight < limit,
                        remaining: limit.saturating_sub(in_flight + u64::from(allowed)),
                        reset_ms: if in_flight < limit { 0 } else { 1000 },
                        grant: Grant::default(),
                    }
                }
            }
        }
        Some(allowed)
    }

    /// Charges an admitted zone its cost, and says so in its verdict, with the reset of its new
    /// count: when the zone admits one more unit than is left (0 when nothing is in use; a
    /// `Remaining: 0` with `Reset: 0` would contradict the `Retry-After` of the rejection that
    /// follows), as Redis' verdicts give it.
    fn take(&mut self, z: &LocalZone, v: &mut ZoneVerdict, now_ms: u64) {
        v.remaining -= z.cost;
        let counter = if z.cost > 0 {
            if self.counters.capacity() == 0 {
                self.counters.reserve(self.reserve);
            }
            let idx = now_ms / z.window_ms;
            let c = self.counters.entry(z.hash).or_default();
            let (cur, prev) = c.at(idx, z.window_ms, now_ms);
            // Admitted, so cur + cost is at most the limit, and so is prev.
            let (cur, prev) = ((cur + z.cost) as u32, prev as u32);
            *c = Counter { window: idx, window_ms: z.window_ms, cur, prev, last_ms: now_ms };
            Some(*c)
        } else {
            self.counters.get(&z.hash).copied()
        };
        if v.remaining < z.limit {
            v.reset_ms =
                verdict(counter, &LocalZone { cost: v.remaining + 1, ..*z }, now_ms).reset_ms;
        }
    }

    /// Whether `new` more counters fit, after dropping those that no longer count if the table
    /// is full (at most once per `SWEEP_EVERY_MS`).
    fn room_for(&mut self, new: usize, now_ms: u64) -> bool {
        if self.counters.len() + new <= self.capacity {
            return true;
        }
        if self.last_sweep_ms.is_some_and(|t| now_ms < t + SWEEP_EVERY_MS) {
            return false;
        }
        self.last_sweep_ms = Some(now_ms);
        self.counters.retain(|_, c| c.live(now_ms));
        self.counters.len() + new <= self.capacity
    }
}

/// A rate zone's verdict at `now_ms` from its key's counter (`None`: the key has none):
/// `reset_ms` of a rejecting zone is when the cost would fit.
fn verdict(counter: Option<Counter>, z: &LocalZone, now_ms: u64) -> ZoneVerdict {
    let (w, idx, elapsed) = (z.window_ms, now_ms / z.window_ms, now_ms % z.window_ms);
    let (cur, prev) = counter.map_or((0, 0), |c| c.at(idx, w, now_ms));
    // Scaled by the window so that the weighting stays in integers.
    let used = prev as u128 * (w - elapsed) as u128 + cur as u128 * w as u128;
    let room = (z.limit as u128 * w as u128).saturating_sub(used);
    let remaining = (room / w as u128) as u64;
    if remaining >= z.cost {
        return ZoneVerdict { ok: true, remaining, reset_ms: 0, grant: Grant::default() };
    }
    // When will prev * (w - e) + cur * w <= (limit - cost) * w hold, if nothing else comes?
    let target = (z.limit - z.cost.min(z.limit)) as u128 * w as u128;
    let retry_ms = if cur as u128 * w as u128 <= target {
        // Within this window, as the previous one's weight falls (prev > 0 here).
        let e = w as u128 - (target - cur as u128 * w as u128) / prev.max(1) as u128;
        (e as u64).saturating_sub(elapsed).max(1)
    } else {
        // In the next window the current count is the weighted one.
        let e = w as u128 - (target / cur.max(1) as u128).min(w as u128);
        w - elapsed + e as u64
    };
    // A window after the last unit was taken, none of them counts (`Counter::at`).
    let retry_ms = counter.map_or(retry_ms, |c| retry_ms.min(c.last_ms + w - now_ms));
    ZoneVerdict { ok: false, remaining, reset_ms: retry_ms, grant: Grant::default() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::script::Decision;
    use crate::decide::table_key::TableKey;

    impl LocalLimiter {
        fn decide_rates(&mut self, zones: &[LocalZone], now_ms: u64) -> Option<Decision> {
            self.decide_parts(
                &zones.iter().map(|&z| LocalPart::Rate(z)).collect::<Vec<_>>(),
                now_ms,
            )
        }

        fn decide_parts(&mut self, parts: &[LocalPart], now_ms: u64) -> Option<Decision> {
            let mut zones = Vec::new();
            let allowed = self.decide(parts.iter().copied(), now_ms, &mut zones)?;
            Some(Decision { allowed, wait_ms: 0, zones })
        }

        fn d(&mut self, zones: &[LocalZone], now_ms: u64) -> Decision {
            self.decide_rates(zones, now_ms).expect("room for the key")
        }
    }

    fn hashed(zone: usize, key: &[u8]) -> u64 {
        TableKey::new(zone, &[key]).hash
    }

    fn zone(key: &[u8], limit: u64) -> LocalZone {
        LocalZone { hash: hashed(0, key), limit, window_ms: 1000, cost: 1 }
    }

    #[test]
    fn admits_the_share_then_rejects_until_it_frees() {
        let mut l = LocalLimiter::with_memory(100 * ENTRY_BYTES);
        let z = [zone(b"a", 3)];
        // Each admission's reset: when one more unit than its remaining frees. 3 - left in
        // window 0; in window 1 they weigh (3 - left) * (1000 - e) / 1000 <= 2 - left once
        // e >= 334 (left 0), 500 (left 1), 1000 (left 2: the next window's end).
        // Yet a window after the last admission, at 1100, none counts: no reset is later.
        for (left, reset_ms) in [(2, 1000), (1, 1000), (0, 1000)] {
            let d = l.d(&z, 100);
            assert!(d.allowed);
            assert_eq!(
                d.zones,
                vec![ZoneVerdict { ok: true, remaining: left, reset_ms, grant: Grant::default() }]
            );
        }
        let v = l.d(&z, 200).zones[0];
        assert!(!v.ok);
        // The rejection agrees with the last admission's reset, 100 ms later.
        assert_eq!(v.reset_ms, 900);
        assert!(!l.d(&z, 1099).zones[0].ok);
        assert!(l.d(&z, 1100).zones[0].ok);
        // Another key is untouched.
        assert!(l.d(&[zone(b"b", 3)], 1334).zones[0].ok);
    }

    #[test]
    fn never_announces_more_than_the_window() {
        // limit 3 per minute, taken 14 s into a window: the counter alone would weigh them
        // until 20 s into the next one (66 s away); a minute after the last, none counts.
        let mut l = LocalLimiter::with_memory(100 * ENTRY_BYTES);
        let z = [LocalZone { window_ms: 60_000, ..zone(b"a", 3) }];
        for _ in 0..3 {
            let v = l.d(&z, 14_000).zones[0];
            assert!(v.ok && v.reset_ms <= 60_000, "{v:?}");
        }
        let v = l.d(&z, 20_000).zones[0];
        assert!(!v.ok);
        assert_eq!(v.reset_ms, 54_000);
        assert!(!l.d(&z, 73_999).zones[0].ok);
        assert!(l.d(&z, 74_000).zones[0].ok);
    }

    #[test]
    fn all_or_nothing() {
        let mut l = LocalLimiter::with_memory(100 * ENTRY_BYTES);
        let wide = LocalZone { hash: hashed(1, b"a"), ..zone(b"a", 100) };
        let both = [wide, zone(b"a", 1)];
        assert!(l.d(&both, 0).allowed);
        let v = l.d(&both, 1).zones;
        assert!(v[0].ok && !v[1].ok);
        // The rejected request was recorded in neither zone.
        assert_eq!(l.d(&[wide], 2).zones[0].remaining, 98);
    }

    #[test]
    fn concurrency_zones_beside_rates() {
        let mut l = LocalLimiter::with_memory(100 * ENTRY_BYTES);
        let conc = |in_flight| LocalPart::Concurrency { in_flight, limit: 2 };
        let parts = [LocalPart::Rate(zone(b"a", 10)), conc(1)];
        let d = l.decide_parts(&parts, 0).unwrap();
        assert!(d.allowed);
        assert_eq!((d.zones[0].remaining, d.zones[1].remaining), (9, 0), "the 2nd of 2 in flight");
        // Full: rejected without asking the rates, which are not charged.
        let d = l.decide_parts(&[LocalPart::Rate(zone(b"a", 10)), conc(2)], 1).unwrap();
        assert!(!d.allowed);
        assert_eq!((d.zones[1].ok, d.zones[1].reset_ms, d.deciding_zone()), (false, 1000, 1));
        assert_eq!(
            d.zones[0],
            ZoneVerdict { ok: true, remaining: 10, reset_ms: 0, grant: Grant::default() }
        );
        assert_eq!(l.d(&[zone(b"a", 10)], 2).zones[0].remaining, 8, "one charged so far");
        // The rates reject: no slot.
        let d = l.decide_parts(&[LocalPart::Rate(zone(b"a", 2)), conc(0)], 3).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.zones[1].remaining, 2, "not taken");
        // A concurrency zone alone allocates no table.
        let mut alone = LocalLimiter::with_memory(100 * ENTRY_BYTES);
        assert!(alone.decide_parts(&[conc(0)], 0).unwrap().allowed);
        assert_eq!(alone.counters.capacity(), 0);
    }

    #[test]
    fn cost_and_gap() {
        let mut l = LocalLimiter::with_memory(100 * ENTRY_BYTES);
        let z = [LocalZone { cost: 4, ..zone(b"a", 5) }];
        assert_eq!(l.d(&z, 0).zones[0].remaining, 1);
        assert!(!l.d(&z, 10).zones[0].ok);
        // Two windows later nothing counts any more.
        assert_eq!(l.d(&z, 2500).zones[0].remaining, 1);
        let read = [LocalZone { cost: 0, ..zone(b"a", 5) }];
        let fresh = ZoneVerdict { ok: true, remaining: 5, reset_ms: 0, grant: Grant::default() };
        assert_eq!(l.d(&read, 4500).zones[0], fresh, "nothing in use: reset 0");
        assert_eq!(l.d(&z, 4500).zones[0].remaining, 1);
        let v = l.d(&read, 4500).zones[0];
        // 4 in window 4: 2 more fit once 4 * (1000 - e) / 1000 <= 3, at e = 250 of window 5.
        assert_eq!(
            v,
            ZoneVerdict { ok: true, remaining: 1, reset_ms: 500 + 250, grant: Grant::default() }
        );
    }

    #[test]
    fn memory_is_bounded_in_bytes_whatever_the_keys() {
        let mut l = LocalLimiter::with_memory(64 << 10);
        assert_eq!(l.counters.capacity(), 0, "nothing allocated before a counter");
        let long = vec![b'k'; 4000];
        let mut buckets = 0;
        for i in 0..10_000u32 {
            let mut key = long.clone();
            key.extend_from_slice(&i.to_le_bytes());
            let _ = l.decide_rates(&[zone(&key, 5)], u64::from(i) * 1000);
            assert!(l.counters.len() <= l.capacity);
            if i == 0 {
                buckets = l.counters.capacity();
                assert!(buckets * ENTRY_BYTES <= 64 << 10, "{buckets} entries");
                assert_eq!(l.capacity * 2, buckets);
            }
        }
        // Tombstones lower what `capacity` reports; a doubled table would report more.
        assert!(l.counters.capacity() <= buckets, "the table never grew");
    }

    #[test]
    fn a_flood_of_new_keys_never_resets_a_live_one() {
        let mut l = LocalLimiter::with_memory(16 << 10);
        let hour = LocalZone { window_ms: 3_600_000, ..zone(b"victim", 5) };
        for _ in 0..5 {
            assert!(l.d(&[hour], 0).allowed);
        }
        let mut refused = 0;
        for i in 0..10_000u32 {
            let z = LocalZone { hash: hashed(0, &i.to_le_bytes()), ..hour };
            match l.decide_rates(&[z], 1 + u64::from(i)) {
                Some(d) => assert!(d.allowed),
                None => refused += 1,
            }
        }
        assert_eq!(refused, 10_000 - (l.capacity - 1));
        assert!(!l.d(&[hour], 20_000).allowed, "still at its limit within the hour");
        // A key already counted is still decided, and refused new keys took nothing.
        let newcomer = LocalZone { hash: hashed(0, b"newcomer"), cost: 0, ..hour };
        assert!(l.decide_rates(&[newcomer], 20_000).is_some());
    }

    #[test]
    fn dead_counters_make_room_again() {
        let mut l = LocalLimiter::with_memory(16 << 10);
        for i in 0..l.capacity as u32 {
            assert!(l.d(&[zone(&i.to_le_bytes(), 5)], 0).allowed);
        }
        assert!(l.decide_rates(&[zone(b"late", 5)], 10).is_none(), "full of live counters");
        // Two windows later every counter is dead; the sweep runs at most once a second.
        assert!(l.decide_rates(&[zone(b"late", 5)], 500).is_none());
        assert!(l.d(&[zone(b"late", 5)], 2_000).allowed);
        assert_eq!(l.counters.len(), 1);
    }
}

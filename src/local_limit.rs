//! `ratelimit_fail local`: while Redis cannot decide, each worker enforces every zone by itself
//! at its share of the limit, with a sliding-window counter per key (two fixed windows, the
//! previous one weighted by how much of it the rolling window still covers). Approximate and
//! per worker by design; bounded in memory. Pure, so the arithmetic has unit tests.

use std::collections::HashMap;

use crate::script::{Decision, ZoneVerdict};

/// One zone of a local decision.
#[derive(Debug, Clone, Copy)]
pub struct LocalZone<'a> {
    pub zone: usize,
    pub key: &'a [u8],
    /// The worker's share of the zone's limit, at least 1.
    pub limit: u64,
    pub window_ms: u64,
    pub cost: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Counter {
    window: u64,
    cur: u64,
    prev: u64,
}

impl Counter {
    /// The counts as seen from window `idx`.
    fn at(self, idx: u64) -> (u64, u64) {
        match idx.checked_sub(self.window) {
            Some(0) => (self.cur, self.prev),
            Some(1) => (0, self.cur),
            _ => (0, 0),
        }
    }
}

pub struct LocalLimiter {
    counters: HashMap<(usize, Box<[u8]>), Counter>,
    capacity: usize,
}

impl LocalLimiter {
    pub fn new(capacity: usize) -> Self {
        LocalLimiter { counters: HashMap::new(), capacity: capacity.max(1) }
    }

    /// Decides a request over `zones` at monotonic time `now_ms`, all or nothing, with the same
    /// verdicts a Redis decision has (`reset_ms` of a rejecting zone: when the cost would fit).
    pub fn decide(&mut self, zones: &[LocalZone<'_>], now_ms: u64) -> Decision {
        let mut verdicts: Vec<ZoneVerdict> = zones.iter().map(|z| self.check(z, now_ms)).collect();
        let allowed = verdicts.iter().all(|v| v.ok);
        if allowed {
            for (z, v) in zones.iter().zip(&mut verdicts) {
                if z.cost > 0 {
                    self.add(z, now_ms);
                }
                v.remaining -= z.cost;
            }
        }
        Decision { allowed, zones: verdicts }
    }

    fn check(&self, z: &LocalZone<'_>, now_ms: u64) -> ZoneVerdict {
        let (w, idx, elapsed) = (z.window_ms, now_ms / z.window_ms, now_ms % z.window_ms);
        let (cur, prev) =
            self.counters.get(&(z.zone, Box::<[u8]>::from(z.key))).map_or((0, 0), |c| c.at(idx));
        // Scaled by the window so that the weighting stays in integers.
        let used = prev as u128 * (w - elapsed) as u128 + cur as u128 * w as u128;
        let room = (z.limit as u128 * w as u128).saturating_sub(used);
        let remaining = (room / w as u128) as u64;
        if remaining >= z.cost {
            return ZoneVerdict { ok: true, remaining, reset_ms: 0 };
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
        ZoneVerdict { ok: false, remaining, reset_ms: retry_ms }
    }

    fn add(&mut self, z: &LocalZone<'_>, now_ms: u64) {
        let idx = now_ms / z.window_ms;
        let key = (z.zone, Box::<[u8]>::from(z.key));
        if !self.counters.contains_key(&key) && self.counters.len() >= self.capacity {
            // Forget what no longer counts; if every key is live, start over rather than grow:
            // an outage must not let a flood of keys exhaust the worker's memory.
            self.counters.retain(|(_, _), c| c.window + 1 >= idx);
            if self.counters.len() >= self.capacity {
                self.counters.clear();
            }
        }
        let c = self.counters.entry(key).or_default();
        let (cur, prev) = c.at(idx);
        *c = Counter { window: idx, cur: cur + z.cost, prev };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(key: &[u8], limit: u64) -> LocalZone<'_> {
        LocalZone { zone: 0, key, limit, window_ms: 1000, cost: 1 }
    }

    #[test]
    fn admits_the_share_then_rejects_until_it_frees() {
        let mut l = LocalLimiter::new(100);
        let z = [zone(b"a", 3)];
        for left in [2, 1, 0] {
            let d = l.decide(&z, 100);
            assert!(d.allowed);
            assert_eq!(d.zones, vec![ZoneVerdict { ok: true, remaining: left, reset_ms: 0 }]);
        }
        let v = l.decide(&z, 200).zones[0];
        assert!(!v.ok);
        // 3 in window 0; in window 1 they weigh 3 * (1000 - e) / 1000 <= 2 once e >= 334.
        assert_eq!(v.reset_ms, 800 + 334);
        assert!(!l.decide(&z, 1333).zones[0].ok);
        assert!(l.decide(&z, 1334).zones[0].ok);
        // Another key is untouched.
        assert!(l.decide(&[zone(b"b", 3)], 1334).zones[0].ok);
    }

    #[test]
    fn all_or_nothing() {
        let mut l = LocalLimiter::new(100);
        let wide = LocalZone { zone: 1, ..zone(b"a", 100) };
        let both = [wide, zone(b"a", 1)];
        assert!(l.decide(&both, 0).allowed);
        let v = l.decide(&both, 1).zones;
        assert!(v[0].ok && !v[1].ok);
        // The rejected request was recorded in neither zone.
        assert_eq!(l.decide(&[wide], 2).zones[0].remaining, 98);
    }

    #[test]
    fn cost_and_gap() {
        let mut l = LocalLimiter::new(100);
        let z = [LocalZone { cost: 4, ..zone(b"a", 5) }];
        assert_eq!(l.decide(&z, 0).zones[0].remaining, 1);
        assert!(!l.decide(&z, 10).zones[0].ok);
        // Two windows later nothing counts any more.
        assert_eq!(l.decide(&z, 2500).zones[0].remaining, 1);
        let read = [LocalZone { cost: 0, ..zone(b"a", 5) }];
        assert_eq!(
            l.decide(&read, 2500).zones[0],
            ZoneVerdict { ok: true, remaining: 1, reset_ms: 0 }
        );
    }

    #[test]
    fn memory_is_bounded() {
        let mut l = LocalLimiter::new(10);
        for i in 0..1000u32 {
            l.decide(&[zone(&i.to_le_bytes(), 5)], 0);
            assert!(l.counters.len() <= 10);
        }
    }
}

//! Formatting of the RateLimit response headers and `Retry-After`.

use crate::decide::params::MAX_ZONE_NAME;
use crate::decide::text::Text;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderMode {
    Off,
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`.
    Legacy,
    /// draft-ietf-httpapi-ratelimit-headers-10: `RateLimit-Policy` and `RateLimit`.
    Draft,
}

/// What the headers describe: the deciding zone of one decision.
#[derive(Debug, Clone, Copy)]
pub struct Quota<'a> {
    pub zone: &'a str,
    pub limit: u64,
    /// `limit` in decimal when it is written already (a `ratelimit` line's fixed figures).
    pub limit_digits: Option<&'a [u8]>,
    /// 0 for a balance: it has no window, and waiting does not refill it.
    pub window_ms: u64,
    pub remaining: u64,
    pub reset_ms: u64,
    pub rejected: bool,
}

/// One zone of the location, as `RateLimit-Policy` announces it.
#[derive(Debug, Clone, Copy)]
pub struct Policy<'a> {
    pub zone: &'a str,
    pub limit: u64,
    /// 0 for a balance: announced without `w`. A calendar quota's is its current period's length.
    pub window_ms: u64,
}

/// A response header's name, and the lower case nginx keeps beside it: written out here, so
/// that no request lowers it again.
#[derive(Debug, PartialEq, Eq)]
pub struct Name {
    pub text: &'static str,
    pub lower: &'static str,
}

const LIMIT: Name = Name { text: "RateLimit-Limit", lower: "ratelimit-limit" };
const REMAINING: Name = Name { text: "RateLimit-Remaining", lower: "ratelimit-remaining" };
const RESET: Name = Name { text: "RateLimit-Reset", lower: "ratelimit-reset" };
const POLICY: Name = Name { text: "RateLimit-Policy", lower: "ratelimit-policy" };
const RATELIMIT: Name = Name { text: "RateLimit", lower: "ratelimit" };
const RETRY_AFTER: Name = Name { text: "Retry-After", lower: "retry-after" };

/// Whole seconds a client should wait: rounded up, so a client that obeys never comes back early.
pub fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// The draft's `q;w` for a zone: `w` is whole seconds, so a window that is not a whole number of
/// seconds is advertised over `w` = the window rounded up to a second, with the quota scaled to
/// that `w` and rounded down (`window=500ms limit=5` is `q=10;w=1`, not `q=5;w=1`, which would
/// read as half the real rate). Rounding down keeps the advertised rate at or below the real
/// one, by less than one unit per `w`.
pub fn policy_quota(limit: u64, window_ms: u64) -> (u64, u64) {
    let w = ceil_secs(window_ms);
    if window_ms % 1000 == 0 {
        return (limit, w);
    }
    // u128: a limit up to 10^9 times a window up to a year in milliseconds overflows u64.
    let q = u128::from(limit) * u128::from(w) * 1000 / u128::from(window_ms);
    (u64::try_from(q).unwrap_or(u64::MAX), w)
}

/// The most bytes [`format`] writes for a location of `zones` zones: every value at its longest
/// (a number is at most 20 digits).
pub fn room(mode: HeaderMode, zones: usize) -> usize {
    const NUM: usize = 20;
    // `"name";q=N;w=N` and `"name";r=N;t=N`.
    const DRAFT: usize = MAX_ZONE_NAME + 2 + 2 * (3 + NUM);
    let retry_after = NUM;
    retry_after
        + match mode {
            HeaderMode::Off => 0,
            HeaderMode::Legacy => 3 * NUM,
            HeaderMode::Draft => (zones + 1) * DRAFT,
        }
}

/// Hands the headers for one decision to `emit`, in the order they are sent; stops at the first
/// `None` from `emit` (the request's pool is exhausted) and returns it. The values are written
/// one after another into `out`, [`room`] bytes, and handed over where they lie: the request's
/// pool holds them all in one allocation, copied no more. `policies` are every zone of the
/// location: in draft mode each gets a `RateLimit-Policy` field line (a list may span field
/// lines, RFC 9110 section 5.3), while `RateLimit` reports the deciding zone `q`.
pub fn format<'a>(
    mode: HeaderMode,
    q: &Quota<'_>,
    policies: impl Iterator<Item = Policy<'a>>,
    out: &mut [u8],
    mut emit: impl FnMut(&'static Name, &[u8]) -> Option<()>,
) -> Option<()> {
    let reset = ceil_secs(q.reset_ms);
    if let (HeaderMode::Legacy, Some(digits)) = (mode, q.limit_digits) {
        emit(&LIMIT, digits)?;
    }
    let mut v = Text::new(out);
    // `room` counts every value at its longest, so they always fit.
    let mut put = |name: &'static Name, value: &mut Text<&mut [u8]>| {
        emit(name, value.get()?)?;
        value.after();
        Some(())
    };
    match mode {
        HeaderMode::Off => {}
        HeaderMode::Legacy => {
            if q.limit_digits.is_none() {
                put(&LIMIT, v.num(q.limit))?;
            }
            put(&REMAINING, v.num(q.remaining))?;
            put(&RESET, v.num(reset))?;
        }
        HeaderMode::Draft => {
            for p in policies {
                v.push(b"\"").push(p.zone.as_bytes()).push(b"\";q=");
                if p.window_ms == 0 {
                    // A balance: no window, only an operator refills it.
                    v.num(p.limit);
                } else {
                    let (quota, w) = policy_quota(p.limit, p.window_ms);
                    v.num(quota).push(b";w=").num(w);
                }
                put(&POLICY, &mut v)?;
            }
            v.push(b"\"").push(q.zone.as_bytes()).push(b"\";r=").num(q.remaining);
            put(&RATELIMIT, v.push(b";t=").num(reset))?;
        }
    }
    // No time readmits a request an empty balance rejected: no Retry-After to hammer on.
    if q.rejected && q.window_ms != 0 {
        put(&RETRY_AFTER, v.num(reset.max(1)))?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format(mode: HeaderMode, q: &Quota<'_>) -> Vec<(&'static str, String)> {
        let policy = Policy { zone: q.zone, limit: q.limit, window_ms: q.window_ms };
        format_zones(mode, q, &[policy])
    }

    fn format_zones(
        mode: HeaderMode,
        q: &Quota<'_>,
        policies: &[Policy<'_>],
    ) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let mut buf = vec![0; room(mode, policies.len())];
        super::format(mode, q, policies.iter().copied(), &mut buf, |name, value| {
            assert_eq!(name.lower, name.text.to_ascii_lowercase());
            out.push((name.text, String::from_utf8(value.to_vec()).unwrap()));
            Some(())
        })
        .unwrap();
        out
    }

    fn quota(rejected: bool) -> Quota<'static> {
        Quota {
            zone: "api",
            limit: 100,
            limit_digits: None,
            window_ms: 60_000,
            remaining: if rejected { 0 } else { 42 },
            reset_ms: 16_001,
            rejected,
        }
    }

    #[test]
    fn legacy() {
        assert_eq!(
            format(HeaderMode::Legacy, &quota(false)),
            vec![
                ("RateLimit-Limit", "100".to_string()),
                ("RateLimit-Remaining", "42".to_string()),
                ("RateLimit-Reset", "17".to_string()),
            ]
        );
        let written = Quota { limit_digits: Some(b"100"), ..quota(false) };
        assert_eq!(format(HeaderMode::Legacy, &written), format(HeaderMode::Legacy, &quota(false)));
    }

    #[test]
    fn draft_with_retry_after() {
        assert_eq!(
            format(HeaderMode::Draft, &quota(true)),
            vec![
                ("RateLimit-Policy", "\"api\";q=100;w=60".to_string()),
                ("RateLimit", "\"api\";r=0;t=17".to_string()),
                ("Retry-After", "17".to_string()),
            ]
        );
    }

    #[test]
    fn draft_lists_every_zone_and_reports_the_deciding_one() {
        let policies = [
            Policy { zone: "per-ip", limit: 10, window_ms: 1_000 },
            Policy { zone: "api", limit: 100, window_ms: 60_000 },
        ];
        assert_eq!(
            format_zones(HeaderMode::Draft, &quota(false), &policies),
            vec![
                ("RateLimit-Policy", "\"per-ip\";q=10;w=1".to_string()),
                ("RateLimit-Policy", "\"api\";q=100;w=60".to_string()),
                ("RateLimit", "\"api\";r=42;t=17".to_string()),
            ]
        );
        assert_eq!(format_zones(HeaderMode::Legacy, &quota(false), &policies).len(), 3);
    }

    #[test]
    fn a_balance_has_no_window_and_no_retry_after() {
        let q = Quota { zone: "credits", window_ms: 0, reset_ms: 0, ..quota(true) };
        assert_eq!(
            format(HeaderMode::Draft, &q),
            vec![
                ("RateLimit-Policy", "\"credits\";q=100".to_string()),
                ("RateLimit", "\"credits\";r=0;t=0".to_string()),
            ]
        );
    }

    #[test]
    fn off_still_says_when_to_retry() {
        assert_eq!(format(HeaderMode::Off, &quota(false)), vec![]);
        assert_eq!(format(HeaderMode::Off, &quota(true)), vec![("Retry-After", "17".to_string())]);
    }

    #[test]
    fn sub_second_and_fractional_windows_advertise_the_real_rate() {
        // Whole seconds: as configured.
        assert_eq!(policy_quota(100, 60_000), (100, 60));
        assert_eq!(policy_quota(10, 1_000), (10, 1));
        // 5 per 500 ms is 10 per second.
        assert_eq!(policy_quota(5, 500), (10, 1));
        // 3 per 1.5 s over 2 s is 4; 7 per 1.5 s over 2 s is 9.33, rounded down to 9.
        assert_eq!(policy_quota(3, 1_500), (4, 2));
        assert_eq!(policy_quota(7, 1_500), (9, 2));
        // 1 per 300 ms over 1 s is 3.33: 3, never the 4 the zone would not grant in a second.
        assert_eq!(policy_quota(1, 300), (3, 1));
        // The largest limit over a year minus a millisecond does not overflow.
        let year = 365 * 24 * 3600 * 1000;
        assert_eq!(policy_quota(1_000_000_000, year - 1), (1_000_000_000, year / 1000));
        let q = Quota { zone: "fast", limit: 5, window_ms: 500, ..quota(false) };
        assert_eq!(
            format(HeaderMode::Draft, &q)[0],
            ("RateLimit-Policy", "\"fast\";q=10;w=1".to_string())
        );
    }

    #[test]
    fn rounding() {
        assert_eq!(ceil_secs(0), 0);
        assert_eq!(ceil_secs(1), 1);
        assert_eq!(ceil_secs(1000), 1);
        assert_eq!(ceil_secs(1001), 2);
        let mut q = quota(true);
        q.reset_ms = 0;
        assert_eq!(format(HeaderMode::Off, &q), vec![("Retry-After", "1".to_string())]);
    }
}

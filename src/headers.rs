//! Formatting of the RateLimit response headers and `Retry-After`.

use std::fmt::Write;

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
    pub window_ms: u64,
    pub remaining: u64,
    pub reset_ms: u64,
    pub rejected: bool,
}

/// Whole seconds a client should wait: rounded up, so a client that obeys never comes back early.
pub fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// The headers for one decision, in the order they are sent.
pub fn format(mode: HeaderMode, q: &Quota<'_>) -> Vec<(&'static str, String)> {
    let reset = ceil_secs(q.reset_ms);
    let mut out = Vec::with_capacity(4);
    match mode {
        HeaderMode::Off => {}
        HeaderMode::Legacy => {
            out.push(("RateLimit-Limit", q.limit.to_string()));
            out.push(("RateLimit-Remaining", q.remaining.to_string()));
            out.push(("RateLimit-Reset", reset.to_string()));
        }
        HeaderMode::Draft => {
            let mut policy = String::with_capacity(q.zone.len() + 24);
            let _ = write!(policy, "\"{}\";q={};w={}", q.zone, q.limit, ceil_secs(q.window_ms));
            out.push(("RateLimit-Policy", policy));
            let mut state = String::with_capacity(q.zone.len() + 24);
            let _ = write!(state, "\"{}\";r={};t={}", q.zone, q.remaining, reset);
            out.push(("RateLimit", state));
        }
    }
    if q.rejected {
        out.push(("Retry-After", reset.max(1).to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(rejected: bool) -> Quota<'static> {
        Quota {
            zone: "api",
            limit: 100,
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
    fn off_still_says_when_to_retry() {
        assert_eq!(format(HeaderMode::Off, &quota(false)), vec![]);
        assert_eq!(format(HeaderMode::Off, &quota(true)), vec![("Retry-After", "17".to_string())]);
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

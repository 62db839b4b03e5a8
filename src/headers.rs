//! Formatting of the RateLimit response headers and `Retry-After`.

use core::fmt::{self, Write};

use crate::text::StackText;

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

/// Hands the headers for one decision to `emit`, in the order they are sent; stops at the first
/// `None` from `emit` (the request's pool is exhausted) and returns it.
pub fn format(
    mode: HeaderMode,
    q: &Quota<'_>,
    mut emit: impl FnMut(&'static str, &[u8]) -> Option<()>,
) -> Option<()> {
    let reset = ceil_secs(q.reset_ms);
    let mut v = StackText::default();
    // Zone names are at most 64 characters, so the values always fit in a StackText.
    let mut put = |name: &'static str, args: fmt::Arguments<'_>| {
        v.clear();
        v.write_fmt(args).ok()?;
        emit(name, v.as_bytes())
    };
    match mode {
        HeaderMode::Off => {}
        HeaderMode::Legacy => {
            put("RateLimit-Limit", format_args!("{}", q.limit))?;
            put("RateLimit-Remaining", format_args!("{}", q.remaining))?;
            put("RateLimit-Reset", format_args!("{reset}"))?;
        }
        HeaderMode::Draft => {
            let (zone, window) = (q.zone, ceil_secs(q.window_ms));
            put("RateLimit-Policy", format_args!("\"{zone}\";q={};w={window}", q.limit))?;
            put("RateLimit", format_args!("\"{zone}\";r={};t={reset}", q.remaining))?;
        }
    }
    if q.rejected {
        put("Retry-After", format_args!("{}", reset.max(1)))?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format(mode: HeaderMode, q: &Quota<'_>) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        super::format(mode, q, |name, value| {
            out.push((name, String::from_utf8(value.to_vec()).unwrap()));
            Some(())
        })
        .unwrap();
        out
    }

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

//! The figures of zones and `ratelimit` lines (limits, windows, costs, zone names) and the hints
//! for `limit_req` habits; pure, so that every accepted and rejected form has a unit test. The
//! syntax they share with other values (times, numbers, `name=value`) is `crate::codec::values`.

use crate::codec::values::{parse_msec, parse_uint, split_param};

/// Far above any real limit, and small enough that the scripts' arithmetic stays exact.
pub const MAX_LIMIT: u64 = 1_000_000_000;
pub const MAX_WINDOW_MS: u64 = 365 * 86_400_000;

/// A zone's `limit=` (also `burst=`), from the configuration or from a variable.
pub fn parse_limit(value: &str) -> Option<u64> {
    parse_uint(value, 1, MAX_LIMIT)
}

/// A zone's `window=`: a time of at least 1ms and at most a year.
pub fn parse_window(value: &str) -> Option<u64> {
    parse_msec(value).filter(|w| (1..=MAX_WINDOW_MS).contains(w))
}

/// A `ratelimit` line's `cost=`: 0 reads the zone without taking anything.
pub fn parse_cost(value: &str) -> Option<u64> {
    parse_uint(value, 0, MAX_LIMIT)
}

/// A zone name's most bytes: the headers that name it have room for that many.
pub const MAX_ZONE_NAME: usize = 64;

/// Zone names appear in Redis keys and, quoted, in the draft RateLimit headers, so they are kept
/// to characters that need no escaping in either.
pub fn valid_zone_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_ZONE_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

/// The longest `lease_time=`: a worker that dies holding a reservation or a concurrency slot
/// keeps its units from everyone else for that long, so a typo such as `1000y` would hold them
/// for good.
pub const MAX_LEASE_MS: u64 = 3_600_000;

/// The longest `delay=`: a waiting request holds its connection and a place in every zone of its
/// location, which a client that never comes back keeps until the wait ends.
pub const MAX_DELAY_MS: u64 = 3_600_000;

/// A `ratelimit` line's `delay=`: a time with its unit, at most an hour. A bare number is what
/// `limit_req`'s `delay=8` means, a count of requests, so it is refused with what to write.
pub fn parse_delay(value: &str) -> Result<u64, String> {
    let unit = value.bytes().any(|b| b.is_ascii_alphabetic());
    match parse_msec(value).filter(|_| unit) {
        Some(ms) if ms <= MAX_DELAY_MS => Ok(ms),
        Some(_) => Err("the longest delay is 1h".into()),
        None if !unit && parse_uint(value, 0, MAX_LIMIT).is_some() => Err(format!(
            "delay= is the longest wait, a time such as \"delay=2s\" or \"delay=500ms\"; \
             limit_req's delay={value} (requests admitted without delay) is the zone's \
             burst= with algorithm=gcra (docs/delay.md)"
        )),
        None => Err("write a time such as \"delay=2s\" or \"delay=500ms\"".into()),
    }
}

/// What an operator used to `limit_req` meant by a parameter this module does not take, and
/// what to write instead: the text that follows the error, or `None`.
pub fn limit_req_hint(directive: &str, arg: &str) -> Option<String> {
    let (name, value) = split_param(arg).unwrap_or((arg, ""));
    match (directive, name) {
        // limit_req's burst counts the requests beyond the first; gcra's, all that pass at once.
        ("ratelimit", "burst") => Some(match parse_uint(value, 0, MAX_LIMIT - 1) {
            Some(n) => format!(
                ": a burst belongs to the zone, write \"ratelimit_zone ... algorithm=gcra \
                 burst={}\" and \"ratelimit NAME;\", plus \"delay=TIME\" for limit_req's \
                 delay (docs/delay.md)",
                n + 1
            ),
            None => ": a burst belongs to the zone (\"ratelimit_zone ... algorithm=gcra \
                     burst=N\", docs/delay.md)"
                .into(),
        }),
        ("ratelimit", "nodelay") => Some(
            ": a request is admitted or rejected at once unless its line says \"delay=TIME\" \
             (docs/delay.md): remove it"
                .into(),
        ),
        ("ratelimit_zone", "rate") => Some(match limit_req_rate(value) {
            Some((n, window)) => format!(": write \"limit={n} window={window}\""),
            None => ": write \"limit=N window=T\" (N requests per T)".into(),
        }),
        ("ratelimit_zone", "zone") => Some(
            ": the zone's name is the first argument (\"ratelimit_zone NAME key=...\"), and \
             it takes no memory size: the counters live in Redis"
                .into(),
        ),
        _ => None,
    }
}

/// limit_req's `rate=` (`10r/s`, `600r/m`) as `limit=` and `window=`.
pub fn limit_req_rate(value: &str) -> Option<(u64, &'static str)> {
    let (n, window) = if let Some(n) = value.strip_suffix("r/s") {
        (n, "1s")
    } else {
        (value.strip_suffix("r/m")?, "1m")
    };
    Some((parse_limit(n)?, window))
}

/// An address of `ratelimit_redis` as an error names it: without the `user:password@` that a
/// Redis URL may carry.
pub fn shown_address(addr: &str) -> String {
    match addr.rsplit_once('@') {
        Some((_, host)) => format!("...@{host}"),
        None => addr.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_windows_costs() {
        assert_eq!(parse_limit("1"), Some(1));
        assert_eq!(parse_limit("1000000000"), Some(MAX_LIMIT));
        for bad in ["0", "-1", "1000000001", "10r/s", " 5", ""] {
            assert_eq!(parse_limit(bad), None, "{bad}");
        }
        assert_eq!(parse_window("1ms"), Some(1));
        assert_eq!(parse_window("1y"), Some(MAX_WINDOW_MS));
        for bad in ["0", "0s", "2y", "abc", ""] {
            assert_eq!(parse_window(bad), None, "{bad}");
        }
        assert_eq!(parse_cost("0"), Some(0));
        assert_eq!(parse_cost("25"), Some(25));
        for bad in ["-1", "1.5", "x", ""] {
            assert_eq!(parse_cost(bad), None, "{bad}");
        }
    }

    #[test]
    fn delays() {
        assert_eq!(parse_delay("2s"), Ok(2000));
        assert_eq!(parse_delay("500ms"), Ok(500));
        assert_eq!(parse_delay("1h"), Ok(MAX_DELAY_MS));
        assert_eq!(parse_delay("0s"), Ok(0));
        assert!(parse_delay("8").unwrap_err().contains("burst="));
        assert!(parse_delay("2h").unwrap_err().contains("1h"));
        for bad in ["", "x", "2 parsecs", "-1s"] {
            assert!(parse_delay(bad).unwrap_err().contains("delay=2s"), "{bad}");
        }
    }

    #[test]
    fn zone_names() {
        for ok in ["api", "per-ip", "plan_gold", "v1.users"] {
            assert!(valid_zone_name(ok), "{ok}");
        }
        for bad in ["", "a b", "a\"b", "a:b", "a=b", "ä", &"x".repeat(65)] {
            assert!(!valid_zone_name(bad), "{bad}");
        }
    }

    #[test]
    fn limit_req_habits_say_what_to_write() {
        let hint = |d, a| limit_req_hint(d, a).unwrap_or_default();
        assert!(hint("ratelimit", "burst=5").contains("algorithm=gcra burst=6"));
        assert!(hint("ratelimit", "burst=x").contains("burst=N"));
        assert!(hint("ratelimit", "nodelay").contains("remove it"));
        assert!(hint("ratelimit_zone", "rate=10r/s").contains("\"limit=10 window=1s\""));
        assert!(hint("ratelimit_zone", "rate=600r/m").contains("\"limit=600 window=1m\""));
        assert!(hint("ratelimit_zone", "rate=fast").contains("limit=N window=T"));
        assert!(hint("ratelimit_zone", "zone=one:10m").contains("first argument"));
        assert_eq!(limit_req_hint("ratelimit_zone", "foo=1"), None);
        assert_eq!(limit_req_hint("ratelimit_redis", "burst=1"), None);
        assert_eq!(limit_req_rate("0r/s"), None);
        assert_eq!(limit_req_rate("10r/h"), None);
    }

    #[test]
    fn addresses_without_credentials() {
        assert_eq!(shown_address("127.0.0.1:abc"), "127.0.0.1:abc");
        assert_eq!(shown_address("unix:"), "unix:");
        assert_eq!(shown_address("redis://u:S3cret@host:6379"), "...@host:6379");
        assert_eq!(shown_address(":p@ss@host"), "...@host");
    }
}

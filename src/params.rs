//! Pure parsers for directive values, so that every accepted and rejected form has a unit test.

/// Parses an nginx time value into milliseconds: `200ms`, `1s`, `1m`, `1h 30m`, or a bare number
/// of seconds. Units follow `ngx_parse_time`: ms, s, m, h, d, w, M (30 days), y (365 days).
pub fn parse_msec(value: &str) -> Option<u64> {
    let mut total: u64 = 0;
    let mut rest = value.trim_matches(' ');
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let scale: u64 = match &rest[..unit_len] {
            "ms" => 1,
            "" | "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 7 * 86_400_000,
            "M" => 30 * 86_400_000,
            "y" => 365 * 86_400_000,
            _ => return None,
        };
        total = total.checked_add(n.checked_mul(scale)?)?;
        rest = rest[unit_len..].trim_start_matches(' ');
    }
    Some(total)
}

/// Parses an nginx size into bytes: `512`, `64k`, `8m`, `1g` (either case), as `ngx_parse_size`.
pub fn parse_size(value: &str) -> Option<u64> {
    let (digits, scale) = match value.as_bytes().last()? {
        b'k' | b'K' => (&value[..value.len() - 1], 1 << 10),
        b'm' | b'M' => (&value[..value.len() - 1], 1 << 20),
        b'g' | b'G' => (&value[..value.len() - 1], 1 << 30),
        _ => (value, 1),
    };
    parse_uint(digits, 0, u64::MAX)?.checked_mul(scale)
}

/// Parses a decimal integer within `min..=max`.
pub fn parse_uint(value: &str, min: u64, max: u64) -> Option<u64> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok().filter(|n| (min..=max).contains(n))
}

/// An `on`/`off` parameter.
pub fn parse_switch(value: &str) -> Option<bool> {
    match value {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    }
}

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

/// Zone names appear in Redis keys and, quoted, in the draft RateLimit headers, so they are kept
/// to characters that need no escaping in either.
pub fn valid_zone_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

/// Splits `name=value`; the value may itself contain `=`.
pub fn split_param(arg: &str) -> Option<(&str, &str)> {
    arg.split_once('=').filter(|(name, _)| !name.is_empty())
}

/// How `nginx -t` names a parameter it refuses without a value to blame, at `position` among
/// the directive's arguments: by its name alone; a lone word as written only when it is one of
/// the directive's parameter names (`is_name`), else by its position. A misspelt
/// `passwrd=S3cret`, or the part of a password after a space, may be a secret, and nginx's
/// output goes to terminals, CI logs and support tickets.
pub fn unknown_param(arg: &str, position: usize, is_name: impl Fn(&str) -> bool) -> String {
    match split_param(arg) {
        Some((name, _)) => format!("\"{name}=\" (value not shown)"),
        None if is_name(arg) => format!("\"{arg}\" (not name=value)"),
        None => format!("#{position} (not name=value, not shown)"),
    }
}

/// The longest `lease_time=`: a worker that dies holding a reservation or a concurrency slot
/// keeps its units from everyone else for that long, so a typo such as `1000y` would hold them
/// for good.
pub const MAX_LEASE_MS: u64 = 3_600_000;

/// What an operator used to `limit_req` meant by a parameter this module does not take, and
/// what to write instead: the text that follows the error, or `None`.
pub fn limit_req_hint(directive: &str, arg: &str) -> Option<String> {
    let (name, value) = split_param(arg).unwrap_or((arg, ""));
    match (directive, name) {
        ("ratelimit", "burst") => Some(format!(
            ": a burst belongs to the zone, write \"ratelimit_zone ... algorithm=gcra \
             burst={value}\" and \"ratelimit NAME;\""
        )),
        ("ratelimit", "nodelay" | "delay") => Some(
            ": a request is never delayed, it is admitted or rejected at once (limit_req's \
             nodelay): remove it"
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
    fn switches() {
        assert_eq!(parse_switch("on"), Some(true));
        assert_eq!(parse_switch("off"), Some(false));
        assert_eq!(parse_switch("On"), None);
        assert_eq!(parse_switch(""), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("64k"), Some(65_536));
        assert_eq!(parse_size("8M"), Some(8 << 20));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        for bad in ["", "k", "1.5m", "-1", "1 m", "8mb", "99999999999999999999"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn times() {
        assert_eq!(parse_msec("200ms"), Some(200));
        assert_eq!(parse_msec("1m"), Some(60_000));
        assert_eq!(parse_msec("10"), Some(10_000));
        assert_eq!(parse_msec("1h 30m"), Some(5_400_000));
        assert_eq!(parse_msec("1h30m"), Some(5_400_000));
        assert_eq!(parse_msec("2d"), Some(172_800_000));
        assert_eq!(parse_msec("0"), Some(0));
        for bad in ["", "ms", "5x", "-1s", "1.5s", "1 s x", "99999999999999999999y"] {
            assert_eq!(parse_msec(bad), None, "{bad}");
        }
    }

    #[test]
    fn uints() {
        assert_eq!(parse_uint("100", 1, 1000), Some(100));
        assert_eq!(parse_uint("0", 1, 1000), None);
        assert_eq!(parse_uint("1001", 1, 1000), None);
        assert_eq!(parse_uint("+5", 1, 1000), None);
        assert_eq!(parse_uint("abc", 1, 1000), None);
        assert_eq!(parse_uint("", 1, 1000), None);
    }

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
    fn zone_names() {
        for ok in ["api", "per-ip", "plan_gold", "v1.users"] {
            assert!(valid_zone_name(ok), "{ok}");
        }
        for bad in ["", "a b", "a\"b", "a:b", "a=b", "ä", &"x".repeat(65)] {
            assert!(!valid_zone_name(bad), "{bad}");
        }
    }

    #[test]
    fn params() {
        assert_eq!(split_param("key=$host:$arg_k"), Some(("key", "$host:$arg_k")));
        assert_eq!(split_param("a=b=c"), Some(("a", "b=c")));
        assert_eq!(split_param("limit"), None);
        assert_eq!(split_param("=5"), None);
    }

    #[test]
    fn unknown_params_never_show_a_value() {
        let names = |w: &str| ["password", "pool_size"].contains(&w);
        let shown = |arg, pos| unknown_param(arg, pos, names);
        assert_eq!(shown("passwrd=S3cretPW", 2), "\"passwrd=\" (value not shown)");
        assert_eq!(shown("password=S3cretPW", 1), "\"password=\" (value not shown)");
        assert_eq!(shown("foo=a=b", 3), "\"foo=\" (value not shown)");
        assert_eq!(shown("pool_size", 3), "\"pool_size\" (not name=value)");
        for word in ["S3cretPW", "=S3cretPW", "password2"] {
            assert_eq!(shown(word, 4), "#4 (not name=value, not shown)");
        }
    }

    #[test]
    fn limit_req_habits_say_what_to_write() {
        let hint = |d, a| limit_req_hint(d, a).unwrap_or_default();
        assert!(hint("ratelimit", "burst=5").contains("algorithm=gcra burst=5"));
        assert!(hint("ratelimit", "nodelay").contains("remove it"));
        assert!(hint("ratelimit", "delay=3").contains("never delayed"));
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

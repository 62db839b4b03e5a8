//! The syntax of nginx directive values, as nginx's own parsers read them: times, sizes,
//! numbers, `on`/`off`, `name=value` parameters, and how an error names a parameter without
//! showing its value. Pure, so that every accepted and rejected form has a unit test.

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

/// Splits `name=value`; the value may itself contain `=`.
pub fn split_param(arg: &str) -> Option<(&str, &str)> {
    arg.split_once('=').filter(|(name, _)| !name.is_empty())
}

/// The byte range of the one variable (`$name` or `${name}`) of a value (a key template); `None` when it
/// has none or several.
pub fn one_variable(template: &[u8]) -> Option<(usize, usize)> {
    let mut found = None;
    let mut i = 0;
    while i < template.len() {
        if template[i] != b'$' {
            i += 1;
            continue;
        }
        let end = if template.get(i + 1) == Some(&b'{') {
            i + 2 + template[i + 2..].iter().position(|&b| b == b'}')? + 1
        } else {
            i + 1 + template[i + 1..].iter().take_while(|b| is_name(b)).count()
        };
        if found.replace((i, end)).is_some() {
            return None;
        }
        i = end;
    }
    found
}

/// The variable's name when `value` is one variable and nothing else ([`one_variable`] from its
/// first byte to its last), as nginx's script compiler reads names: letters, digits, `_`. A
/// regex capture (`$1`) is not one: nginx's own compiler takes those.
pub fn lone_variable(value: &[u8]) -> Option<&[u8]> {
    if one_variable(value)? != (0, value.len()) {
        return None;
    }
    let name = &value[1..];
    let name = name.strip_prefix(b"{").map_or(name, |n| &n[..n.len() - 1]);
    let capture = matches!(name.first(), Some(b'1'..=b'9'));
    (!name.is_empty() && !capture && name.iter().all(is_name)).then_some(name)
}

/// A byte of a variable's name.
fn is_name(b: &u8) -> bool {
    b.is_ascii_alphanumeric() || *b == b'_'
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_variable_of_a_template() {
        assert_eq!(one_variable(b"cr:$arg_k"), Some((3, 9)));
        assert_eq!(one_variable(b"${http_x}:a"), Some((0, 9)));
        assert_eq!(one_variable(b"$a:$b"), None);
        assert_eq!(one_variable(b"plain"), None);
    }

    #[test]
    fn lone_variables() {
        assert_eq!(lone_variable(b"$binary_remote_addr"), Some(&b"binary_remote_addr"[..]));
        assert_eq!(lone_variable(b"${http_x_api_key}"), Some(&b"http_x_api_key"[..]));
        assert_eq!(lone_variable(b"$0x"), Some(&b"0x"[..]));
        for not in [
            &b""[..],
            b"$",
            b"${}",
            b"${a",
            b"$1",
            b"$12",
            b"x$a",
            b"$a:$b",
            b"$a.b",
            b"${a}b",
            b"$a-b",
            b"plain",
        ] {
            assert_eq!(lone_variable(not), None, "{}", String::from_utf8_lossy(not));
        }
    }

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
}

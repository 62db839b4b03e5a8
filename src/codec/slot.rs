//! Redis Cluster key slots: CRC16 with the hash-tag rule, and the escaping of braces that come
//! from request data (design note `scale-out-notes.md`, 2.1).
//!
//! Pure functions, no allocation on the request path: a key is hashed from the parts it is built
//! from (`Key::parts()`), never joined first.

use std::borrow::Cow;

/// Number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// CRC16-CCITT/XMODEM lookup table (poly 0x1021, init 0, no reflection, no final xor): the
/// variant Redis uses (`src/crc16.c`).
const CRC16_TABLE: [u16; 256] = crc16_table();

const fn crc16_table() -> [u16; 256] {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

#[inline]
fn crc16_update(crc: u16, byte: u8) -> u16 {
    (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ byte)]
}

/// CRC16-CCITT/XMODEM of `data`, as Redis computes it for key slots.
pub fn crc16(data: &[u8]) -> u16 {
    data.iter().fold(0, |crc, &b| crc16_update(crc, b))
}

/// The hash tag of a key, as Redis finds it: after the first `{`, up to the next `}`, if not
/// empty.
pub fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let len = key[open + 1..].iter().position(|&b| b == b'}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// The cluster slot of the key made of `parts` concatenated, by Redis' rule: if the key has a
/// `{`, and after the first `{` a `}`, and at least one byte lies between them, only those bytes
/// are hashed; otherwise the whole key is. Braces are found across part boundaries.
pub fn key_slot(parts: &[&[u8]]) -> u16 {
    let bytes = || parts.iter().flat_map(|p| p.iter().copied());
    let (mut open, mut close) = (None, None);
    for (i, b) in bytes().enumerate() {
        match (open, b) {
            (None, b'{') => open = Some(i),
            (Some(_), b'}') => {
                close = Some(i);
                break;
            }
            _ => {}
        }
    }
    let crc = match (open, close) {
        (Some(o), Some(c)) if c > o + 1 => {
            bytes().skip(o + 1).take(c - o - 1).fold(0, crc16_update)
        }
        _ => bytes().fold(0, crc16_update),
    };
    crc & (SLOTS - 1)
}

/// The escape byte of [`neutralize_braces`].
const ESCAPE: u8 = b'%';

/// A key value taken from request data, made unable to act as a hash tag.
///
/// In a cluster, a `{...}` in a key chooses the slot, hence the node. Key values come from
/// request data (`$http_x_api_key`, `$arg_k`, ...), so a client that puts braces into its value
/// could pick the node its counters live on (and pile keys onto one node), or, with a template
/// such as `key={$http_x_api_key}`, shorten or extend the operator's tag with a `}` of its own.
/// Only braces written literally in the configuration may act as tags.
///
/// Scheme: percent-style escaping of exactly three bytes, `{` → `%7B`, `}` → `%7D` and the
/// escape byte itself `%` → `%25`; every other byte is kept. Why this one:
/// - the result contains no `{` or `}` at all, so the tag of the whole key is decided by the
///   configured parts alone, wherever the value sits in the key;
/// - it is injective (escaping the escape byte makes it decodable), so two distinct clients never
///   share a counter — hashing (SHA-1) would be injective in practice too, but unreadable in
///   `redis-cli`, in `ratelimit_admin` and in logs;
/// - values without those three bytes, by far the usual case, are returned as they are,
///   borrowed, without allocating.
///
/// Apply it to bytes that come from variables, not to the literal text of a key template. In
/// cluster mode only: it changes the Redis key of values holding `%`, `{` or `}`, so switching an
/// existing deployment to it starts such clients' counters afresh. A value made longer than
/// `key::MAX_RAW_KEY` by the escaping is replaced by its SHA-1 like any long value (hex digits:
/// no braces).
pub fn neutralize_braces(value: &[u8]) -> Cow<'_, [u8]> {
    let special = |b: &u8| matches!(*b, b'{' | b'}' | ESCAPE);
    let extra = value.iter().filter(|b| special(b)).count();
    if extra == 0 {
        return Cow::Borrowed(value);
    }
    let mut out = Vec::with_capacity(value.len() + 2 * extra);
    for &b in value {
        match b {
            b'{' => out.extend_from_slice(b"%7B"),
            b'}' => out.extend_from_slice(b"%7D"),
            ESCAPE => out.extend_from_slice(b"%25"),
            _ => out.push(b),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Measured with `CLUSTER KEYSLOT` on redis-server 7.0.15 (design note, table 2.1).
    const VECTORS: [(&str, u16); 10] = [
        ("123456789", 12739),
        ("foo", 12182),
        ("{}foo", 9500),
        ("foo{}{bar}", 8363),
        ("foo{{bar}}zap", 4015),
        ("foo{bar}{zap}", 5061),
        ("{user1000}.following", 3443),
        ("{user1000}.followers", 3443),
        ("rl:api:consumer-42", 14017),
        ("{rl}:api:x", 785),
    ];

    #[test]
    fn crc16_check_value() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
        // Bit-by-bit reference, to check the table.
        fn slow(data: &[u8]) -> u16 {
            let mut crc = 0u16;
            for &b in data {
                crc ^= u16::from(b) << 8;
                for _ in 0..8 {
                    crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
                }
            }
            crc
        }
        let all: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        for n in 0..all.len() {
            assert_eq!(crc16(&all[..n]), slow(&all[..n]));
        }
    }

    #[test]
    fn measured_vectors_in_one_part() {
        for (key, slot) in VECTORS {
            assert_eq!(key_slot(&[key.as_bytes()]), slot, "{key}");
        }
    }

    #[test]
    fn measured_vectors_split_at_every_point() {
        for (key, slot) in VECTORS {
            let k = key.as_bytes();
            for i in 0..=k.len() {
                assert_eq!(key_slot(&[&k[..i], &k[i..]]), slot, "{key} split at {i}");
                for j in i..=k.len() {
                    let parts: [&[u8]; 4] = [&k[..i], b"", &k[i..j], &k[j..]];
                    assert_eq!(key_slot(&parts), slot, "{key} split at {i}, {j}");
                }
            }
            // One byte per part.
            let bytes: Vec<&[u8]> = k.chunks(1).collect();
            assert_eq!(key_slot(&bytes), slot, "{key} byte by byte");
        }
    }

    #[test]
    fn tag_rule_edge_cases() {
        let whole = |k: &[u8]| crc16(k) & (SLOTS - 1);
        assert_eq!(key_slot(&[]), 0);
        assert_eq!(key_slot(&[b""]), 0);
        assert_eq!(key_slot(&[b"{"]), whole(b"{"));
        assert_eq!(key_slot(&[b"}"]), whole(b"}"));
        assert_eq!(key_slot(&[b"}{"]), whole(b"}{"));
        assert_eq!(
            key_slot(&[b"a}b{c"]),
            whole(b"a}b{c"),
            "a closing brace before the opening one is no tag"
        );
        assert_eq!(key_slot(&[b"a}b{c}d"]), key_slot(&[b"c"]));
        assert_eq!(key_slot(&[b"x{a}"]), key_slot(&[b"a"]));
        assert_eq!(key_slot(&[b"{a"]), whole(b"{a"), "no closing brace");
        // The prefix/zone/sep/value shape of `Key::parts()`.
        let parts: [&[u8]; 4] = [b"rl:{", b"api", b":", b"}consumer-42"];
        assert_eq!(key_slot(&parts), key_slot(&[b"api:"]));
    }

    #[test]
    fn neutralized_values_are_readable_and_borrowed_when_clean() {
        assert!(matches!(neutralize_braces(b"consumer-42"), Cow::Borrowed(_)));
        assert_eq!(&*neutralize_braces(b"{x}"), b"%7Bx%7D");
        assert_eq!(&*neutralize_braces(b"100%"), b"100%25");
        assert_eq!(&*neutralize_braces(b"%7B"), b"%257B", "an escape-looking value stays apart");
        assert_eq!(&*neutralize_braces(b""), b"");
    }

    /// Reverses the escaping; it exists only to prove the escaping injective.
    fn unescape(v: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < v.len() {
            if v[i] == ESCAPE {
                out.push(match &v[i + 1..i + 3] {
                    b"7B" => b'{',
                    b"7D" => b'}',
                    b"25" => b'%',
                    other => panic!("bad escape {other:?}"),
                });
                i += 3;
            } else {
                out.push(v[i]);
                i += 1;
            }
        }
        out
    }

    fn xorshift(seed: u64) -> impl FnMut(usize) -> usize {
        let mut s = seed;
        move |n| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n.max(1) as u64) as usize
        }
    }

    /// Random values over an alphabet rich in braces and escape-like bytes.
    fn random_value(next: &mut impl FnMut(usize) -> usize) -> Vec<u8> {
        const ALPHABET: &[u8] = b"{}%7BDb25a:x\0\xff";
        (0..next(12)).map(|_| ALPHABET[next(ALPHABET.len())]).collect()
    }

    #[test]
    fn neutralized_values_stay_distinct() {
        let mut next = xorshift(0x9e3779b97f4a7c15);
        let mut seen = std::collections::HashMap::new();
        for _ in 0..50_000 {
            let v = random_value(&mut next);
            let n = neutralize_braces(&v).into_owned();
            assert!(!n.contains(&b'{') && !n.contains(&b'}'), "{v:?}");
            assert_eq!(unescape(&n), v);
            if let Some(prev) = seen.insert(n.clone(), v.clone()) {
                assert_eq!(prev, v, "two values escape to {n:?}");
            }
        }
    }

    #[test]
    fn a_neutralized_value_never_chooses_the_tag() {
        let mut next = xorshift(0x2545f4914f6cdd1d);
        // prefix, zone: no tag, an operator's tag, an unclosed brace a value could close.
        let configs: [(&[u8], &[u8]); 5] = [
            (b"rl:", b"api"),
            (b"{rl}:", b"api"),
            (b"rl:", b"{api}"),
            (b"rl:{", b"api"),
            (b"", b""),
        ];
        for _ in 0..20_000 {
            let v = random_value(&mut next);
            let n = neutralize_braces(&v);
            for (prefix, zone) in configs {
                let parts: [&[u8]; 4] = [prefix, zone, b":", &n];
                let key = parts.concat();
                // The slot a key with a brace-free tail would have: the configured tag if the
                // configured parts close one, else the whole key.
                let fixed = [prefix, zone, b":"].concat();
                let want = match fixed.iter().position(|&b| b == b'{') {
                    Some(o) => match fixed[o + 1..].iter().position(|&b| b == b'}') {
                        Some(len) if len > 0 => key_slot(&[&fixed[o + 1..o + 1 + len]]),
                        _ => crc16(&key) & (SLOTS - 1),
                    },
                    None => crc16(&key) & (SLOTS - 1),
                };
                assert_eq!(key_slot(&parts), want, "{key:?}");
            }
        }
        // Without neutralization a value does choose: the check above is not vacuous.
        let raw: [&[u8]; 4] = [b"rl:", b"api", b":", b"{victim}"];
        assert_eq!(key_slot(&raw), key_slot(&[b"victim"]));
        let escaped = neutralize_braces(b"{victim}");
        let parts: [&[u8]; 4] = [b"rl:", b"api", b":", &escaped];
        assert_eq!(key_slot(&parts), crc16(b"rl:api:%7Bvictim%7D") & (SLOTS - 1));
    }
}

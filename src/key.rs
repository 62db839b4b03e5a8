//! Redis key building: `<prefix><zone>:<key>`.

/// Keys longer than this are replaced by their SHA-1, so one client cannot make every decision
/// carry (and Redis store) a huge key.
pub const MAX_RAW_KEY: usize = 4096;

/// Appends the Redis key for `value` in `zone` to `out`.
pub fn build(out: &mut Vec<u8>, prefix: &[u8], zone: &[u8], value: &[u8]) {
    out.reserve(prefix.len() + zone.len() + 1 + value.len().min(40));
    out.extend_from_slice(prefix);
    out.extend_from_slice(zone);
    out.push(b':');
    if value.len() > MAX_RAW_KEY {
        out.extend_from_slice(&crate::script::sha1_hex(value));
    } else {
        out.extend_from_slice(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keys_are_kept_raw() {
        let mut k = Vec::new();
        build(&mut k, b"rl:", b"api", b"consumer\r\n42");
        assert_eq!(k, b"rl:api:consumer\r\n42");
    }

    #[test]
    fn long_keys_are_hashed() {
        let value = vec![b'x'; MAX_RAW_KEY + 1];
        let mut k = Vec::new();
        build(&mut k, b"rl:", b"api", &value);
        assert_eq!(k.len(), "rl:api:".len() + 40);
        assert_eq!(&k[7..], &crate::script::sha1_hex(&value));
        let mut exact = Vec::new();
        build(&mut exact, b"", b"z", &value[..MAX_RAW_KEY]);
        assert_eq!(exact.len(), 2 + MAX_RAW_KEY);
    }
}

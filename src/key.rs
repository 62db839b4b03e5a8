//! Redis key building: `<prefix><zone>:<key>`, or the key value alone (`exact_key=on`, for keys
//! another limiter writes).

/// Keys longer than this are replaced by their SHA-1, so one client cannot make every decision
/// carry (and Redis store) a huge key.
pub const MAX_RAW_KEY: usize = 4096;

/// The Redis key of one zone for one request, kept as its parts so that it is written once,
/// straight into the command, without being assembled in a buffer of its own first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key<'a> {
    prefix: &'a [u8],
    zone: &'a [u8],
    sep: &'static [u8],
    value: Value<'a>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value<'a> {
    Raw(&'a [u8]),
    Hashed([u8; 40]),
}

impl<'a> Key<'a> {
    pub fn new(prefix: &'a [u8], zone: &'a [u8], value: &'a [u8]) -> Self {
        let value = if value.len() > MAX_RAW_KEY {
            Value::Hashed(crate::script::sha1_hex(value))
        } else {
            Value::Raw(value)
        };
        Key { prefix, zone, sep: b":", value }
    }

    /// The value is the whole key: no prefix, no zone name.
    pub fn exact(value: &'a [u8]) -> Self {
        Key { sep: b"", ..Key::new(b"", b"", value) }
    }

    /// The key's bytes, in order.
    pub fn parts(&self) -> [&[u8]; 4] {
        [self.prefix, self.zone, self.sep, self.value()]
    }

    /// The value as given, unless it was too long and replaced by its SHA-1.
    pub fn raw(&self) -> Option<&[u8]> {
        match &self.value {
            Value::Raw(v) => Some(v),
            Value::Hashed(_) => None,
        }
    }

    /// The part that identifies the client: the value as given, or its SHA-1 when too long.
    pub fn value(&self) -> &[u8] {
        match &self.value {
            Value::Raw(v) => v,
            Value::Hashed(h) => &h[..],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(k: &Key<'_>) -> Vec<u8> {
        k.parts().concat()
    }

    #[test]
    fn short_keys_are_kept_raw() {
        assert_eq!(bytes(&Key::new(b"rl:", b"api", b"consumer\r\n42")), b"rl:api:consumer\r\n42");
    }

    #[test]
    fn exact_keys_are_the_value_alone() {
        assert_eq!(bytes(&Key::exact(b"rl:sw:consumer-42")), b"rl:sw:consumer-42");
        let value = vec![b'x'; MAX_RAW_KEY + 1];
        assert_eq!(bytes(&Key::exact(&value)), crate::script::sha1_hex(&value));
    }

    #[test]
    fn long_keys_are_hashed() {
        let value = vec![b'x'; MAX_RAW_KEY + 1];
        let k = bytes(&Key::new(b"rl:", b"api", &value));
        assert_eq!(k.len(), "rl:api:".len() + 40);
        assert_eq!(&k[7..], &crate::script::sha1_hex(&value));
        let exact = bytes(&Key::new(b"", b"z", &value[..MAX_RAW_KEY]));
        assert_eq!(exact.len(), 2 + MAX_RAW_KEY);
    }
}

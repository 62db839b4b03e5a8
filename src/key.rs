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

/// A piece of a key template, for Redis Cluster: the braces written in the configuration are
/// the only ones that may make a hash tag, so they are kept apart from the text around them,
/// whose variables' values are escaped ([`crate::redis::slot::neutralize_braces`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Text with variables, evaluated per request.
    Text(&'a [u8]),
    Brace(u8),
}

/// Splits a template at its literal braces; `${name}` is a variable, not braces. `None` when
/// it has no literal brace.
pub fn split_braces(template: &[u8]) -> Option<Vec<Piece<'_>>> {
    let mut pieces = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < template.len() {
        match template[i] {
            b'$' if template.get(i + 1) == Some(&b'{') => {
                i +=
                    template[i..].iter().position(|&b| b == b'}').map_or(template.len(), |n| n + 1);
                continue;
            }
            b @ (b'{' | b'}') => {
                if start < i {
                    pieces.push(Piece::Text(&template[start..i]));
                }
                pieces.push(Piece::Brace(b));
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    if pieces.is_empty() {
        return None;
    }
    if start < template.len() {
        pieces.push(Piece::Text(&template[start..]));
    }
    Some(pieces)
}

/// The part of a key template that chooses its Cluster slot: the text between its first pair of
/// literal braces, if any. Two zones whose templates have the same one always share a slot.
pub fn tag_template(template: &[u8]) -> Option<Vec<u8>> {
    let pieces = split_braces(template)?;
    let open = pieces.iter().position(|p| *p == Piece::Brace(b'{'))?;
    let mut tag = Vec::new();
    for piece in &pieces[open + 1..] {
        match piece {
            Piece::Text(t) => tag.extend_from_slice(t),
            Piece::Brace(b'}') => return (!tag.is_empty()).then_some(tag),
            Piece::Brace(b) => tag.push(*b),
        }
    }
    None
}

/// Whether `prefix` holds a hash tag of its own: then every key is in the slot of that tag.
pub fn prefix_tag(prefix: &[u8]) -> bool {
    let Some(open) = prefix.iter().position(|&b| b == b'{') else { return false };
    prefix[open + 1..].iter().position(|&b| b == b'}').is_some_and(|n| n > 0)
}

/// A key value for Redis Cluster from its evaluated pieces: each evaluated text escaped so that
/// request data never makes or breaks a hash tag, the configured braces as written.
pub fn cluster_value<'a>(pieces: impl Iterator<Item = Piece<'a>>) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(t) => out.extend_from_slice(&crate::redis::slot::neutralize_braces(t)),
            Piece::Brace(b) => out.push(b),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::slot::key_slot;

    #[test]
    fn templates_split_at_literal_braces_only() {
        use Piece::*;
        assert_eq!(split_braces(b"$http_x_api_key"), None);
        assert_eq!(split_braces(b"${http_x_api_key}:x"), None);
        assert_eq!(
            split_braces(b"{$http_x_api_key}:$uri"),
            Some(vec![Brace(b'{'), Text(b"$http_x_api_key"), Brace(b'}'), Text(b":$uri")])
        );
        assert_eq!(
            split_braces(b"a{${v}}"),
            Some(vec![Text(b"a"), Brace(b'{'), Text(b"${v}"), Brace(b'}')])
        );
    }

    #[test]
    fn tags_of_templates() {
        assert_eq!(tag_template(b"{$arg_k}"), Some(b"$arg_k".to_vec()));
        assert_eq!(tag_template(b"x{$arg_k}:{$uri}"), Some(b"$arg_k".to_vec()));
        assert_eq!(tag_template(b"{}$arg_k"), None);
        assert_eq!(tag_template(b"${arg_k}"), None);
        assert_eq!(tag_template(b"{${arg_k}"), None);
        assert!(prefix_tag(b"{rl}:"));
        assert!(!prefix_tag(b"rl:"));
        assert!(!prefix_tag(b"{}rl:"));
    }

    #[test]
    fn request_data_never_chooses_the_slot() {
        use Piece::*;
        // The configured tag holds: a value with braces is escaped inside it.
        let evil = cluster_value([Brace(b'{'), Text(b"al}ice{x}"), Brace(b'}')].into_iter());
        assert_eq!(evil, b"{al%7Dice%7Bx%7D}");
        let slot = key_slot(&[b"rl:", b"api", b":", &evil]);
        assert_eq!(slot, key_slot(&[b"al%7Dice%7Bx%7D"]));
        // Without a configured tag the whole key is hashed, whatever the value holds.
        let plain = cluster_value([Text(b"{victim}")].into_iter());
        assert_eq!(key_slot(&[b"rl:api:", &plain]), key_slot(&[b"rl:api:%7Bvictim%7D"]));
        assert_ne!(key_slot(&[b"rl:api:", &plain]), key_slot(&[b"victim"]));
        // Two zones with the same configured tag share a slot.
        let a = cluster_value([Brace(b'{'), Text(b"alice"), Brace(b'}')].into_iter());
        assert_eq!(key_slot(&[b"rl:", b"per_min", b":", &a]), key_slot(&[b"rl:per_day:", &a]));
    }

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

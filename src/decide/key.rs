//! Redis key building: `<prefix><zone>:<key>`, or the key value alone (`exact_key=on`, for keys
//! another limiter writes).

use crate::codec::values::one_variable;

/// Key values longer than this are shortened ([`shorten`]), so one client cannot make every
/// decision carry (and Redis store) a huge key.
pub const MAX_RAW_KEY: usize = 4096;

/// The Redis key of one zone for one request, kept as its parts so that it is written once,
/// straight into the command, without being assembled in a buffer of its own first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key<'a> {
    prefix: &'a [u8],
    zone: &'a [u8],
    sep: &'static [u8],
    value: &'a [u8],
}

impl<'a> Key<'a> {
    /// `value` as stored: already [`shorten`]ed where it was too long.
    pub fn new(prefix: &'a [u8], zone: &'a [u8], value: &'a [u8]) -> Self {
        Key { prefix, zone, sep: b":", value }
    }

    /// The value is the whole key: no prefix, no zone name.
    pub fn exact(value: &'a [u8]) -> Self {
        Key { prefix: b"", zone: b"", sep: b"", value }
    }

    /// The key's bytes, in order.
    pub fn parts(&self) -> [&'a [u8]; 4] {
        [self.prefix, self.zone, self.sep, self.value]
    }

    /// The part that identifies the client.
    pub fn value(&self) -> &[u8] {
        self.value
    }
}

/// The literal text a key template starts with, up to its first variable or brace: the part an
/// ACL key pattern (`~rl:*`) or an operator's `SCAN` matches on, so a shortened value keeps it.
/// `%` ends it too, as Cluster escaping would change it.
pub fn literal_head(template: &[u8]) -> &[u8] {
    let end = template.iter().position(|&b| matches!(b, b'$' | b'{' | b'}' | b'%'));
    &template[..end.unwrap_or(template.len())]
}

/// A key value too long to store as it is, shortened; `None` when it is short enough.
///
/// It becomes the template's literal head, then (`keep_tag`: Redis Cluster) its hash tag, then
/// the SHA-1 of the whole value. The head keeps an exact key inside the ACL's key pattern; the
/// tag keeps the key in its slot, so zones that share a tag still share a slot. A tag itself
/// too long is replaced by its own SHA-1: then every value holding it is too long as well, and
/// all of them shorten it alike.
pub fn shorten(value: &[u8], template: &[u8], keep_tag: bool) -> Option<Vec<u8>> {
    if value.len() <= MAX_RAW_KEY {
        return None;
    }
    let head = literal_head(template);
    // The value starts with the template's literal text, as nginx copies it verbatim.
    let head = if value.starts_with(head) { head } else { b"" };
    let mut out = Vec::with_capacity(head.len() + MAX_RAW_KEY + 43);
    out.extend_from_slice(head);
    if let Some(tag) = keep_tag.then(|| crate::codec::slot::hash_tag(value)).flatten() {
        out.push(b'{');
        if tag.len() <= MAX_RAW_KEY {
            out.extend_from_slice(tag);
        } else {
            out.extend_from_slice(&crate::codec::call::sha1_hex(tag));
        }
        out.push(b'}');
    }
    out.extend_from_slice(&crate::codec::call::sha1_hex(value));
    Some(out)
}

/// The value a request would have for zone `template` when its one variable is `given`: what
/// `ratelimit_admin`'s `key=` names. Cluster-escaped like a request's (`escape`). `None` when
/// the template does not hold exactly one variable ([`one_variable`]).
pub fn substitute(template: &[u8], given: &[u8], escape: bool) -> Option<Vec<u8>> {
    let (start, end) = one_variable(template)?;
    // The template's bytes from..to, with `given` where the variable is.
    let fill = |from: usize, to: usize| -> Vec<u8> {
        if from <= start && end <= to {
            [&template[from..start], given, &template[end..to]].concat()
        } else {
            template[from..to].to_vec()
        }
    };
    if !escape {
        return Some(fill(0, template.len()));
    }
    // The template's own braces stay braces; the text around them is escaped as a request's.
    let pieces = split_braces(template).unwrap_or_else(|| vec![Piece::Text(template)]);
    let base = template.as_ptr() as usize;
    let texts: Vec<Option<Vec<u8>>> = pieces
        .iter()
        .map(|p| match p {
            Piece::Text(t) => {
                let from = t.as_ptr() as usize - base;
                Some(fill(from, from + t.len()))
            }
            Piece::Brace(_) => None,
        })
        .collect();
    Some(cluster_value(pieces.iter().zip(&texts).map(|(p, t)| match t {
        Some(t) => Piece::Text(t),
        None => *p,
    })))
}

/// `%XX` sequences decoded, as an operator writes a key with reserved characters in a query
/// string; anything else (`+` included) is kept as it is.
pub fn percent_decode(s: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' && i + 2 < s.len() {
            if let (Some(h), Some(l)) = (hex(s[i + 1]), hex(s[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    out
}

/// A piece of a key template, for Redis Cluster: the braces written in the configuration are
/// the only ones that may make a hash tag, so they are kept apart from the text around them,
/// whose variables' values are escaped ([`crate::codec::slot::neutralize_braces`]).
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
            Piece::Text(t) => out.extend_from_slice(&crate::codec::slot::neutralize_braces(t)),
            Piece::Brace(b) => out.push(b),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::slot::key_slot;
    use Piece::*;

    #[test]
    fn templates_split_at_literal_braces_only() {
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
    fn keys_are_their_parts() {
        assert_eq!(bytes(&Key::new(b"rl:", b"api", b"consumer\r\n42")), b"rl:api:consumer\r\n42");
        assert_eq!(bytes(&Key::exact(b"rl:sw:consumer-42")), b"rl:sw:consumer-42");
    }

    #[test]
    fn short_values_are_kept() {
        assert_eq!(shorten(&[b'x'; MAX_RAW_KEY], b"$arg_k", true), None);
    }

    #[test]
    fn long_values_are_hashed_behind_the_literal_head() {
        let sha = |v: &[u8]| crate::codec::call::sha1_hex(v).to_vec();
        let value = [b"rl:sw:".as_slice(), &[b'a'; 5000]].concat();
        // An exact key stays inside the ACL's `~rl:*` (issue: a client opened the breaker).
        let short = shorten(&value, b"rl:sw:$arg_id", false).unwrap();
        assert_eq!(short, [b"rl:sw:".as_slice(), &sha(&value)].concat());
        assert!(short.starts_with(b"rl:"));
        // No literal head: the bare SHA-1, as keys written before have it.
        let plain = vec![b'x'; MAX_RAW_KEY + 1];
        assert_eq!(shorten(&plain, b"$http_x_key", false).unwrap(), sha(&plain));
        assert_eq!(literal_head(b"cr:{$arg_k}"), b"cr:");
        assert_eq!(literal_head(b"a%b$c"), b"a");
    }

    #[test]
    fn long_values_keep_their_cluster_slot() {
        let tagged = |tag: &[u8], rest: &[u8]| {
            cluster_value([Brace(b'{'), Text(tag), Brace(b'}'), Text(rest)].into_iter())
        };
        let slot = |zone: &[u8], value: &[u8], template: &[u8]| {
            let short = shorten(value, template, true);
            key_slot(&[b"rl:", zone, b":", short.as_deref().unwrap_or(value)])
        };
        // `key={$http_x_key}` and `key={$http_x_key}:$uri` in one location: escaping triples
        // 1,000 braces, past the limit only with the URI; both zones stay in one slot.
        let tag = vec![b'{'; 1000];
        let (a, b) = (tagged(&tag, b""), tagged(&tag, &[b'u'; 2000]));
        assert!(a.len() <= MAX_RAW_KEY && b.len() > MAX_RAW_KEY);
        assert_eq!(slot(b"min", &a, b"{$k}"), slot(b"day", &b, b"{$k}:$uri"));
        assert_eq!(slot(b"day", &b, b"{$k}:$uri"), key_slot(&[&a]));
        // 1,400 braces: the tag alone is too long, hashed alike in both zones.
        let tag = vec![b'{'; 1400];
        let (a, b) = (tagged(&tag, b""), tagged(&tag, b":/x"));
        assert_eq!(slot(b"min", &a, b"{$k}"), slot(b"day", &b, b"{$k}:$uri"));
        assert!(shorten(&a, b"{$k}", true).unwrap().len() < 100);
        // Without Cluster, no tag is kept.
        assert_eq!(shorten(&a, b"{$k}", false).unwrap().len(), 40);
    }

    #[test]
    fn admin_values_are_what_requests_evaluate() {
        assert_eq!(substitute(b"cr:$arg_k", b"bob", false).unwrap(), b"cr:bob");
        assert_eq!(substitute(b"$consumer", b"bo{b", false).unwrap(), b"bo{b");
        // Cluster: the template's braces make the tag, the given value is escaped.
        assert_eq!(substitute(b"{$arg_k}", b"bob", true).unwrap(), b"{bob}");
        assert_eq!(substitute(b"x{$arg_k}:y", b"b}o%b", true).unwrap(), b"x{b%7Do%25b}:y");
        assert_eq!(substitute(b"$arg_k", b"{b}", true).unwrap(), b"%7Bb%7D");
        assert_eq!(percent_decode(b"a%20b%2Bc+%zz%4"), b"a b+c+%zz%4");
    }

    #[test]
    fn slot_of_a_key_from_its_parts() {
        use crate::codec::slot::{crc16, neutralize_braces, SLOTS};
        assert_eq!(key_slot(&Key::new(b"rl:", b"api", b"consumer-42").parts()), 14017);
        assert_eq!(key_slot(&Key::new(b"{rl}:", b"api", b"x").parts()), 785);
        assert_eq!(key_slot(&Key::exact(b"{user1000}.followers").parts()), 3443);
        let value = neutralize_braces(b"{user1000}");
        let key = Key::new(b"rl:", b"api", &value);
        assert_eq!(key_slot(&key.parts()), crc16(b"rl:api:%7Buser1000%7D") & (SLOTS - 1));
    }
}

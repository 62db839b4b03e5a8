//! The Redis script call: the script text and its hash, the command that carries one decision,
//! and the decoding of the script's reply into a decision.

use crate::key::Key;
use crate::redis::resp::{self, Reply};

/// The sliding-window log script, the single source of truth for the algorithm.
pub const SLIDING_LOG: &str = include_str!("../lua/sliding_log.lua");

/// Hex SHA-1 of a script body, as `EVALSHA` expects it.
pub fn sha1_hex(body: &[u8]) -> [u8; 40] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = [0u8; 40];
    for (i, b) in sha1_smol::Sha1::from(body).digest().bytes().iter().enumerate() {
        hex[2 * i] = DIGITS[usize::from(b >> 4)];
        hex[2 * i + 1] = DIGITS[usize::from(b & 0xf)];
    }
    hex
}

/// Appends `SCRIPT LOAD body`.
pub fn write_script_load(out: &mut Vec<u8>, body: &[u8]) {
    resp::put_array_len(out, 3);
    resp::put_bulk(out, b"SCRIPT");
    resp::put_bulk(out, b"LOAD");
    resp::put_bulk(out, body);
}

/// One zone's share of a decision's arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoneArgs<'a> {
    pub key: Key<'a>,
    pub limit: u64,
    pub window_ms: u64,
}

/// The arguments of a decision after the script reference, RESP-encoded once so that a
/// `NOSCRIPT` retry with `EVAL` reuses them unchanged: `numkeys key.. now member (limit window)..`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedArgs {
    bytes: Vec<u8>,
    count: usize,
}

impl EncodedArgs {
    /// `now_ms` is `None` for `clock=redis`: the script then reads Redis `TIME`.
    pub fn new(zones: &[ZoneArgs<'_>], now_ms: Option<u64>, member: &[u8]) -> Self {
        let key_len = |z: &ZoneArgs<'_>| z.key.parts().iter().map(|p| p.len()).sum::<usize>();
        let mut bytes = Vec::with_capacity(
            64 + member.len() + zones.iter().map(|z| key_len(z) + 64).sum::<usize>(),
        );
        resp::put_bulk_int(&mut bytes, zones.len() as u64);
        for z in zones {
            resp::put_bulk_parts(&mut bytes, &z.key.parts());
        }
        match now_ms {
            Some(now) => resp::put_bulk_int(&mut bytes, now),
            None => resp::put_bulk(&mut bytes, b""),
        }
        resp::put_bulk(&mut bytes, member);
        for z in zones {
            resp::put_bulk_int(&mut bytes, z.limit);
            resp::put_bulk_int(&mut bytes, z.window_ms);
        }
        EncodedArgs { bytes, count: 1 + zones.len() * 3 + 2 }
    }

    /// Appends `EVALSHA sha <args>` to a connection's output buffer.
    pub fn write_evalsha(&self, out: &mut Vec<u8>, sha: &[u8; 40]) {
        self.write(out, b"EVALSHA", sha);
    }

    /// Appends `EVAL body <args>`, the fallback when Redis has lost the script.
    pub fn write_eval(&self, out: &mut Vec<u8>, body: &[u8]) {
        self.write(out, b"EVAL", body);
    }

    fn write(&self, out: &mut Vec<u8>, verb: &[u8], script: &[u8]) {
        resp::put_array_len(out, 2 + self.count);
        resp::put_bulk(out, verb);
        resp::put_bulk(out, script);
        out.extend_from_slice(&self.bytes);
    }
}

/// What one zone said about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZoneVerdict {
    pub ok: bool,
    pub remaining: u64,
    pub reset_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub zones: Vec<ZoneVerdict>,
}

impl Decision {
    /// The zone that describes the decision in headers and variables: on rejection the rejecting
    /// zone with the longest wait, otherwise the zone with the least remaining.
    pub fn deciding_zone(&self) -> usize {
        let mut best = 0;
        for (i, z) in self.zones.iter().enumerate() {
            let b = &self.zones[best];
            let better = if self.allowed {
                z.remaining < b.remaining
            } else {
                !z.ok && (b.ok || z.reset_ms > b.reset_ms)
            };
            if better {
                best = i;
            }
        }
        best
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    /// Redis no longer has the script cached; retry with `EVAL`.
    NoScript,
    /// An error reply, such as `WRONGTYPE` when someone else's data sits under our key.
    Redis(String),
    /// A reply that is not what the script returns.
    Unexpected,
}

/// Reads the script's reply for a decision over `zones` zones.
pub fn decode_decision(reply: &Reply, zones: usize) -> Result<Decision, ReplyError> {
    let items = match reply {
        Reply::Error(msg) if msg.starts_with(b"NOSCRIPT") => return Err(ReplyError::NoScript),
        Reply::Error(msg) => return Err(ReplyError::Redis(String::from_utf8_lossy(msg).into())),
        Reply::Array(Some(items)) if items.len() == 1 + 3 * zones && zones > 0 => items,
        _ => return Err(ReplyError::Unexpected),
    };
    let int = |i: usize| match items[i] {
        Reply::Int(v) if v >= 0 => Ok(v as u64),
        _ => Err(ReplyError::Unexpected),
    };
    let allowed = match int(0)? {
        0 => false,
        1 => true,
        _ => return Err(ReplyError::Unexpected),
    };
    let zones = (0..zones)
        .map(|z| {
            Ok(ZoneVerdict {
                ok: int(1 + 3 * z)? == 1,
                remaining: int(2 + 3 * z)?,
                reset_ms: int(3 + 3 * z)?,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if allowed && zones.iter().any(|z| !z.ok) {
        return Err(ReplyError::Unexpected);
    }
    Ok(Decision { allowed, zones })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha_matches_redis_script_load() {
        // `redis-cli SCRIPT LOAD "return 1"` answers this hash.
        assert_eq!(&sha1_hex(b"return 1"), b"e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
        assert_eq!(sha1_hex(SLIDING_LOG.as_bytes()).len(), 40);
    }

    #[test]
    fn evalsha_and_eval_carry_the_same_args() {
        let zones =
            [ZoneArgs { key: Key::new(b"rl:", b"api", b"a"), limit: 100, window_ms: 60_000 }];
        let args = EncodedArgs::new(&zones, Some(1_700_000_000_123), b"0123abcd");
        let mut sha_cmd = Vec::new();
        args.write_evalsha(&mut sha_cmd, &[b'f'; 40]);
        let want = redis::cmd("EVALSHA")
            .arg(&[b'f'; 40][..])
            .arg(1)
            .arg("rl:api:a")
            .arg(1_700_000_000_123u64)
            .arg("0123abcd")
            .arg(100)
            .arg(60_000)
            .get_packed_command();
        assert_eq!(sha_cmd, want);

        let mut eval_cmd = Vec::new();
        args.write_eval(&mut eval_cmd, b"return 1");
        let want = redis::cmd("EVAL")
            .arg("return 1")
            .arg(1)
            .arg("rl:api:a")
            .arg(1_700_000_000_123u64)
            .arg("0123abcd")
            .arg(100)
            .arg(60_000)
            .get_packed_command();
        assert_eq!(eval_cmd, want);
    }

    #[test]
    fn script_load() {
        let mut out = Vec::new();
        write_script_load(&mut out, b"return 1");
        assert_eq!(out, redis::cmd("SCRIPT").arg("LOAD").arg("return 1").get_packed_command());
    }

    #[test]
    fn redis_clock_sends_an_empty_now() {
        let zones = [ZoneArgs { key: Key::new(b"", b"z", b"k"), limit: 1, window_ms: 1 }];
        let mut cmd = Vec::new();
        EncodedArgs::new(&zones, None, b"m").write_evalsha(&mut cmd, &[b'0'; 40]);
        assert!(cmd.windows(6).any(|w| w == b"$0\r\n\r\n"));
    }

    fn ints(v: &[i64]) -> Reply {
        Reply::Array(Some(v.iter().map(|&i| Reply::Int(i)).collect()))
    }

    #[test]
    fn decodes_allow_and_deny() {
        let d = decode_decision(&ints(&[1, 1, 41, 17_000]), 1).unwrap();
        assert_eq!(
            d,
            Decision {
                allowed: true,
                zones: vec![ZoneVerdict { ok: true, remaining: 41, reset_ms: 17_000 }]
            }
        );
        let d = decode_decision(&ints(&[0, 1, 5, 100, 0, 0, 900, 0, 0, 1200]), 3).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.deciding_zone(), 2);
        let d = decode_decision(&ints(&[1, 1, 5, 100, 1, 2, 900]), 2).unwrap();
        assert_eq!(d.deciding_zone(), 1);
    }

    #[test]
    fn rejects_bad_replies() {
        assert_eq!(
            decode_decision(&Reply::Error(b"NOSCRIPT No matching script".to_vec()), 1),
            Err(ReplyError::NoScript)
        );
        assert_eq!(
            decode_decision(&Reply::Error(b"WRONGTYPE Operation".to_vec()), 1),
            Err(ReplyError::Redis("WRONGTYPE Operation".into()))
        );
        for bad in
            [ints(&[1, 1, 2]), ints(&[2, 1, 2, 3]), ints(&[1, 0, 2, 3]), ints(&[1, 1, -2, 3])]
        {
            assert_eq!(decode_decision(&bad, 1), Err(ReplyError::Unexpected), "{bad:?}");
        }
        assert_eq!(decode_decision(&Reply::Bulk(None), 1), Err(ReplyError::Unexpected));
    }
}

//! The properties the RESP decoder must have on any input, shared by the libFuzzer target
//! (`fuzz_targets/resp.rs`) and the libFuzzer-free driver (`src/bin/resp_prop.rs`).
//!
//! Expects a sibling module `resp` (src/codec/resp/mod.rs, compiled in by `#[path]`).

use super::resp::{
    decode, Framer, ProtocolError, Reply, View, MAX_BULK_LEN, MAX_REPLY_LEN,
};

/// What a reader makes of a byte stream: the replies it framed (with the bytes each used) and
/// how it stopped: `Ok(())` waiting for more bytes, `Err(e)` on a protocol error.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    pub replies: Vec<(Reply, usize)>,
    pub end: Result<(), ProtocolError>,
    pub consumed: usize,
}

/// Decodes replies one after another from the whole buffer, as if it had arrived in one read.
pub fn whole(data: &[u8]) -> Outcome {
    let mut out = Outcome { replies: Vec::new(), end: Ok(()), consumed: 0 };
    loop {
        let rest = &data[out.consumed..];
        match decode(rest) {
            Ok(Some((reply, n))) => {
                assert!(n > 0, "a reply of zero bytes");
                assert!(n <= rest.len(), "used {n} bytes of {}", rest.len());
                out.replies.push((reply, n));
                out.consumed += n;
            }
            Ok(None) => return out,
            Err(e) => {
                out.end = Err(e);
                return out;
            }
        }
    }
}

/// Feeds the buffer in chunks cut at `cuts` (sorted, within 0..=len), framing after each read
/// from where the last one stopped and dropping what was used, as `Conn::read` does on nginx's
/// event loop.
pub fn incremental(data: &[u8], cuts: &[usize]) -> Outcome {
    let mut out = Outcome { replies: Vec::new(), end: Ok(()), consumed: 0 };
    let mut inbuf: Vec<u8> = Vec::new();
    let mut framer = Framer::default();
    let mut from = 0;
    for &to in cuts.iter().chain(core::iter::once(&data.len())) {
        let to = to.clamp(from, data.len());
        inbuf.extend_from_slice(&data[from..to]);
        from = to;
        loop {
            match framer.frame(&inbuf, MAX_REPLY_LEN) {
                Ok(Some(n)) => {
                    // Framed, then read where it lies, as `Conn::read` hands replies on.
                    let reply = View::of(&inbuf[..n]).to_reply().expect("a framed reply reads");
                    assert!(n > 0 && n <= inbuf.len());
                    out.replies.push((reply, n));
                    out.consumed += n;
                    inbuf.drain(..n);
                }
                Ok(None) => break,
                Err(e) => {
                    out.end = Err(e);
                    return out;
                }
            }
        }
    }
    out
}

/// The shortest RESP2 text of a reply.
pub fn encode(r: &Reply, out: &mut Vec<u8>) {
    match r {
        Reply::Status(s) => {
            out.push(b'+');
            out.extend_from_slice(s);
            out.extend_from_slice(b"\r\n");
        }
        Reply::Error(s) => {
            out.push(b'-');
            out.extend_from_slice(s);
            out.extend_from_slice(b"\r\n");
        }
        Reply::Int(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
        Reply::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
        Reply::Bulk(Some(b)) => {
            out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
            out.extend_from_slice(b);
            out.extend_from_slice(b"\r\n");
        }
        Reply::Array(None) => out.extend_from_slice(b"*-1\r\n"),
        Reply::Array(Some(items)) => {
            out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
            for i in items {
                encode(i, out);
            }
        }
    }
}

fn check_reply(r: &Reply) {
    match r {
        Reply::Status(s) | Reply::Error(s) => assert!(!s.contains(&b'\n')),
        Reply::Bulk(Some(b)) => assert!(b.len() <= MAX_BULK_LEN),
        Reply::Array(Some(items)) => items.iter().for_each(check_reply),
        _ => {}
    }
}

/// All properties for one input and one set of cut points:
/// - `decode` never panics, and a reply uses between 1 and the available bytes;
/// - reading the input in chunks (cut at `cuts`) frames exactly the replies, with the same
///   lengths, and stops the same way (same error, or waiting) as decoding it whole;
/// - with `every_cut`, the same holds for a single cut at every position and for a byte-by-byte
///   read (every position cut at once);
/// - every framed reply re-encodes (shortest form) to bytes that decode to the same reply, and
///   no longer than the bytes it was read from; no bulk string exceeds MAX_BULK_LEN.
pub fn check(data: &[u8], cuts: &[usize], every_cut: bool) {
    let want = whole(data);
    let mut cuts: Vec<usize> = cuts.iter().map(|&c| c.min(data.len())).collect();
    cuts.sort_unstable();
    cuts.dedup();
    assert_eq!(incremental(data, &cuts), want, "cuts {cuts:?}");
    if every_cut {
        for k in 0..=data.len() {
            assert_eq!(incremental(data, &[k]), want, "cut at {k}");
        }
        let all: Vec<usize> = (1..data.len()).collect();
        assert_eq!(incremental(data, &all), want, "byte by byte");
    }
    for (reply, n) in &want.replies {
        check_reply(reply);
        let mut enc = Vec::new();
        encode(reply, &mut enc);
        assert!(enc.len() <= *n, "canonical form longer than the input: {reply:?}");
        assert_eq!(decode(&enc), Ok(Some((reply.clone(), enc.len()))), "round trip {reply:?}");
    }
}

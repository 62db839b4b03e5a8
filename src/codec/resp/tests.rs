//! The RESP codec against the redis crate's encoder and parser, and against cut, corrupt and
//! oversized input.

use super::*;

#[test]
fn master_addr_replies() {
    let bulk = |s: &str| Reply::Bulk(Some(s.as_bytes().to_vec()));
    let arr = |v: Vec<Reply>| Reply::Array(Some(v));
    assert_eq!(
        master_addr(&arr(vec![bulk("127.0.0.1"), bulk("6390")])),
        MasterAddr::Addr("127.0.0.1:6390".into())
    );
    assert_eq!(
        master_addr(&arr(vec![bulk("::1"), bulk("6390")])),
        MasterAddr::Addr("::1:6390".into())
    );
    assert_eq!(master_addr(&Reply::Array(None)), MasterAddr::Unknown);
    assert_eq!(master_addr(&Reply::Bulk(None)), MasterAddr::Unknown);
    assert_eq!(master_addr(&arr(vec![bulk("127.0.0.1")])), MasterAddr::Other);
    assert_eq!(master_addr(&arr(vec![bulk("h"), bulk("x1")])), MasterAddr::Other);
    assert_eq!(master_addr(&Reply::Error(b"ERR no".to_vec())), MasterAddr::Other);
    assert_eq!(command(&[b"SELECT", b"3"]), b"*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n".to_vec());
}

fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    put_array_len(&mut out, args.len());
    for a in args {
        put_bulk(&mut out, a);
    }
    out
}

#[test]
fn encoding_matches_the_redis_crate() {
    let args: [&[u8]; 5] = [b"EVALSHA", b"abc", b"1", b"rl:api:a\r\nFLUSHALL\r\n", b""];
    let mut cmd = redis::cmd("EVALSHA");
    for a in &args[1..] {
        cmd.arg(*a);
    }
    assert_eq!(encode(&args), cmd.get_packed_command());
    let mut out = Vec::new();
    put_bulk_int(&mut out, 18446744073709551615);
    put_bulk_int(&mut out, 0);
    assert_eq!(out, b"$20\r\n18446744073709551615\r\n$1\r\n0\r\n");
}

/// Integers of every length, across the one- and two-digit length prefix, as `put_bulk` and the
/// `redis` crate write them.
#[test]
fn integers_of_every_length_match_the_redis_crate() {
    let mut p = 1u64;
    let mut values = vec![0, u64::MAX];
    while let Some(next) = p.checked_mul(10) {
        values.extend([p - 1, p, next - 1]);
        p = next;
    }
    for v in values {
        let (mut ours, mut plain) = (Vec::new(), Vec::new());
        put_bulk_int(&mut ours, v);
        put_bulk(&mut plain, v.to_string().as_bytes());
        assert_eq!(ours, plain, "{v}");
        let mut cmd = redis::cmd("X");
        cmd.arg(v);
        assert!(cmd.get_packed_command().ends_with(&ours), "{v}");
    }
}

/// Pieces, empty ones among them, are written as their join; lengths of every size as text.
#[test]
fn pieces_and_lengths_are_written_as_one_argument() {
    let (mut parts, mut joined) = (Vec::new(), Vec::new());
    put_bulk_parts(&mut parts, &[b"", b"rl:", b"", b"api", b":", b"a\r\n"]);
    put_bulk(&mut joined, b"rl:api:a\r\n");
    assert_eq!(parts, joined);
    assert_eq!(parts, b"$10\r\nrl:api:a\r\n\r\n");
    for n in [0, 9, 10, 99, 100, 65_536, usize::MAX] {
        let mut out = Vec::new();
        put_array_len(&mut out, n);
        assert_eq!(out, format!("*{n}\r\n").as_bytes());
    }
}

#[test]
fn decodes_every_type() {
    let cases: Vec<(&[u8], Reply)> = vec![
        (b"+OK\r\n", Reply::Status(b"OK".to_vec())),
        (
            b"-NOSCRIPT No matching script\r\n",
            Reply::Error(b"NOSCRIPT No matching script".to_vec()),
        ),
        (b":-42\r\n", Reply::Int(-42)),
        (b"$3\r\na\r\n\r\n", Reply::Bulk(Some(b"a\r\n".to_vec()))),
        (b"$-1\r\n", Reply::Bulk(None)),
        (b"*-1\r\n", Reply::Array(None)),
        (
            b"*3\r\n:1\r\n*1\r\n$0\r\n\r\n+x\r\n",
            Reply::Array(Some(vec![
                Reply::Int(1),
                Reply::Array(Some(vec![Reply::Bulk(Some(vec![]))])),
                Reply::Status(b"x".to_vec()),
            ])),
        ),
    ];
    for (wire, want) in cases {
        assert_eq!(decode(wire), Ok(Some((want, wire.len()))), "{wire:?}");
    }
}

#[test]
fn agrees_with_the_redis_crate_parser() {
    let wires: [&[u8]; 4] = [
        b"*4\r\n:1\r\n:1\r\n:99\r\n:60000\r\n",
        b"$5\r\nhello\r\n",
        b":9223372036854775807\r\n",
        b"*2\r\n$-1\r\n*0\r\n",
    ];
    for wire in wires {
        let ours = decode(wire).unwrap().unwrap().0;
        let theirs = redis::parse_redis_value(wire).unwrap();
        assert_eq!(to_redis_value(&ours), theirs, "{wire:?}");
    }
}

/// A view read item by item agrees with the redis crate's parser, and with the tree
/// [`decode`] builds: nested arrays, nil, empty strings and arrays, errors among the items.
#[test]
fn a_view_agrees_with_the_redis_crate_parser_and_the_tree() {
    let wires: [&[u8]; 8] = [
        b"*4\r\n:1\r\n:1\r\n:99\r\n:60000\r\n",
        b"*2\r\n*4\r\n:1\r\n:1\r\n:99\r\n:60000\r\n*4\r\n:0\r\n:0\r\n:0\r\n:1200\r\n",
        b"*3\r\n*1\r\n*2\r\n:7\r\n$-1\r\n*0\r\n*-1\r\n",
        b"$5\r\nhello\r\n",
        b"$0\r\n\r\n",
        b":-9223372036854775807\r\n",
        b"*2\r\n$-1\r\n*0\r\n",
        b"*3\r\n+PONG\r\n$3\r\na\r\n\r\n:5\r\n",
    ];
    for wire in wires {
        let view = View::of(wire);
        assert_eq!(view_to_redis_value(view), redis::parse_redis_value(wire).unwrap(), "{wire:?}");
        assert_eq!(Ok(view.to_reply().unwrap()), decode(wire).map(|r| r.unwrap().0), "{wire:?}");
    }
    // An error among a batch's items is that item's alone.
    let batch: &[u8] = b"*3\r\n:1\r\n-WRONGTYPE Operation\r\n*1\r\n:2\r\n";
    let items: Vec<View> = View::of(batch).items().unwrap().collect();
    assert_eq!(items.len(), 3);
    assert_eq!(items[1].error(), Some(&b"WRONGTYPE Operation"[..]));
    assert_eq!(items[1].bytes(), b"-WRONGTYPE Operation\r\n");
    assert_eq!(items[2].items().unwrap().next_head(), Some(Head::Int(2)));
    let mut heads = View::of(batch).items().unwrap();
    assert_eq!(heads.next_head(), Some(Head::Int(1)));
    assert_eq!(heads.next_head(), Some(Head::Error(b"WRONGTYPE Operation")));
    assert_eq!(heads.next_head(), Some(Head::Array(Some(1))));
    assert_eq!((heads.next_head(), heads.len()), (None, 0));
    // Nil and no array: no items.
    for wire in [&b"*-1\r\n"[..], b"$-1\r\n", b":1\r\n", b"-ERR x\r\n"] {
        assert!(View::of(wire).items().is_none(), "{wire:?}");
    }
    assert_eq!(View::of(b"*-1\r\n").head(), Some(Head::Array(None)));
    assert_eq!(View::of(b"$-1\r\n").head(), Some(Head::Bulk(None)));
    assert_eq!(error_reply(b"MOVED 1 :7001"), b"-MOVED 1 :7001\r\n");
}

/// Bytes no framer passed read as nothing, or as fewer items than declared, with a clear
/// error from `to_reply`: never a panic.
#[test]
fn a_view_of_bad_bytes_reads_as_nothing() {
    let cut: &[u8] = b"*3\r\n:1\r\n:2\r\n";
    let mut items = View::of(cut).items().unwrap();
    assert_eq!(items.len(), 3);
    assert_eq!(items.by_ref().count(), 2);
    assert_eq!(items.len(), 0);
    assert_eq!(View::of(cut).to_reply(), Err(ProtocolError::Truncated));
    assert_eq!(View::of(b"").head(), None);
    assert_eq!(View::of(b"").to_reply(), Err(ProtocolError::Truncated));
    assert_eq!(View::of(b"*1\r\n:x\r\n").items().unwrap().next(), None);
    assert_eq!(View::of(b"*1\r\n:x\r\n").to_reply(), Err(ProtocolError::BadInteger));
    assert_eq!(View::of(b"HTTP/1.1").head(), None);
    assert_eq!(View::of(b"$4\r\nab\r\n").head(), None);
    let deep = "*1\r\n".repeat(MAX_DEPTH + 2) + ":1\r\n";
    assert_eq!(View::of(deep.as_bytes()).items().unwrap().next(), None);
    assert_eq!(View::of(deep.as_bytes()).to_reply(), Err(ProtocolError::TooDeep));

    let base: &[u8] = b"*3\r\n*4\r\n:1\r\n:1\r\n:9\r\n:100\r\n-ERR x\r\n*2\r\n$-1\r\n*-1\r\n";
    for buf in corrupted(base, 0x51ed270b27a1f1d3) {
        let view = View::of(&buf);
        let _ = (view.head(), view.error(), view.to_reply());
        for item in view.items().into_iter().flatten() {
            let _ = (item.head(), item.items().map(|mut i| while i.next_head().is_some() {}));
        }
    }
}

fn view_to_redis_value(v: View) -> redis::Value {
    match v.head().unwrap() {
        Head::Status(s) => redis::Value::SimpleString(String::from_utf8_lossy(s).into()),
        Head::Error(_) => unreachable!("not used in the cross-check"),
        Head::Int(i) => redis::Value::Int(i),
        Head::Bulk(None) | Head::Array(None) => redis::Value::Nil,
        Head::Bulk(Some(b)) => redis::Value::BulkString(b.to_vec()),
        Head::Array(Some(n)) => {
            let items: Vec<_> = v.items().unwrap().map(view_to_redis_value).collect();
            assert_eq!(items.len(), n);
            redis::Value::Array(items)
        }
    }
}

fn to_redis_value(r: &Reply) -> redis::Value {
    match r {
        Reply::Status(s) => redis::Value::SimpleString(String::from_utf8_lossy(s).into()),
        Reply::Error(_) => unreachable!("not used in the cross-check"),
        Reply::Int(i) => redis::Value::Int(*i),
        Reply::Bulk(None) | Reply::Array(None) => redis::Value::Nil,
        Reply::Bulk(Some(b)) => redis::Value::BulkString(b.clone()),
        Reply::Array(Some(a)) => redis::Value::Array(a.iter().map(to_redis_value).collect()),
    }
}

#[test]
fn every_split_point_is_incomplete_then_whole() {
    let wire: &[u8] = b"*4\r\n:1\r\n:0\r\n$4\r\nab\r\n\r\n:17000\r\n";
    for cut in 0..wire.len() {
        assert_eq!(decode(&wire[..cut]), Ok(None), "cut at {cut}");
    }
    assert!(decode(wire).unwrap().is_some());
}

#[test]
fn pipelined_replies_are_framed_one_by_one() {
    let wire: &[u8] = b":1\r\n-ERR x\r\n*2\r\n:3\r\n:4\r\n:5";
    let mut pos = 0;
    let mut got = Vec::new();
    while let Some((r, n)) = decode(&wire[pos..]).unwrap() {
        got.push(r);
        pos += n;
    }
    assert_eq!(got.len(), 3);
    assert_eq!(got[1], Reply::Error(b"ERR x".to_vec()));
    assert_eq!(&wire[pos..], b":5");
}

/// Integers at the edges of i64 and of nineteen digits, and digits' neighbours in ASCII.
#[test]
fn integers_at_their_limits() {
    let int = |s: &str| decode(format!(":{s}\r\n").as_bytes()).map(|r| r.map(|(r, _)| r));
    for (s, v) in [
        ("0", 0),
        ("-0", 0),
        ("007", 7),
        ("9223372036854775807", i64::MAX),
        ("-9223372036854775807", -i64::MAX),
        ("1000000000000000000", 1_000_000_000_000_000_000),
    ] {
        assert_eq!(int(s), Ok(Some(Reply::Int(v))), "{s}");
    }
    for s in [
        "9223372036854775808",
        "-9223372036854775808",
        "9999999999999999999",
        "00000000000000000001",
        "",
        "-",
        "+1",
        "1-",
        "--1",
        "1/",
        "1:",
        " 1",
    ] {
        assert_eq!(int(s), Err(ProtocolError::BadInteger), "{s}");
    }
}

#[test]
fn rejects_garbage() {
    assert_eq!(decode(b"HTTP/1.1 200 OK\r\n"), Err(ProtocolError::BadType(b'H')));
    assert_eq!(decode(b":12a\r\n"), Err(ProtocolError::BadInteger));
    assert_eq!(decode(b":99999999999999999999\r\n"), Err(ProtocolError::BadInteger));
    assert_eq!(decode(b"$-2\r\n"), Err(ProtocolError::BadLength));
    assert_eq!(decode(b"$2\r\nabcd\r\n"), Err(ProtocolError::MissingCrlf));
    assert_eq!(decode(b":1\n"), Err(ProtocolError::MissingCrlf));
    assert_eq!(decode(b"\r\n"), Err(ProtocolError::BadType(b'\r')));
    assert_eq!(decode(b"$99999999\r\n"), Err(ProtocolError::TooLarge));
    let deep = "*1\r\n".repeat(MAX_DEPTH + 2);
    assert_eq!(decode(deep.as_bytes()), Err(ProtocolError::TooDeep));
    let long = vec![b'+'; MAX_LINE_LEN + 10];
    assert_eq!(decode(&long), Err(ProtocolError::TooLarge));
}

/// 20,000 copies of `base`, each with up to three bytes changed at random and cut at a random
/// length. A small deterministic xorshift keeps these tests free of a rand dependency.
fn corrupted(base: &[u8], mut s: u64) -> impl Iterator<Item = Vec<u8>> + '_ {
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    (0..20000).map(move |_| {
        let mut buf = base.to_vec();
        for _ in 0..(next() % 4) {
            let i = (next() as usize) % buf.len();
            buf[i] = next() as u8;
        }
        buf.truncate((next() as usize) % (buf.len() + 1));
        buf
    })
}

#[test]
fn random_corruption_never_panics() {
    let base: &[u8] = b"*3\r\n:1\r\n$4\r\nabcd\r\n*2\r\n:-7\r\n+OK\r\n";
    for buf in corrupted(base, 0x9e3779b97f4a7c15) {
        if let Ok(Some((_, n))) = decode(&buf) {
            assert!(n <= buf.len());
        }
    }
}

type Outcome = (Vec<(Reply, usize)>, Result<(), ProtocolError>);

/// Decodes replies one after another from the whole stream, as if it came in one read.
fn read_whole(data: &[u8], limit: usize) -> Outcome {
    let (mut replies, mut pos) = (Vec::new(), 0);
    loop {
        match decode_within(&data[pos..], limit) {
            Ok(Some((r, n))) => {
                replies.push((r, n));
                pos += n;
            }
            Ok(None) => return (replies, Ok(())),
            Err(e) => return (replies, Err(e)),
        }
    }
}

/// Reads the stream in chunks cut at `cuts`, framing across them as `Conn::read` does, each
/// framed reply then read where it lies.
fn read_in_chunks(data: &[u8], cuts: &[usize], limit: usize) -> Outcome {
    let (mut replies, mut inbuf, mut from) = (Vec::new(), Vec::new(), 0);
    let mut framer = Framer::default();
    for &to in cuts.iter().chain([data.len()].iter()) {
        inbuf.extend_from_slice(&data[from..to.max(from)]);
        from = to.max(from);
        loop {
            match framer.frame(&inbuf, limit) {
                Ok(Some(n)) => {
                    assert!(n > 0 && n <= inbuf.len());
                    replies.push((View::of(&inbuf[..n]).to_reply().unwrap(), n));
                    inbuf.drain(..n);
                }
                Ok(None) => break,
                Err(e) => return (replies, Err(e)),
            }
        }
    }
    (replies, Ok(()))
}

/// Reading a stream in chunks, as `Conn::read` does, frames the same replies and stops the
/// same way (same error, or waiting for more) as decoding it in one piece, wherever the
/// chunks are cut. Inputs are pipelined replies of every type, mostly corrupted a little.
/// (`fuzz/` runs the same property under libFuzzer and for longer: `fuzz/run.sh`.)
#[test]
fn chunked_reads_agree_with_one_read() {
    let mut s: u64 = 0x2545f4914f6cdd1d;
    let mut next = move |n: usize| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % n.max(1) as u64) as usize
    };
    let pieces: [&[u8]; 16] = [
        b"*4\r\n:1\r\n:1\r\n:9\r\n:1000\r\n",
        b"-NOSCRIPT No matching script\r\n",
        b"+OK\r\n",
        b":-42\r\n",
        b"$3\r\na\r\n\r\n",
        b"$0\r\n\r\n",
        b"$-1\r\n",
        b"*-1\r\n",
        b"*0\r\n",
        b"*2\r\n*1\r\n:1\r\n+x\r\n",
        b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
        b"$1048577\r\n",
        b"*65537\r\n",
        b":9223372036854775808\r\n",
        b"$2\r\nabc\r\n",
        b"+a\rb\n",
    ];
    for _ in 0..3000 {
        let mut data = Vec::new();
        for _ in 0..1 + next(4) {
            data.extend_from_slice(pieces[next(pieces.len())]);
        }
        for _ in 0..next(4) {
            if data.is_empty() {
                break;
            }
            let i = next(data.len());
            match next(3) {
                0 => data[i] = b"\r\n*$:+-01x"[next(10)],
                1 => drop(data.remove(i)),
                _ => data.truncate(i),
            }
        }
        // A small limit now and then: a reply over it is refused alike however it came.
        let limit = if next(4) == 0 { next(40) } else { MAX_REPLY_LEN };
        let want = read_whole(&data, limit);
        assert_eq!(read_in_chunks(&data, &[], limit), want, "{data:?} in one read");
        if data.len() <= 48 {
            for k in 0..=data.len() {
                assert_eq!(read_in_chunks(&data, &[k], limit), want, "{data:?} cut at {k}");
            }
            let every: Vec<usize> = (1..data.len()).collect();
            assert_eq!(read_in_chunks(&data, &every, limit), want, "{data:?} byte by byte");
        }
        let mut cuts: Vec<usize> = (0..next(6)).map(|_| next(data.len() + 1)).collect();
        cuts.sort_unstable();
        assert_eq!(read_in_chunks(&data, &cuts, limit), want, "{data:?} cut at {cuts:?}");
    }
}

/// A `CLUSTER SLOTS` of 16,384 ranges alternating between 3 primaries with a replica each,
/// as `t/322-cluster-edges.t` makes it (2.8 MiB).
fn fragmented_cluster_slots() -> Vec<u8> {
    let node = |port: u32| {
        let id = format!("{port:040}");
        format!("*4\r\n$9\r\n127.0.0.1\r\n:{port}\r\n$40\r\n{id}\r\n*0\r\n")
    };
    let mut wire = format!("*{}\r\n", 16384).into_bytes();
    for slot in 0..16384u32 {
        let p = 7000 + slot % 3;
        let range = format!("*4\r\n:{slot}\r\n:{slot}\r\n{}{}", node(p), node(p + 3));
        wire.extend_from_slice(range.as_bytes());
    }
    wire
}

/// Framing goes on where the last read stopped: fed a multi-MiB reply a few KiB at a time,
/// the framer looks at each byte a bounded number of times (a line cut by a read is looked
/// at again), not at the whole reply again with each read.
#[test]
fn a_reply_in_many_reads_is_framed_once() {
    let wire = fragmented_cluster_slots();
    assert!(wire.len() > 2 << 20, "{} bytes", wire.len());
    let mut framer = Framer::default();
    let (mut looked_at, mut got) = (0, None);
    for end in (4096..wire.len()).step_by(4096).chain([wire.len()]) {
        looked_at += end - framer.at;
        got = framer.frame(&wire[..end], MAX_TOPOLOGY_REPLY_LEN).unwrap();
        assert_eq!(got.is_some(), end == wire.len());
    }
    assert!(looked_at < wire.len() + wire.len() / 50, "{looked_at} of {}", wire.len());
    let used = got.unwrap();
    assert_eq!(used, wire.len());
    let reply = View::of(&wire).to_reply().unwrap();
    assert_eq!(Some((reply, used)), decode_within(&wire, MAX_TOPOLOGY_REPLY_LEN).unwrap());
}

#[test]
fn an_endless_array_is_too_large() {
    let mut buf = b"*65536\r\n".to_vec();
    let bulk = format!("${}\r\n{}\r\n", MAX_BULK_LEN, "x".repeat(MAX_BULK_LEN));
    buf.extend_from_slice(bulk.as_bytes());
    assert_eq!(decode(&buf), Ok(None), "one part of it is still fine");
    buf.extend_from_slice(bulk.as_bytes());
    buf.extend_from_slice(b"$5\r\n");
    assert_eq!(decode(&buf), Err(ProtocolError::TooLarge));
}

#[test]
fn fmt_u64_writes_every_length() {
    let mut digits = [0u8; 20];
    let mut values = vec![0, 9, 10, 11, 99, 100, 101, 999, 1000, 12_345, u64::MAX, u64::MAX - 1];
    let mut p = 1u64;
    while let Some(next) = p.checked_mul(10) {
        values.extend([p - 1, p, p + 1, next / 2 + 7]);
        p = next;
    }
    for v in values {
        assert_eq!(fmt_u64(v, &mut digits), v.to_string().as_bytes(), "{v}");
    }
}

/// The one-pass reading of a number line agrees with finding the line's end and parsing it with
/// `str::parse` after, on every line of up to six bytes of the characters that matter, and at
/// the limits of i64: so a whole number line it does not read is a malformed one, which
/// `head` answers `BadInteger` without parsing it again.
#[test]
fn number_lines_read_as_lines_and_integers_do() {
    // At most nineteen digits after an optional minus, as Redis writes them; a magnitude that is
    // an i64 (so not i64::MIN's).
    fn parsed(body: &[u8]) -> Option<i64> {
        let digits = body.strip_prefix(b"-").unwrap_or(body);
        if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        core::str::from_utf8(body).ok()?.parse().ok().filter(|&v| v != i64::MIN)
    }
    let chars = b":*$-019\r\nx";
    let mut line = Vec::new();
    for len in 0..=6 {
        let mut idx = vec![0usize; len];
        loop {
            line.clear();
            line.extend(idx.iter().map(|&i| chars[i]));
            let fast = number_line(&line, 0);
            match read_line(&line, 0) {
                Ok(Some((l, next))) => match l.split_first() {
                    Some((k @ (b':' | b'$' | b'*'), body)) => {
                        assert_eq!(fast, parsed(body).map(|v| (*k, v, next)), "{line:?}")
                    }
                    _ => assert_eq!(fast, None, "{line:?}"),
                },
                _ => assert_eq!(fast, None, "{line:?}"),
            }
            let Some(i) = idx.iter().rposition(|&i| i + 1 < chars.len()) else { break };
            idx[i] += 1;
            idx[i + 1..].iter_mut().for_each(|i| *i = 0);
        }
    }
    for digits in ["1", "9223372036854775807", "9223372036854775808", "99999999999999999999"] {
        for sign in ["", "-"] {
            let line = format!(":{sign}{digits}\r\n");
            let slow = parsed(format!("{sign}{digits}").as_bytes());
            let fast = number_line(line.as_bytes(), 0).map(|(_, v, n)| (v, n));
            assert_eq!(fast, slow.map(|v| (v, line.len())), "{line}");
        }
    }
}

/// The framer keeps where the array's items end, wherever reads cut the reply, as reading its
/// items finds them; the first `ENDS_KEPT` only, and none for a reply that is no array.
#[test]
fn the_framer_keeps_where_items_end() {
    let wire: &[u8] = b"*3\r\n*4\r\n:1\r\n:1\r\n:9\r\n:100\r\n-ERR x\r\n*2\r\n$-1\r\n*-1\r\n:7\r\n";
    let reply = &wire[..wire.len() - 4];
    let mut at = b"*3\r\n".len();
    let want: Vec<usize> = View::of(reply)
        .items()
        .unwrap()
        .map(|v| {
            at += v.bytes().len();
            at
        })
        .collect();
    assert_eq!(want, [26, 34, reply.len()]);
    for cut in 0..=wire.len() {
        let mut framer = Framer::default();
        let first = framer.frame(&wire[..cut], MAX_REPLY_LEN).unwrap();
        let n = framer.frame(wire, MAX_REPLY_LEN).unwrap();
        assert_eq!((first.is_some(), n), (cut >= reply.len(), Some(reply.len())), "cut at {cut}");
        assert_eq!(framer.ends(), want, "cut at {cut}");
        assert_eq!(framer.frame(&wire[reply.len()..], MAX_REPLY_LEN), Ok(Some(4)));
        assert!(framer.ends().is_empty());
    }
    let long = format!("*70\r\n{}", ":1\r\n".repeat(70));
    let mut framer = Framer::default();
    assert_eq!(framer.frame(long.as_bytes(), MAX_REPLY_LEN), Ok(Some(long.len())));
    assert_eq!(framer.ends().len(), ENDS_KEPT);
    assert_eq!(framer.ends()[0], 9);
}

#[test]
fn integers_are_read_one_by_one_and_anything_else_stops() {
    let mut items = View::of(b"*4\r\n:1\r\n:-20\r\n$1\r\n3\r\n:4\r\n").items().unwrap();
    assert_eq!((items.next_int(), items.next_int()), (Some(1), Some(-20)));
    assert_eq!((items.next_int(), items.len()), (None, 0));
    assert_eq!(items.next_int(), None);
    let mut cut = View::of(b"*2\r\n:1\r\n:2").items().unwrap();
    assert_eq!((cut.next_int(), cut.next_int()), (Some(1), None));
}

//! RESP2: incremental decoding here, encoding in `write.rs`.
//!
//! The decoder works on whatever bytes have arrived so far and reports how many it consumed,
//! which is what framing pipelined replies on nginx's event loop needs: a reply may arrive split
//! across reads, and one read may carry several replies.

use std::fmt;

/// Replies larger than this are treated as a protocol error: the limiter's scripts answer with a
/// few integers, so a huge bulk string means the peer is not the Redis we expect.
pub const MAX_BULK_LEN: usize = 1 << 20;
const MAX_ARRAY_LEN: usize = 1 << 16;
const MAX_DEPTH: usize = 8;
/// Longest header line (`$1048576\r\n`, an integer, a status or error text) we accept.
const MAX_LINE_LEN: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Status(Vec<u8>),
    Error(Vec<u8>),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    BadType(u8),
    BadLength,
    BadInteger,
    TooLarge,
    TooDeep,
    MissingCrlf,
    /// Bytes read as one reply (a [`View`]) that end before it does.
    Truncated,
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::BadType(b) => write!(f, "unexpected reply type byte 0x{b:02x}"),
            ProtocolError::BadLength => f.write_str("invalid length in reply"),
            ProtocolError::BadInteger => f.write_str("invalid integer in reply"),
            ProtocolError::TooLarge => f.write_str("reply too large"),
            ProtocolError::TooDeep => f.write_str("reply nested too deeply"),
            ProtocolError::MissingCrlf => f.write_str("reply line not terminated by CRLF"),
            ProtocolError::Truncated => f.write_str("reply cut short"),
        }
    }
}

/// The most bytes one reply may take: the largest bulk string and its framing, with room to
/// spare. Each part of a reply is capped on its own, but an array of many capped parts is not,
/// so without this a peer could make a worker buffer gigabytes of one endless reply.
pub const MAX_REPLY_LEN: usize = 2 * MAX_BULK_LEN;

/// The most bytes of a reply to the worker's own commands (`CLUSTER SLOTS`): a cluster whose
/// 16,384 slots alternate between nodes, each with several replicas, answers several MiB.
pub const MAX_TOPOLOGY_REPLY_LEN: usize = 16 << 20;

/// Decodes one reply from the start of `buf` into a tree: the reference the worker's readers
/// ([`Framer`], [`View`]) are checked against in the tests and the fuzz target, which read the
/// same bytes in place.
///
/// `Ok(None)` means more bytes are needed; `Ok(Some((reply, n)))` means the first `n` bytes were
/// one complete reply. Not in the module: the fuzz crate, which compiles this file, sets
/// `resp_reference`.
#[cfg(any(test, resp_reference))]
pub fn decode(buf: &[u8]) -> Result<Option<(Reply, usize)>, ProtocolError> {
    decode_within(buf, MAX_REPLY_LEN)
}

/// [`decode`] for a reply allowed to take up to `limit` bytes.
#[cfg(any(test, resp_reference))]
pub fn decode_within(buf: &[u8], limit: usize) -> Result<Option<(Reply, usize)>, ProtocolError> {
    // Only the first limit + 1 bytes are ever looked at, so that how reads split the stream
    // never changes the outcome, and a reply longer than that is too large.
    let view = &buf[..buf.len().min(limit + 1)];
    match decode_at(view, 0, 0)? {
        Some((_, used)) if used > limit => Err(ProtocolError::TooLarge),
        None if view.len() > limit => Err(ProtocolError::TooLarge),
        done => Ok(done),
    }
}

/// How far the framing of a reply that has partly arrived got: whole elements only, and the
/// items each array it is inside still owes. `Conn::read` keeps one per connection so that each
/// read frames only the bytes that came with it; decoding the reply from its first byte on every
/// read made a reply that arrives in k reads cost k decodes of it, a whole tree of allocations
/// each (a 2.8 MiB `CLUSTER SLOTS` came in hundreds of reads).
#[derive(Debug, Default)]
pub struct Framer {
    at: usize,
    open: Vec<usize>,
    /// Where each of the first [`ENDS_KEPT`] items of the reply's array ends, from its start.
    ends: Vec<usize>,
}

/// The items of a reply's array whose ends a [`Framer`] keeps: a script call's batch at most
/// (`call::MAX_BATCH_DECISIONS`), so that it is split where framing found its decisions' ends
/// rather than by walking it again.
pub const ENDS_KEPT: usize = 64;

impl Framer {
    /// The bytes of the reply at the start of `buf`, once all of them have arrived: `Ok(None)`
    /// until then. The outcome is `decode_within`'s for the same bytes, wherever reads cut
    /// them. Between calls `buf` may only grow at its end; after `Some` or an error the framer
    /// starts again, for the next reply.
    pub fn frame(&mut self, buf: &[u8], limit: usize) -> Result<Option<usize>, ProtocolError> {
        let r = self.frame_view(&buf[..buf.len().min(limit + 1)], limit);
        if !matches!(r, Ok(None)) {
            self.at = 0;
            self.open.clear();
        }
        r
    }

    /// Where the items of the array [`Framer::frame`] framed last end, from its start: the
    /// first [`ENDS_KEPT`] of them (none for a reply that is no array).
    pub fn ends(&self) -> &[usize] {
        &self.ends
    }

    fn frame_view(&mut self, view: &[u8], limit: usize) -> Result<Option<usize>, ProtocolError> {
        let more = || if view.len() > limit { Err(ProtocolError::TooLarge) } else { Ok(None) };
        if self.at == 0 {
            self.ends.clear();
        }
        loop {
            if self.open.len() > MAX_DEPTH {
                return Err(ProtocolError::TooDeep);
            }
            // An integer or an array's length, the lines of a script's reply, read without the
            // general reading (which would read the line's number a second time).
            let (head, end) = match number_line(view, self.at) {
                Some((b':', v, next)) => (Head::Int(v), next),
                Some((b'*', n, next)) if array_len(n).is_some() => {
                    (Head::Array(array_len(n)), next)
                }
                _ => match head(view, self.at)? {
                    Some(line) => line,
                    None => return more(),
                },
            };
            self.at = end;
            if let Head::Array(Some(n)) = head {
                if n > 0 {
                    self.open.push(n);
                    continue;
                }
            }
            loop {
                let depth = self.open.len();
                if depth == 0 {
                    return if end > limit { Err(ProtocolError::TooLarge) } else { Ok(Some(end)) };
                }
                if depth == 1 && self.ends.len() < ENDS_KEPT {
                    self.ends.push(end);
                }
                let owed = &mut self.open[depth - 1];
                *owed -= 1;
                if *owed > 0 {
                    break;
                }
                self.open.pop();
            }
        }
    }
}

fn decode_at(
    buf: &[u8],
    pos: usize,
    depth: usize,
) -> Result<Option<(Reply, usize)>, ProtocolError> {
    if depth > MAX_DEPTH {
        return Err(ProtocolError::TooDeep);
    }
    let Some((head, next)) = head(buf, pos)? else { return Ok(None) };
    let reply = match head {
        Head::Status(s) => Reply::Status(s.to_vec()),
        Head::Error(e) => Reply::Error(e.to_vec()),
        Head::Int(v) => Reply::Int(v),
        Head::Bulk(b) => Reply::Bulk(b.map(<[u8]>::to_vec)),
        Head::Array(None) => Reply::Array(None),
        Head::Array(Some(n)) => {
            let mut items = Vec::with_capacity(n.min(16));
            let mut at = next;
            for _ in 0..n {
                let Some((item, after)) = decode_at(buf, at, depth + 1)? else { return Ok(None) };
                items.push(item);
                at = after;
            }
            return Ok(Some((Reply::Array(Some(items)), at)));
        }
    };
    Ok(Some((reply, next)))
}

/// What the first line of a reply says, with a bulk string's body: a reply read where its bytes
/// lie, without copying them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head<'a> {
    Status(&'a [u8]),
    Error(&'a [u8]),
    Int(i64),
    Bulk(Option<&'a [u8]>),
    /// An array's length (`None`: nil); its items follow.
    Array(Option<usize>),
}

/// The head of the reply at `pos` and the offset after it (after a bulk string's body, before
/// an array's items), once all of it is there: the one reading of a reply's lines that framing,
/// `decode` and [`View`] share.
fn head(buf: &[u8], pos: usize) -> Result<Option<(Head<'_>, usize)>, ProtocolError> {
    let (kind, n, next) = match number_line(buf, pos) {
        Some(line) => line,
        None => {
            let Some((line, next)) = read_line(buf, pos)? else { return Ok(None) };
            let (kind, body) = line.split_first().ok_or(ProtocolError::BadType(b'\r'))?;
            match kind {
                b'+' => return Ok(Some((Head::Status(body), next))),
                b'-' => return Ok(Some((Head::Error(body), next))),
                // A whole number line that `number_line` did not read: no digits, a twentieth, a
                // byte that is no digit, or beyond an i64.
                b':' | b'$' | b'*' => return Err(ProtocolError::BadInteger),
                other => return Err(ProtocolError::BadType(*other)),
            }
        }
    };
    let head = match kind {
        b':' => Head::Int(n),
        b'$' => {
            if n == -1 {
                return Ok(Some((Head::Bulk(None), next)));
            }
            let len = usize::try_from(n).map_err(|_| ProtocolError::BadLength)?;
            if len > MAX_BULK_LEN {
                return Err(ProtocolError::TooLarge);
            }
            let end = next + len;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(ProtocolError::MissingCrlf);
            }
            return Ok(Some((Head::Bulk(Some(&buf[next..end])), end + 2)));
        }
        _ => {
            if n == -1 {
                return Ok(Some((Head::Array(None), next)));
            }
            let n = usize::try_from(n).map_err(|_| ProtocolError::BadLength)?;
            if n > MAX_ARRAY_LEN {
                return Err(ProtocolError::TooLarge);
            }
            Head::Array(Some(n))
        }
    };
    Ok(Some((head, next)))
}

/// An array line's length `n` when [`head`] reads it as a non-nil array without an error, for
/// the readers that take such lines from [`number_line`] directly.
#[inline(always)]
fn array_len(n: i64) -> Option<usize> {
    usize::try_from(n).ok().filter(|&n| n <= MAX_ARRAY_LEN)
}

/// The line at `pos` when it is a well-formed number (`:`, `$`, `*`, then at most nineteen
/// digits, CRLF): its kind, value and the offset after it, read in one pass. Every line of a
/// script's reply is one, and each is read a few times (framed, split from its batch, read);
/// finding the line's end first and parsing its digits after was most of their cost. `None`
/// for anything else, which [`read_line`] then reads and words the error of.
/// Inlined: returned through memory from a call, its three values cost as much again.
#[inline(always)]
fn number_line(buf: &[u8], pos: usize) -> Option<(u8, i64, usize)> {
    let (&kind, rest) = buf.get(pos..)?.split_first()?;
    if !matches!(kind, b':' | b'$' | b'*') {
        return None;
    }
    let (neg, digits) = match rest.split_first() {
        Some((b'-', digits)) => (true, digits),
        _ => (false, rest),
    };
    let mut v: u64 = 0;
    for (i, &b) in digits.iter().enumerate().take(20) {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            if i == 0 || b != b'\r' || digits.get(i + 1) != Some(&b'\n') {
                return None;
            }
            let v = i64::try_from(v).ok()?;
            return Some((kind, if neg { -v } else { v }, pos + 1 + usize::from(neg) + i + 2));
        }
        if i == 19 {
            // A twentieth digit.
            return None;
        }
        v = v * 10 + u64::from(d);
    }
    None
}

/// The end of the reply at `pos`, once all of it is there.
fn end_of(buf: &[u8], pos: usize, depth: usize) -> Result<Option<usize>, ProtocolError> {
    if depth > MAX_DEPTH {
        return Err(ProtocolError::TooDeep);
    }
    let Some((head, mut at)) = head(buf, pos)? else { return Ok(None) };
    if let Head::Array(Some(n)) = head {
        for _ in 0..n {
            let Some(after) = end_of(buf, at, depth + 1)? else { return Ok(None) };
            at = after;
        }
    }
    Ok(Some(at))
}

/// One whole reply read where its bytes lie (a connection's read buffer, a copy of it): what
/// the script's replies are read through, item by item, without building a [`Reply`] tree and
/// its allocations. Made of bytes a [`Framer`] framed; other bytes read as nothing (`None`,
/// [`ProtocolError`]), never a panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View<'a>(&'a [u8]);

impl<'a> View<'a> {
    /// The reply `bytes` hold, as a [`Framer`] framed them.
    pub fn of(bytes: &'a [u8]) -> View<'a> {
        View(bytes)
    }

    pub fn bytes(self) -> &'a [u8] {
        self.0
    }

    /// What it is (`None`: not a reply).
    pub fn head(self) -> Option<Head<'a>> {
        head(self.0, 0).ok().flatten().map(|(h, _)| h)
    }

    /// An error reply's text.
    pub fn error(self) -> Option<&'a [u8]> {
        // Asked of every reply on its way (redirections, the breaker, a batch's split): the
        // first byte says no for nearly all.
        if self.0.first() != Some(&b'-') {
            return None;
        }
        match self.head()? {
            Head::Error(e) => Some(e),
            _ => None,
        }
    }

    /// A non-nil array's items, in order.
    pub fn items(self) -> Option<Items<'a>> {
        // The array's line alone: a script's reply is one, and the general reading costs a call.
        match number_line(self.0, 0) {
            Some((b'*', n, at)) => Some(Items { buf: self.0, at, left: array_len(n)? }),
            _ => None,
        }
    }

    /// The reply as a tree, for the readers that keep or walk all of it (a set-up's answer,
    /// `CLUSTER SLOTS`, a sentinel's).
    pub fn to_reply(self) -> Result<Reply, ProtocolError> {
        match decode_at(self.0, 0, 0)? {
            Some((reply, _)) => Ok(reply),
            None => Err(ProtocolError::Truncated),
        }
    }
}

/// An array's items, each a [`View`]; ends early at bytes that are not a reply.
#[derive(Debug, Clone)]
pub struct Items<'a> {
    buf: &'a [u8],
    at: usize,
    left: usize,
}

impl<'a> Items<'a> {
    /// The items not read yet, as the array declares them.
    pub fn len(&self) -> usize {
        self.left
    }

    pub fn is_empty(&self) -> bool {
        self.left == 0
    }

    /// The next item's head, the item passed: reading scalars (a script's integers) this way
    /// looks at each line once.
    pub fn next_head(&mut self) -> Option<Head<'a>> {
        self.left = self.left.checked_sub(1)?;
        let Ok(Some((head, mut end))) = head(self.buf, self.at) else { return self.stop() };
        if let Head::Array(Some(_)) = head {
            let Ok(Some(after)) = end_of(self.buf, self.at, 0) else { return self.stop() };
            end = after;
        }
        self.at = end;
        Some(head)
    }

    /// The next item as an integer, the item passed (`None`: it is something else): a
    /// script's reply is integers, each read in its line's one pass.
    pub fn next_int(&mut self) -> Option<i64> {
        self.left = self.left.checked_sub(1)?;
        match number_line(self.buf, self.at) {
            Some((b':', v, next)) => {
                self.at = next;
                Some(v)
            }
            _ => self.stop(),
        }
    }

    fn stop<T>(&mut self) -> Option<T> {
        self.left = 0;
        None
    }
}

impl<'a> Iterator for Items<'a> {
    type Item = View<'a>;

    fn next(&mut self) -> Option<View<'a>> {
        self.left = self.left.checked_sub(1)?;
        let Ok(Some(end)) = end_of(self.buf, self.at, 0) else { return self.stop() };
        let item = View(&self.buf[self.at..end]);
        self.at = end;
        Some(item)
    }
}

/// Returns the line starting at `pos` without its CRLF, and the offset after the CRLF.
fn read_line(buf: &[u8], pos: usize) -> Result<Option<(&[u8], usize)>, ProtocolError> {
    let rest = &buf[pos.min(buf.len())..];
    let window = &rest[..rest.len().min(MAX_LINE_LEN + 2)];
    match window.iter().position(|&b| b == b'\n') {
        Some(0) => Err(ProtocolError::MissingCrlf),
        Some(i) if window[i - 1] == b'\r' => Ok(Some((&rest[..i - 1], pos + i + 1))),
        Some(_) => Err(ProtocolError::MissingCrlf),
        None if rest.len() > MAX_LINE_LEN + 1 => Err(ProtocolError::TooLarge),
        None => Ok(None),
    }
}

/// What a sentinel said to `SENTINEL get-master-addr-by-name`.
#[derive(Debug, PartialEq, Eq)]
pub enum MasterAddr {
    /// `host:port` (an IPv6 host unbracketed, as Redis writes it everywhere).
    Addr(String),
    /// A null reply: the sentinel monitors no group of that name.
    Unknown,
    /// Anything else: an error reply, a malformed one.
    Other,
}

pub fn master_addr(reply: &Reply) -> MasterAddr {
    match reply {
        Reply::Array(None) | Reply::Bulk(None) => MasterAddr::Unknown,
        Reply::Array(Some(items)) => match items.as_slice() {
            [Reply::Bulk(Some(host)), Reply::Bulk(Some(port))]
                if !host.is_empty() && !port.is_empty() && port.iter().all(u8::is_ascii_digit) =>
            {
                let host = String::from_utf8_lossy(host);
                MasterAddr::Addr(format!("{host}:{}", String::from_utf8_lossy(port)))
            }
            _ => MasterAddr::Other,
        },
        _ => MasterAddr::Other,
    }
}

/// The contents of consecutive bulk strings as this module encodes them (`put_bulk`); stops at
/// anything else.
pub fn bulk_strings(mut buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    core::iter::from_fn(move || {
        let rest = buf.strip_prefix(b"$")?;
        let eol = rest.iter().position(|&b| b == b'\r')?;
        let len: usize = core::str::from_utf8(&rest[..eol]).ok()?.parse().ok()?;
        let body = rest.get(eol + 2..eol + 2 + len)?;
        buf = rest.get(eol + 4 + len..)?;
        Some(body)
    })
}

mod write;
pub use write::{
    auth_command, command, error_reply, fmt_u64, put_array_len, put_bulk, put_bulk_int,
    put_bulk_parts, put_command,
};

#[cfg(test)]
mod tests;

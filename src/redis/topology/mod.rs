//! Redis Cluster topology as data: node addresses, the `CLUSTER SLOTS` reply, `MOVED`/`ASK`
//! redirections and the per-worker slot → node table (design note `scale-out-notes.md`, 2.2,
//! 2.3 and 6). Pure: no nginx, no I/O; every malformed input is an error, never a panic.

use std::fmt;

use crate::codec::resp::Reply;
use crate::codec::slot::SLOTS;

/// A node's address as Redis announces it: an IP (v4 or v6, never bracketed) or a hostname.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeAddr {
    pub host: String,
    pub port: u16,
}

impl NodeAddr {
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        NodeAddr { host: host.into(), port }
    }

    /// Parses `host:port`, splitting at the **last** `:` (Redis does not bracket IPv6 hosts:
    /// `::1:7001`). The host may be empty (`:7001`, Redis' "unknown endpoint, same host as the
    /// node you asked" in `MOVED`/`ASK`; see [`NodeAddr::or_host_of`]); the port must be 1–65535
    /// in plain decimal digits.
    pub fn parse(s: &[u8]) -> Option<NodeAddr> {
        let colon = s.iter().rposition(|&b| b == b':')?;
        let (host, port) = (&s[..colon], &s[colon + 1..]);
        let port = parse_port(port)?;
        let host = std::str::from_utf8(host).ok()?;
        if host.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) {
            return None;
        }
        Some(NodeAddr::new(host, port))
    }

    /// This address, with `asked`'s host when Redis left the host out (empty endpoint).
    pub fn or_host_of(self, asked: &NodeAddr) -> NodeAddr {
        if self.host.is_empty() {
            NodeAddr { host: asked.host.clone(), ..self }
        } else {
            self
        }
    }
}

impl fmt::Display for NodeAddr {
    /// `host:port`, the host as is (no brackets around IPv6), as Redis writes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl std::str::FromStr for NodeAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        NodeAddr::parse(s.as_bytes()).ok_or_else(|| format!("invalid node address \"{s}\""))
    }
}

fn parse_port(digits: &[u8]) -> Option<u16> {
    if digits.is_empty() || digits.len() > 5 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let v = digits.iter().fold(0u32, |v, &d| v * 10 + u32::from(d - b'0'));
    u16::try_from(v).ok().filter(|&p| p != 0)
}

/// Slots `start..=end` served by `primary`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRange {
    pub start: u16,
    pub end: u16,
    pub primary: NodeAddr,
}

/// Decodes a `CLUSTER SLOTS` reply (RESP2), sent to `asked`.
///
/// Each element is `[start, end, primary, replica...]`, each node `[endpoint, port, id,
/// {metadata}...]` (the metadata map is new in 7.0; extra elements are ignored, replicas are not
/// looked at). Endpoint NULL or `""` means "the host you asked", with the returned port; `"?"`
/// (unknown endpoint) and port 0 leave that range unserved, so it is left out of the result.
/// The ranges come back sorted by `start`; overlapping ranges, slots beyond 16383 or
/// `start > end` are errors, as is any element of an unexpected type.
pub fn parse_cluster_slots(reply: &Reply, asked: &NodeAddr) -> Result<Vec<SlotRange>, String> {
    let ranges = match reply {
        Reply::Array(Some(items)) => items,
        Reply::Error(e) => {
            return Err(format!("CLUSTER SLOTS failed: {}", String::from_utf8_lossy(e)))
        }
        other => return Err(format!("CLUSTER SLOTS: expected an array, got {}", kind(other))),
    };
    let mut out = Vec::with_capacity(ranges.len());
    for (i, range) in ranges.iter().enumerate() {
        let Reply::Array(Some(fields)) = range else {
            return Err(format!("CLUSTER SLOTS: range {i} is {}, not an array", kind(range)));
        };
        let [start, end, primary, ..] = fields.as_slice() else {
            return Err(format!("CLUSTER SLOTS: range {i} has {} elements, not 3+", fields.len()));
        };
        let (start, end) = (slot_number(start, i)?, slot_number(end, i)?);
        if start > end {
            return Err(format!("CLUSTER SLOTS: range {i} starts at {start} after its end {end}"));
        }
        if let Some(primary) = node(primary, asked, i)? {
            out.push(SlotRange { start, end, primary });
        }
    }
    out.sort_by_key(|r| r.start);
    for pair in out.windows(2) {
        if pair[1].start <= pair[0].end {
            return Err(format!(
                "CLUSTER SLOTS: ranges {}-{} and {}-{} overlap",
                pair[0].start, pair[0].end, pair[1].start, pair[1].end
            ));
        }
    }
    Ok(out)
}

fn slot_number(r: &Reply, range: usize) -> Result<u16, String> {
    match r {
        Reply::Int(n) if (0..i64::from(SLOTS)).contains(n) => Ok(*n as u16),
        Reply::Int(n) => Err(format!("CLUSTER SLOTS: range {range}: slot {n} out of 0-16383")),
        other => Err(format!("CLUSTER SLOTS: range {range}: slot is {}", kind(other))),
    }
}

/// The node of one range, `None` if Redis does not know how to reach it.
fn node(r: &Reply, asked: &NodeAddr, range: usize) -> Result<Option<NodeAddr>, String> {
    let Reply::Array(Some(fields)) = r else {
        return Err(format!("CLUSTER SLOTS: range {range}: node is {}, not an array", kind(r)));
    };
    let [endpoint, port, ..] = fields.as_slice() else {
        return Err(format!("CLUSTER SLOTS: range {range}: node has {} elements", fields.len()));
    };
    let port = match port {
        Reply::Int(p) => {
            u16::try_from(*p).map_err(|_| format!("CLUSTER SLOTS: range {range}: port {p}"))?
        }
        other => return Err(format!("CLUSTER SLOTS: range {range}: port is {}", kind(other))),
    };
    let host = match endpoint {
        Reply::Bulk(None) => asked.host.clone(),
        Reply::Bulk(Some(h)) if h.is_empty() => asked.host.clone(),
        Reply::Bulk(Some(h)) if h == b"?" => return Ok(None),
        Reply::Bulk(Some(h)) => match std::str::from_utf8(h) {
            Ok(h) if !h.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) => {
                h.to_owned()
            }
            _ => return Err(format!("CLUSTER SLOTS: range {range}: invalid endpoint {h:?}")),
        },
        other => return Err(format!("CLUSTER SLOTS: range {range}: endpoint is {}", kind(other))),
    };
    if port == 0 {
        return Ok(None);
    }
    Ok(Some(NodeAddr { host, port }))
}

fn kind(r: &Reply) -> &'static str {
    match r {
        Reply::Status(_) => "a status",
        Reply::Error(_) => "an error",
        Reply::Int(_) => "an integer",
        Reply::Bulk(None) | Reply::Array(None) => "nil",
        Reply::Bulk(Some(_)) => "a string",
        Reply::Array(Some(_)) => "an array",
    }
}

/// A cluster redirection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    /// The slot lives on `to` now: re-send there and patch the table.
    Moved { slot: u16, to: NodeAddr },
    /// This one command only: send `ASKING` + the command on one connection to `to`.
    Ask { slot: u16, to: NodeAddr },
}

/// Parses the text of an error reply (`Reply::Error` holds the bytes after `-`):
/// `MOVED 3999 127.0.0.1:6381` or `ASK 3999 127.0.0.1:6381`. Hosts may be IPv6 (not bracketed),
/// hostnames, or empty (`MOVED 3999 :6381`: same host as the node that answered — resolve with
/// [`NodeAddr::or_host_of`]). Anything else, or a malformed redirection, is `None`.
pub fn parse_redirect(err: &[u8]) -> Option<Redirect> {
    let mut fields = err.split(|&b| b == b' ');
    let (kind, slot, addr) = (fields.next()?, fields.next()?, fields.next()?);
    if fields.next().is_some() {
        return None;
    }
    if slot.is_empty() || slot.len() > 5 || !slot.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let slot = slot.iter().fold(0u32, |v, &d| v * 10 + u32::from(d - b'0'));
    let slot = u16::try_from(slot).ok().filter(|&s| s < SLOTS)?;
    let to = NodeAddr::parse(addr)?;
    match kind {
        b"MOVED" => Some(Redirect::Moved { slot, to }),
        b"ASK" => Some(Redirect::Ask { slot, to }),
        _ => None,
    }
}

/// A redirection with an empty host (`MOVED 3999 :6381`, `cluster-preferred-endpoint-type
/// unknown-endpoint`) written out with the host of `asked`, the node that answered it; `None`
/// when the reply needs no change.
pub fn redirect_from(err: &[u8], asked: &NodeAddr) -> Option<Vec<u8>> {
    let (kind, slot, to) = match parse_redirect(err)? {
        Redirect::Moved { slot, to } => ("MOVED", slot, to),
        Redirect::Ask { slot, to } => ("ASK", slot, to),
    };
    if !to.host.is_empty() {
        return None;
    }
    Some(format!("{kind} {slot} {}", to.or_host_of(asked)).into_bytes())
}

/// Slot → node index, per worker: 32 KiB of indices into a node list.
#[derive(Debug, Clone)]
pub struct SlotTable {
    slots: Box<[u16; SLOTS as usize]>,
    nodes: Vec<NodeAddr>,
}

/// An unserved slot in [`SlotTable`].
const NONE: u16 = u16::MAX;

impl Default for SlotTable {
    fn default() -> Self {
        let slots: Box<[u16]> = vec![NONE; usize::from(SLOTS)].into_boxed_slice();
        let slots: Box<[u16; SLOTS as usize]> = match slots.try_into() {
            Ok(s) => s,
            Err(_) => unreachable!("the vector has SLOTS elements"),
        };
        SlotTable { slots, nodes: Vec::new() }
    }
}

impl SlotTable {
    /// The table of a decoded `CLUSTER SLOTS` reply; nodes are numbered in order of first
    /// appearance, each once. Slots no range covers are unserved.
    pub fn from_ranges(ranges: &[SlotRange]) -> SlotTable {
        let mut t = SlotTable::default();
        for r in ranges {
            let Some(i) = t.index_or_add(&r.primary) else { continue };
            let end = r.end.min(SLOTS - 1);
            for slot in r.start..=end {
                t.slots[usize::from(slot)] = i;
            }
        }
        t
    }

    /// Index (into [`SlotTable::nodes`]) of the node serving `slot`, `None` if unserved or if
    /// `slot` is not a slot number.
    pub fn node_of(&self, slot: u16) -> Option<usize> {
        match *self.slots.get(usize::from(slot))? {
            NONE => None,
            i => Some(usize::from(i)),
        }
    }

    /// After `MOVED slot to`: `slot` is served by `to` now (added to the node list if new).
    /// Returns its index; `None` only for a slot number beyond 16383 or when the list already
    /// holds 65535 nodes (a full refresh, `from_ranges`, starts a new list).
    pub fn patch(&mut self, slot: u16, to: NodeAddr) -> Option<usize> {
        if slot >= SLOTS {
            return None;
        }
        let i = self.index_or_add(&to)?;
        self.slots[usize::from(slot)] = i;
        Some(usize::from(i))
    }

    /// Every node the table has known since it was built, by index; a node may serve no slot
    /// any more after patches.
    pub fn nodes(&self) -> &[NodeAddr] {
        &self.nodes
    }

    /// The index of `addr`, if known.
    pub fn index_of(&self, addr: &NodeAddr) -> Option<usize> {
        self.nodes.iter().position(|n| n == addr)
    }

    /// Number of slots with a node.
    pub fn served(&self) -> usize {
        self.slots.iter().filter(|&&i| i != NONE).count()
    }

    fn index_or_add(&mut self, addr: &NodeAddr) -> Option<u16> {
        if let Some(i) = self.index_of(addr) {
            return u16::try_from(i).ok();
        }
        let i = u16::try_from(self.nodes.len()).ok().filter(|&i| i != NONE)?;
        self.nodes.push(addr.clone());
        Some(i)
    }
}

#[cfg(test)]
mod tests;

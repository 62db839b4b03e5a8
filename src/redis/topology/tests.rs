//! CLUSTER SLOTS replies, redirections and the slot table, from replies as Redis writes them.

use super::*;
use crate::codec::resp::decode;

/// `*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n` sent to port 17001 of a 3 primaries + 3 replicas
/// cluster (redis-server 7.0.15, `redis-cli --cluster create ... --cluster-replicas 1`),
/// once the replicas had appeared; the bytes as received.
const SLOTS_7_0_15: &[u8] = b"*3\r\n\
    *4\r\n:0\r\n:5460\r\n\
    *4\r\n$9\r\n127.0.0.1\r\n:17001\r\n$40\r\n75e7389ca98fa5c52895aed41061aad6e42913bf\r\n*0\r\n\
    *4\r\n$9\r\n127.0.0.1\r\n:17005\r\n$40\r\n65a64d514fd263fea86717279d85452e1e12e074\r\n*0\r\n\
    *4\r\n:5461\r\n:10922\r\n\
    *4\r\n$9\r\n127.0.0.1\r\n:17002\r\n$40\r\n3d3dc57f5c31840df6bf972bcb49b70db090d7c6\r\n*0\r\n\
    *4\r\n$9\r\n127.0.0.1\r\n:17006\r\n$40\r\n49655cc8ecc25e2754027c5cde146a9fb41e4faa\r\n*0\r\n\
    *4\r\n:10923\r\n:16383\r\n\
    *4\r\n$9\r\n127.0.0.1\r\n:17003\r\n$40\r\n46a7d0f43cb729d05a721f9eac3b4711e7e4b446\r\n*0\r\n\
    *4\r\n$9\r\n127.0.0.1\r\n:17004\r\n$40\r\na8ea59f03054aec72345fa77ec3669dc58e52b20\r\n*0\r\n";

/// The same cluster 2 s after `--cluster create`: replicas not listed yet.
const SLOTS_NO_REPLICAS: &[u8] = b"*3\r\n\
    *3\r\n:0\r\n:5460\r\n\
    *4\r\n$9\r\n127.0.0.1\r\n:17001\r\n$40\r\n75e7389ca98fa5c52895aed41061aad6e42913bf\r\n*0\r\n\
    *3\r\n:5461\r\n:10922\r\n\
    *4\r\n$9\r\n127.0.0.1\r\n:17002\r\n$40\r\n3d3dc57f5c31840df6bf972bcb49b70db090d7c6\r\n*0\r\n\
    *3\r\n:10923\r\n:16383\r\n\
    *4\r\n$9\r\n127.0.0.1\r\n:17003\r\n$40\r\n46a7d0f43cb729d05a721f9eac3b4711e7e4b446\r\n*0\r\n";

fn asked() -> NodeAddr {
    NodeAddr::new("10.0.0.9", 6379)
}

fn wire(bytes: &[u8]) -> Reply {
    let (r, n) = decode(bytes).unwrap().unwrap();
    assert_eq!(n, bytes.len());
    r
}

fn bulk(s: &str) -> Reply {
    Reply::Bulk(Some(s.as_bytes().to_vec()))
}

fn arr(items: Vec<Reply>) -> Reply {
    Reply::Array(Some(items))
}

fn range(start: i64, end: i64, nodes: Vec<Reply>) -> Reply {
    arr([vec![Reply::Int(start), Reply::Int(end)], nodes].concat())
}

fn node(endpoint: Reply, port: i64) -> Reply {
    arr(vec![endpoint, Reply::Int(port), bulk("0123456789abcdef"), arr(vec![])])
}

#[test]
fn real_reply_of_a_3x2_cluster() {
    for bytes in [SLOTS_7_0_15, SLOTS_NO_REPLICAS] {
        let ranges = parse_cluster_slots(&wire(bytes), &asked()).unwrap();
        let got: Vec<(u16, u16, String)> =
            ranges.iter().map(|r| (r.start, r.end, r.primary.to_string())).collect();
        assert_eq!(
            got,
            [
                (0, 5460, "127.0.0.1:17001".to_string()),
                (5461, 10922, "127.0.0.1:17002".to_string()),
                (10923, 16383, "127.0.0.1:17003".to_string()),
            ]
        );
        let t = SlotTable::from_ranges(&ranges);
        assert_eq!(t.served(), 16384);
        assert_eq!(t.nodes().len(), 3);
        let of = |key: &str| {
            let slot = crate::codec::slot::key_slot(&[key.as_bytes()]);
            t.nodes()[t.node_of(slot).unwrap()].port
        };
        // Measured: `GET foo` on 17001 answered `MOVED 12182 127.0.0.1:17003`.
        assert_eq!(of("foo"), 17003);
        assert_eq!(of("{u1}"), 17001, "slot 4574");
    }
}

#[test]
fn endpoint_null_empty_and_unknown() {
    let reply = arr(vec![
        range(0, 99, vec![node(Reply::Bulk(None), 7001)]),
        range(100, 199, vec![node(bulk(""), 7002)]),
        range(200, 299, vec![node(bulk("?"), 7003), node(bulk("127.0.0.1"), 7004)]),
        range(300, 399, vec![node(bulk("redis-0.example.net"), 7005)]),
        range(400, 499, vec![node(bulk("::1"), 7006)]),
        range(500, 599, vec![node(bulk("10.1.1.1"), 0)]),
    ]);
    let ranges = parse_cluster_slots(&reply, &asked()).unwrap();
    let got: Vec<String> =
        ranges.iter().map(|r| format!("{}-{} {}", r.start, r.end, r.primary)).collect();
    assert_eq!(
        got,
        [
            "0-99 10.0.0.9:7001",
            "100-199 10.0.0.9:7002",
            "300-399 redis-0.example.net:7005",
            "400-499 ::1:7006",
        ]
    );
    let t = SlotTable::from_ranges(&ranges);
    assert_eq!(t.node_of(250), None, "a range whose primary is \"?\" is unserved");
    assert_eq!(t.node_of(1000), None);
    assert_eq!(t.node_of(450), Some(3));
    assert_eq!(t.served(), 400);
}

#[test]
fn old_and_future_node_shapes() {
    // Redis < 7: 3 elements per node; a future one: more. Both fine.
    let reply = arr(vec![
        range(0, 10, vec![arr(vec![bulk("a"), Reply::Int(1), bulk("id")])]),
        range(11, 20, vec![arr(vec![bulk("b"), Reply::Int(2)])]),
        range(
            21,
            30,
            vec![arr(vec![bulk("c"), Reply::Int(3), bulk("id"), arr(vec![]), Reply::Int(9)])],
        ),
    ]);
    assert_eq!(parse_cluster_slots(&reply, &asked()).unwrap().len(), 3);
    assert_eq!(parse_cluster_slots(&arr(vec![]), &asked()).unwrap(), vec![]);
}

#[test]
fn ranges_are_sorted() {
    let reply = arr(vec![
        range(100, 200, vec![node(bulk("b"), 2)]),
        range(0, 99, vec![node(bulk("a"), 1)]),
    ]);
    let r = parse_cluster_slots(&reply, &asked()).unwrap();
    assert_eq!((r[0].start, r[1].start), (0, 100));
}

#[test]
fn malformed_replies_are_errors() {
    let good_node = || node(bulk("h"), 1);
    let cases: Vec<(Reply, &str)> = vec![
        (Reply::Error(b"ERR This instance has cluster support disabled".to_vec()), "disabled"),
        (Reply::Int(1), "expected an array"),
        (Reply::Array(None), "expected an array"),
        (arr(vec![Reply::Int(1)]), "not an array"),
        (arr(vec![arr(vec![Reply::Int(0), Reply::Int(1)])]), "not 3+"),
        (arr(vec![range(0, 16384, vec![good_node()])]), "out of 0-16383"),
        (arr(vec![range(-1, 5, vec![good_node()])]), "out of 0-16383"),
        (arr(vec![range(9, 5, vec![good_node()])]), "after its end"),
        (arr(vec![range(0, 5, vec![good_node()]), range(5, 9, vec![good_node()])]), "overlap"),
        (arr(vec![range(0, 16383, vec![good_node()]), range(0, 0, vec![good_node()])]), "overlap"),
        (arr(vec![arr(vec![bulk("0"), Reply::Int(5), good_node()])]), "slot is a string"),
        (arr(vec![range(0, 5, vec![Reply::Int(3)])]), "not an array"),
        (arr(vec![range(0, 5, vec![arr(vec![bulk("h")])])]), "1 elements"),
        (arr(vec![range(0, 5, vec![node(bulk("h"), 65536)])]), "port 65536"),
        (arr(vec![range(0, 5, vec![node(bulk("h"), -1)])]), "port -1"),
        (arr(vec![range(0, 5, vec![arr(vec![bulk("h"), bulk("1")])])]), "port is a string"),
        (arr(vec![range(0, 5, vec![node(Reply::Int(1), 1)])]), "endpoint is an integer"),
        (arr(vec![range(0, 5, vec![node(bulk("a b"), 1)])]), "invalid endpoint"),
        (arr(vec![range(0, 5, vec![node(Reply::Bulk(Some(vec![0xff])), 1)])]), "invalid"),
    ];
    for (reply, want) in cases {
        let err = parse_cluster_slots(&reply, &asked()).unwrap_err();
        assert!(err.contains(want), "{reply:?}: {err}");
    }
}

#[test]
fn corrupted_real_replies_never_panic() {
    let mut s: u64 = 0x9e3779b97f4a7c15;
    let mut next = move |n: usize| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % n as u64) as usize
    };
    let mut parsed = 0;
    for _ in 0..20_000 {
        let mut buf = SLOTS_7_0_15.to_vec();
        for _ in 0..1 + next(3) {
            let i = next(buf.len());
            buf[i] = b"0123456789:*$-?\r\n"[next(17)];
        }
        if let Ok(Some((reply, _))) = decode(&buf) {
            if let Ok(ranges) = parse_cluster_slots(&reply, &asked()) {
                parsed += 1;
                let t = SlotTable::from_ranges(&ranges);
                assert!(t.served() <= 16384);
            }
        }
    }
    assert!(parsed > 0);
}

#[test]
fn redirects() {
    let m = |s: &str| parse_redirect(s.as_bytes());
    assert_eq!(
        m("MOVED 3999 127.0.0.1:6381"),
        Some(Redirect::Moved { slot: 3999, to: NodeAddr::new("127.0.0.1", 6381) })
    );
    assert_eq!(
        m("ASK 3999 127.0.0.1:6381"),
        Some(Redirect::Ask { slot: 3999, to: NodeAddr::new("127.0.0.1", 6381) })
    );
    assert_eq!(
        m("MOVED 0 ::1:7001"),
        Some(Redirect::Moved { slot: 0, to: NodeAddr::new("::1", 7001) })
    );
    assert_eq!(
        m("MOVED 16383 2001:db8::7:6379"),
        Some(Redirect::Moved { slot: 16383, to: NodeAddr::new("2001:db8::7", 6379) })
    );
    assert_eq!(
        m("ASK 12182 redis-2.cache.example.net:6380"),
        Some(Redirect::Ask { slot: 12182, to: NodeAddr::new("redis-2.cache.example.net", 6380) })
    );
    let Some(Redirect::Moved { to, .. }) = m("MOVED 1 :7002") else { panic!() };
    assert_eq!(to.or_host_of(&asked()), NodeAddr::new("10.0.0.9", 7002));
    assert_eq!(
        NodeAddr::new("h", 1).or_host_of(&asked()),
        NodeAddr::new("h", 1),
        "a host given is kept"
    );
    // Measured on 7.0.15: `GET foo` sent to 17001.
    assert_eq!(
        m("MOVED 12182 127.0.0.1:17003"),
        Some(Redirect::Moved { slot: 12182, to: NodeAddr::new("127.0.0.1", 17003) })
    );
    for bad in [
        "",
        "MOVED",
        "MOVED 3999",
        "MOVED 3999 127.0.0.1",
        "MOVED 3999 127.0.0.1:",
        "MOVED 3999 127.0.0.1:0",
        "MOVED 3999 127.0.0.1:65536",
        "MOVED 3999 127.0.0.1:+80",
        "MOVED 16384 127.0.0.1:6379",
        "MOVED -1 127.0.0.1:6379",
        "MOVED 99999999999 127.0.0.1:6379",
        "MOVED x 127.0.0.1:6379",
        "MOVED  3999 127.0.0.1:6379",
        "MOVED 3999 127.0.0.1:6379 extra",
        "moved 3999 127.0.0.1:6379",
        "ASKING 3999 127.0.0.1:6379",
        "TRYAGAIN Multiple keys request during rehashing of slot",
        "CLUSTERDOWN The cluster is down",
        "NOSCRIPT No matching script. Please use EVAL.",
    ] {
        assert_eq!(m(bad), None, "{bad:?}");
    }
    assert_eq!(parse_redirect(b"MOVED 1 \xff:1"), None);
    let asked = NodeAddr::new("10.0.0.5", 7000);
    assert_eq!(redirect_from(b"MOVED 13646 :7002", &asked).unwrap(), b"MOVED 13646 10.0.0.5:7002");
    assert_eq!(redirect_from(b"ASK 1 :7003", &asked).unwrap(), b"ASK 1 10.0.0.5:7003");
    assert_eq!(redirect_from(b"MOVED 1 10.0.0.6:7003", &asked), None);
    assert_eq!(redirect_from(b"WRONGTYPE x", &asked), None);
}

#[test]
fn node_addr_text() {
    for (text, host, port) in [
        ("127.0.0.1:6379", "127.0.0.1", 6379),
        ("::1:6379", "::1", 6379),
        ("fe80::1%eth0:7000", "fe80::1%eth0", 7000),
        ("node-1.example:65535", "node-1.example", 65535),
    ] {
        let a: NodeAddr = text.parse().unwrap();
        assert_eq!(a, NodeAddr::new(host, port));
        assert_eq!(a.to_string(), text, "Display is host:port, unbracketed");
    }
    for bad in ["", "6379", ":", "h:", "h:0", "h:123456", "h:-1", "h p:1", "h:1 "] {
        assert!(bad.parse::<NodeAddr>().is_err(), "{bad:?}");
    }
}

#[test]
fn table_patch_and_lookup() {
    let ranges = vec![
        SlotRange { start: 0, end: 8191, primary: NodeAddr::new("a", 1) },
        SlotRange { start: 8192, end: 16383, primary: NodeAddr::new("b", 2) },
    ];
    let mut t = SlotTable::from_ranges(&ranges);
    assert_eq!(t.node_of(0), Some(0));
    assert_eq!(t.node_of(16383), Some(1));
    assert_eq!(t.node_of(16384), None, "not a slot");
    assert_eq!(t.node_of(u16::MAX), None);
    assert_eq!(t.patch(5, NodeAddr::new("b", 2)), Some(1), "known node: same index");
    assert_eq!(t.node_of(5), Some(1));
    assert_eq!(t.patch(6, NodeAddr::new("c", 3)), Some(2), "new node appended");
    assert_eq!(t.node_of(6), Some(2));
    assert_eq!(t.node_of(7), Some(0), "only the one slot moves");
    assert_eq!(t.patch(16384, NodeAddr::new("d", 4)), None);
    assert_eq!(t.nodes().len(), 3);
    assert_eq!(t.index_of(&NodeAddr::new("c", 3)), Some(2));
    assert_eq!(SlotTable::default().served(), 0);
    // The same primary in two ranges is one node.
    let split = [
        SlotRange { start: 0, end: 9, primary: NodeAddr::new("a", 1) },
        SlotRange { start: 20, end: 29, primary: NodeAddr::new("a", 1) },
    ];
    let t = SlotTable::from_ranges(&split);
    assert_eq!((t.nodes().len(), t.served(), t.node_of(15)), (1, 20, None));
}

#[test]
fn table_node_list_is_bounded() {
    let mut t = SlotTable::default();
    for i in 0..u32::from(NONE) {
        t.nodes.push(NodeAddr::new(i.to_string(), 1));
    }
    assert_eq!(t.patch(1, NodeAddr::new("new", 1)), None);
    assert_eq!(t.node_of(1), None);
    assert_eq!(t.patch(1, NodeAddr::new("65534", 1)), Some(65534));
}

//! The script's arguments and replies, against the redis crate's own packing.

use super::*;
use crate::codec::call::{split_batch, write_batch};
use crate::codec::resp::{Framer, Head, View, MAX_REPLY_LEN};
use crate::decide::key::Key;
use crate::decide::key_buf::KeyBuf;
use crate::decide::lease::{GiveBack, Grant};

#[test]
fn one_script_hashed_once() {
    assert_eq!(script().sha, sha1_hex(SCRIPT.as_bytes()));
    assert_eq!(script().body, SCRIPT);
    assert!(std::ptr::eq(script(), script()), "one script, its hash computed once");
}

fn zone(key: Key<'_>, algorithm: Algorithm, cost: u64) -> ZoneArgs<'_> {
    ZoneArgs {
        key,
        algorithm,
        limit: 100,
        window_ms: 60_000,
        cost,
        burst: 7,
        member: None,
        lease: None,
        delay: None,
        place: Place::No,
        figures: None,
    }
}

#[test]
fn figures_encoded_once_are_the_bytes_a_request_formats() {
    let algorithms = [
        Algorithm::SlidingLog,
        Algorithm::SlidingCounter,
        Algorithm::Gcra,
        Algorithm::Balance,
        Algorithm::Concurrency,
    ];
    for alg in algorithms {
        let z = zone(Key::new(b"rl:", b"api", b"a"), alg, 3);
        let plain = EncodedArgs::new([z].into_iter(), Some(5));
        let fixed = EncodedFigures::new(alg, 100, 60_000, 3, 7);
        assert_eq!(fixed.limit_digits(100), Some(&b"100"[..]), "{alg:?}");
        assert_eq!(fixed.limit_digits(50), None, "{alg:?}");
        let copied =
            EncodedArgs::new([ZoneArgs { figures: Some(&fixed), ..z }].into_iter(), Some(5));
        assert_eq!(copied, plain, "{alg:?}");
        // Figures the request changed (a local share of the limit), another cost, a member in
        // the burst's place: formatted, never the stale copy.
        let other = [
            ZoneArgs { limit: 50, ..z },
            ZoneArgs { cost: 1, ..z },
            ZoneArgs { member: Some(b"3f2a"), ..z },
            ZoneArgs { lease: Some((9, 1_000)), place: Place::Undo, ..z },
        ];
        for o in other {
            let with = ZoneArgs { figures: Some(&fixed), ..o };
            assert_eq!(
                EncodedArgs::new([with].into_iter(), None),
                EncodedArgs::new([o].into_iter(), None)
            );
        }
    }
}

#[test]
fn a_limit_of_any_length_has_its_digits() {
    for limit in [0, 7, 10_000_000, u64::MAX] {
        let fixed = EncodedFigures::new(Algorithm::SlidingCounter, limit, 1_000, 1, 0);
        assert_eq!(fixed.limit_digits(limit), Some(limit.to_string().as_bytes()));
    }
}

#[test]
fn a_batch_of_one_is_the_plain_call() {
    let zones = [
        zone(Key::new(b"rl:", b"api", b"a"), Algorithm::SlidingLog, 1),
        zone(Key::new(b"rl:", b"ip", b"10.0.0.1"), Algorithm::Gcra, 3),
    ];
    let args = EncodedArgs::new(zones.iter().copied(), Some(1_700_000_000_123));
    assert_call(
        &args,
        &[
            "2",
            "rl:api:a",
            "rl:ip:10.0.0.1",
            "1700000000123",
            "l",
            "100",
            "60000",
            "1",
            "0",
            "g",
            "100",
            "60000",
            "3",
            "7",
        ],
    );
}

#[test]
fn request_id_members_go_as_algorithm_r_in_the_place_of_burst() {
    let mut z = zone(Key::new(b"rl:", b"api", b"a"), Algorithm::SlidingLog, 2);
    z.member = Some(b"0123456789abcdef0123456789abcdef");
    let args = EncodedArgs::new([z].into_iter(), None);
    assert_call(
        &args,
        &["1", "rl:api:a", "", "r", "100", "60000", "2", "0123456789abcdef0123456789abcdef"],
    );
}

#[test]
fn a_zone_asking_for_a_reservation_names_it_in_its_algorithm_field_and_gets_seven_fields() {
    let mut z = zone(Key::new(b"rl:", b"api", b"a"), Algorithm::SlidingCounter, 1);
    z.lease = Some((50, 1000));
    let plain = zone(Key::new(b"rl:", b"ip", b"b"), Algorithm::Gcra, 1);
    let args = EncodedArgs::new([z, plain].into_iter(), Some(7));
    assert_call(
        &args,
        &[
            "2",
            "rl:api:a",
            "rl:ip:b",
            "7",
            "c+50:1000",
            "100",
            "60000",
            "1",
            "0",
            "g",
            "100",
            "60000",
            "1",
            "7",
        ],
    );
    let d = decode_reply(View::of(&ints(&[1, 1, 40, 900, 10, 1000, 77, 99, 1, 5, 600])), &args)
        .unwrap();
    assert_eq!(d.zones[0].grant, Grant { units: 10, life_ms: 1000, token: 77, rid: 99 });
    assert_eq!((d.zones[1].remaining, d.zones[1].grant), (5, Grant::default()));
    // Three fields for the reserving zone: not the script's answer.
    assert_eq!(
        decode_reply(View::of(&ints(&[1, 1, 40, 900, 1, 5, 600])), &args),
        Err(ReplyError::Unexpected)
    );
}

#[test]
fn a_location_that_may_delay_sends_every_zone_its_longest_wait_and_gets_seven_fields() {
    let mut z = zone(Key::new(b"rl:", b"api", b"a"), Algorithm::Gcra, 1);
    z.delay = Some(5000);
    z.lease = Some((50, 1000));
    let mut other = zone(Key::new(b"rl:", b"ip", b"b"), Algorithm::SlidingLog, 1);
    other.delay = Some(0);
    let args = EncodedArgs::new([z, other].into_iter(), None);
    assert_call(
        &args,
        &[
            "2",
            "rl:api:a",
            "rl:ip:b",
            "",
            "g+50:1000~5000",
            "100",
            "60000",
            "1",
            "7",
            "l~0",
            "100",
            "60000",
            "1",
            "0",
        ],
    );
    let reply = [2, 1, 0, 100, 1, 1200, 55, 9, 1, 97, 0, 1, 1200, 4503599627370496, 10];
    let d = decode_reply(View::of(&ints(&reply)), &args).unwrap();
    assert!(d.allowed);
    assert_eq!(d.wait_ms, 1200);
    assert_eq!(d.zones[0].grant, Grant { units: 1, life_ms: 1200, token: 55, rid: 9 });
    assert_eq!(d.zones[1].grant.token, 4503599627370496);
    // One wait for the whole request, never none.
    let uneven = [2, 1, 0, 100, 1, 1200, 55, 9, 1, 97, 0, 1, 900, 4, 10];
    let none = [2, 1, 0, 100, 0, 0, 0, 0, 1, 97, 0, 0, 0, 0, 0];
    for bad in [uneven, none] {
        assert_eq!(
            decode_reply(View::of(&ints(&bad)), &args),
            Err(ReplyError::Unexpected),
            "{bad:?}"
        );
    }
    // A decision that may not wait is never answered with one.
    let plain = [zone(Key::new(b"rl:", b"api", b"a"), Algorithm::Gcra, 1)];
    let plain = EncodedArgs::new(plain.into_iter(), None);
    assert_eq!(decode_reply(View::of(&ints(&[2, 1, 0, 100])), &plain), Err(ReplyError::Unexpected));
}

#[test]
fn a_zone_that_settles_asks_for_a_placement_and_gets_seven_fields() {
    let mut z = zone(Key::new(b"rl:", b"tok", b"a"), Algorithm::SlidingCounter, 100);
    z.place = Place::Settle;
    let mut d = zone(Key::new(b"rl:", b"ip", b"b"), Algorithm::Gcra, 1);
    d.delay = Some(0);
    d.place = Place::Settle;
    let plain = zone(Key::new(b"rl:", b"day", b"c"), Algorithm::SlidingLog, 1);
    let args = EncodedArgs::new([z, d, plain].into_iter(), Some(9));
    let fields = ["3", "rl:tok:a", "rl:ip:b", "rl:day:c", "9", "c!", "100", "60000", "100", "0"];
    let fields = [&fields[..], &["g~0!", "100", "60000", "1", "7", "l", "100", "60000", "1", "0"]];
    assert_call(&args, &fields.concat());
    let reply = [1, 1, 0, 0, 100, 0, 41, 5, 1, 99, 0, 1, 0, 8, 6, 1, 98, 0];
    let d = decode_reply(View::of(&ints(&reply)), &args).unwrap();
    assert_eq!(d.zones[0].grant, Grant { units: 100, life_ms: 0, token: 41, rid: 5 });
    assert_eq!((d.zones[2].remaining, d.wait_ms), (98, 0));
}

#[test]
fn a_give_back_is_a_decision_of_its_own() {
    let g = GiveBack {
        zone: 0,
        key: KeyBuf::of(&[b"rl:api:a"]),
        units: 3,
        token: 1234,
        rid: 1_700_000_000_123_456,
        limit: 100,
        window_ms: 60_000,
    };
    let args = EncodedArgs::give_back(Vec::new(), &g, Algorithm::SlidingLog, g.window_ms);
    let op = "Gl1700000000123456";
    assert_call(&args, &["1", "rl:api:a", "", op, "100", "60000", "3", "1234"]);
    let charge = EncodedArgs::charge(Vec::new(), &g, Algorithm::Gcra, 14404, 7);
    assert_call(&charge, &["1", "rl:api:a", "", "Cg1700000000123456", "100", "14404", "3", "7"]);
    let check = EncodedArgs::check(Vec::new(), b"rl:api:a", u64::MAX);
    assert_call(&check, &["1", "rl:api:a", "", "V18446744073709551615", "1", "1", "0", "0"]);
}

#[test]
fn a_concurrency_zone_sends_its_member_and_a_slot_is_released_or_renewed_alone() {
    let mut z = zone(Key::new(b"rl:", b"conc", b"a"), Algorithm::Concurrency, 1);
    z.member = Some(b"f00d");
    z.window_ms = 5000;
    let args = EncodedArgs::new([z].into_iter(), None);
    assert_call(&args, &["1", "rl:conc:a", "", "n", "100", "5000", "1", "f00d"]);
    let s =
        SlotRef { key: [b"rl:conc:a", b"", b"", b""], limit: 5, life_ms: 5000, member: b"f00d" };
    let release = EncodedArgs::slot_op(Vec::new(), SlotOp::Release, &s);
    assert_call(&release, &["1", "rl:conc:a", "", "Gn", "5", "5000", "1", "f00d"]);
    let renew = EncodedArgs::slot_op(Vec::new(), SlotOp::Renew, &s);
    assert_call(&renew, &["1", "rl:conc:a", "", "Rn", "5", "5000", "1", "f00d"]);
    // A renewal that finds the slot gone: not allowed, the zone not ok.
    assert!(!decode_decision(View::of(&ints(&[0, 0, 4, 0])), 1).unwrap().allowed);
    assert_eq!(Algorithm::parse("concurrency"), Some(Algorithm::Concurrency));
    assert_eq!(Algorithm::Concurrency.capacity(5, 1), 5);
}

#[test]
fn the_slot_of_a_decision_is_the_one_all_its_keys_share() {
    let alg = Algorithm::SlidingLog;
    let one = [zone(Key::new(b"rl:", b"api", b"consumer-42"), alg, 0)];
    assert_eq!(EncodedArgs::new(one.iter().copied(), None).call().slot(), Some(14017));
    let tagged = [
        zone(Key::new(b"rl:", b"min", b"{user1000}"), alg, 0),
        zone(Key::new(b"rl:", b"day", b"{user1000}"), alg, 0),
    ];
    assert_eq!(EncodedArgs::new(tagged.iter().copied(), Some(1)).call().slot(), Some(3443));
    let apart = [
        zone(Key::new(b"rl:", b"min", b"a"), alg, 0),
        zone(Key::new(b"rl:", b"day", b"a"), alg, 0),
    ];
    assert_eq!(EncodedArgs::new(apart.iter().copied(), None).call().slot(), None);
    // Keys with CR, LF and `$` in them are read back whole.
    let odd = [zone(Key::new(b"rl:", b"api", b"a\r\n$3\r\n{x}"), alg, 0)];
    let slot = crate::codec::slot::key_slot(&[b"rl:api:a\r\n$3\r\n{x}"]);
    assert_eq!(EncodedArgs::new(odd.iter().copied(), None).call().slot(), Some(slot));
}

/// A decision of one zone (clock from Redis) and one of two (a gateway clock of 42 ms).
fn two_decisions() -> (EncodedArgs, EncodedArgs) {
    let one = [zone(Key::new(b"rl:", b"api", b"a"), Algorithm::SlidingCounter, 2)];
    let two = [
        zone(Key::new(b"rl:", b"ip", b"b"), Algorithm::SlidingLog, 0),
        zone(Key::new(b"rl:", b"user", b"c"), Algorithm::Gcra, 1),
    ];
    (EncodedArgs::new(one.iter().copied(), None), EncodedArgs::new(two.iter().copied(), Some(42)))
}

#[test]
fn a_batch_puts_every_key_before_every_argument() {
    let (a, b) = two_decisions();
    let mut cmd = Vec::new();
    write_batch(
        &mut cmd,
        &Script { body: "", sha: [b'0'; 40] },
        [a.call(), b.call(), a.call()].into_iter(),
        false,
    );
    let mut expected = redis::cmd("EVALSHA");
    expected.arg(&[b'0'; 40][..]).arg(4).arg("rl:api:a").arg("rl:ip:b").arg("rl:user:c");
    expected.arg("rl:api:a");
    expected.arg("").arg("c").arg(100).arg(60_000).arg(2).arg(0);
    expected.arg(42).arg("l").arg(100).arg(60_000).arg(0).arg(0);
    expected.arg("g").arg(100).arg(60_000).arg(1).arg(7);
    expected.arg("").arg("c").arg(100).arg(60_000).arg(2).arg(0);
    assert_eq!(cmd, expected.get_packed_command());
    // What each decision adds: all but the call's header ("*26" against "*3" when empty).
    let mut empty = Vec::new();
    write_batch(&mut empty, &Script { body: "", sha: [b'0'; 40] }, core::iter::empty(), false);
    assert_eq!(cmd.len(), empty.len() + 1 + 2 * a.call().wire_len() + b.call().wire_len());
}

#[test]
fn a_node_batch_declares_the_keys_of_its_first_decision_only() {
    let (a, b) = two_decisions();
    let script = Script { body: "", sha: [b'0'; 40] };
    let mut cmd = Vec::new();
    write_batch(&mut cmd, &script, [b.call(), a.call(), a.call()].into_iter(), true);
    let mut expected = redis::cmd("EVALSHA");
    expected.arg(&[b'0'; 40][..]).arg(2).arg("rl:ip:b").arg("rl:user:c");
    expected.arg("k2").arg("rl:api:a").arg("rl:api:a");
    expected.arg(42).arg("l").arg(100).arg(60_000).arg(0).arg(0);
    expected.arg("g").arg(100).arg(60_000).arg(1).arg(7);
    expected.arg("").arg("c").arg(100).arg(60_000).arg(2).arg(0);
    expected.arg("").arg("c").arg(100).arg(60_000).arg(2).arg(0);
    assert_eq!(cmd, expected.get_packed_command());
    // A batch of one declares its keys, as ever: no marker.
    let (mut alone, mut plain) = (Vec::new(), Vec::new());
    write_batch(&mut alone, &script, core::iter::once(b.call()), true);
    write_batch(&mut plain, &script, core::iter::once(b.call()), false);
    assert_eq!(alone, plain);
}

#[test]
fn splits_a_batch_reply() {
    let d = |allowed: i64| ints(&[allowed, allowed, 5, 100]);
    let wrong = b"-WRONGTYPE Operation\r\n".to_vec();
    let three = [&b"*3\r\n"[..], &d(1), &wrong, &d(0)].concat();
    let ends = item_ends(&three);
    let parts: Vec<_> = split_batch(View::of(&three), 3, &ends).unwrap().collect();
    assert_eq!(parts, [View::of(&d(1)), View::of(&wrong), View::of(&d(0))]);
    assert!(decode_decision(parts[0], 1).unwrap().allowed);
    assert_eq!(decode_decision(parts[1], 1), Err(ReplyError::Redis("WRONGTYPE Operation".into())));
    assert!(!decode_decision(parts[2], 1).unwrap().allowed);

    // One decision: the reply is that decision's.
    let one = d(1);
    let split = split_batch(View::of(&one), 1, &[]).map(Vec::from_iter);
    assert_eq!(split, Ok(vec![View::of(&one)]));
    let noscript = View::of(b"-NOSCRIPT No matching script\r\n");
    for n in [1, 2] {
        assert_eq!(split_batch(noscript, n, &[]).map(Vec::from_iter), Err(noscript));
    }
    // A reply of another shape concerns the whole call; each decision then decodes it as
    // unexpected.
    let short = [&b"*1\r\n"[..], &d(1)].concat();
    let short = View::of(&short);
    assert_eq!(split_batch(short, 2, &item_ends(short.bytes())).map(Vec::from_iter), Err(short));
    assert_eq!(decode_decision(short, 1), Err(ReplyError::Unexpected));
    let int = View::of(b":1\r\n");
    assert_eq!(split_batch(int, 2, &[]).map(Vec::from_iter), Err(int));
    let nil = View::of(b"*-1\r\n");
    assert_eq!(split_batch(nil, 2, &[]).map(Vec::from_iter), Err(nil));
    // Ends that are not the reply's (never so from its framer): fewer replies, no panic.
    let wrong_ends = split_batch(View::of(&three), 3, &[2, 99, 100]).unwrap();
    assert_eq!(wrong_ends.count(), 0);
}

/// Where a reply's items end, as `Conn::read`'s framer finds them.
fn item_ends(wire: &[u8]) -> Vec<usize> {
    let mut framer = Framer::default();
    assert_eq!(framer.frame(wire, MAX_REPLY_LEN), Ok(Some(wire.len())));
    framer.ends().to_vec()
}

/// A batch's replies as Redis sends them: nested arrays of a decision's integers, an error
/// among them for one decision, as the redis crate's parser reads the same bytes.
#[test]
fn a_batch_reply_reads_as_the_redis_crate_parses_it() {
    let leased = ints(&[1, 1, 40, 900, 10, 1000, 77, 99, 1, 5, 600]);
    let plain = ints(&[0, 0, 0, 1200]);
    let error = b"-ERR user_script:1: ratelimit: bad limit\r\n".to_vec();
    let wire = [&b"*3\r\n"[..], &leased, &error, &plain].concat();
    let theirs = match redis::parse_redis_value(&wire).unwrap() {
        redis::Value::Array(items) => items,
        other => panic!("{other:?}"),
    };
    let ends = item_ends(&wire);
    let ours: Vec<_> = split_batch(View::of(&wire), 3, &ends).unwrap().collect();
    assert_eq!(ours.len(), theirs.len());
    for (view, value) in ours.iter().zip(&theirs) {
        match value {
            redis::Value::Array(values) => {
                let got: Vec<redis::Value> = view
                    .items()
                    .unwrap()
                    .map(|v| match v.head() {
                        Some(Head::Int(i)) => redis::Value::Int(i),
                        other => panic!("{other:?}"),
                    })
                    .collect();
                assert_eq!(&got, values);
            }
            redis::Value::ServerError(e) => {
                assert_eq!(view.error(), Some(&b"ERR user_script:1: ratelimit: bad limit"[..]));
                assert_eq!(e.code(), "ERR");
            }
            other => panic!("{other:?}"),
        }
    }
    let plain_args = EncodedArgs::new(
        [zone(Key::new(b"rl:", b"api", b"a"), Algorithm::Gcra, 1)].into_iter(),
        None,
    );
    assert!(!decode_reply(ours[2], &plain_args).unwrap().allowed);
    assert!(matches!(decode_reply(ours[1], &plain_args), Err(ReplyError::Redis(_))));
}

#[test]
fn redis_clock_sends_an_empty_now() {
    let zones = [zone(Key::new(b"", b"z", b"k"), Algorithm::SlidingCounter, 0)];
    let mut cmd = Vec::new();
    let args = EncodedArgs::new(zones.iter().copied(), None);
    write_batch(
        &mut cmd,
        &Script { body: "", sha: [b'0'; 40] },
        core::iter::once(args.call()),
        false,
    );
    assert!(cmd.windows(6).any(|w| w == b"$0\r\n\r\n"));
}

#[test]
fn algorithms() {
    assert_eq!(Algorithm::parse("gcra"), Some(Algorithm::Gcra));
    assert_eq!(Algorithm::parse("sliding_counter"), Some(Algorithm::SlidingCounter));
    assert_eq!(Algorithm::parse("sliding_log"), Some(Algorithm::SlidingLog));
    assert_eq!(Algorithm::parse("sliding_log_packed"), Some(Algorithm::SlidingLogPacked));
    assert_eq!(Algorithm::SlidingLogPacked.capacity(100, 5), 100);
    assert_eq!(Algorithm::parse("log"), None);
    assert_eq!(Algorithm::Gcra.capacity(100, 5), 5);
    assert_eq!(Algorithm::SlidingLog.capacity(100, 5), 100);
    assert_eq!(Algorithm::SlidingLog.max_limit(), 100_000);
    assert_eq!(Algorithm::SlidingLogPacked.max_limit(), 10_000);
    assert_eq!(Algorithm::Gcra.max_limit(), MAX_LIMIT);
    assert_eq!(Algorithm::parse("balance"), Some(Algorithm::Balance));
    assert_eq!(Algorithm::CalendarQuota.capacity(100, 5), 100);
    assert_eq!(Algorithm::Balance.capacity(100, 5), u64::MAX);
}

/// `args` as the one decision of a call: `EVALSHA <sha> <fields>`, as the redis crate packs it.
fn assert_call(args: &EncodedArgs, fields: &[&str]) {
    let mut expected = redis::cmd("EVALSHA");
    expected.arg(&[b'f'; 40][..]);
    for f in fields {
        expected.arg(*f);
    }
    let mut cmd = Vec::new();
    write_batch(
        &mut cmd,
        &Script { body: "return 1", sha: [b'f'; 40] },
        core::iter::once(args.call()),
        false,
    );
    assert_eq!(cmd, expected.get_packed_command());
}

/// An array of integers as Redis sends it.
fn ints(v: &[i64]) -> Vec<u8> {
    let mut wire = format!("*{}\r\n", v.len());
    v.iter().for_each(|i| wire += &format!(":{i}\r\n"));
    wire.into_bytes()
}

#[test]
fn decodes_allow_and_deny() {
    let d = decode_decision(View::of(&ints(&[1, 1, 41, 17_000])), 1).unwrap();
    assert_eq!(
        d,
        Decision {
            allowed: true,
            wait_ms: 0,
            zones: vec![ZoneVerdict {
                ok: true,
                remaining: 41,
                reset_ms: 17_000,
                grant: Grant::default()
            }]
        }
    );
    let d = decode_decision(View::of(&ints(&[0, 1, 5, 100, 0, 0, 900, 0, 0, 1200])), 3).unwrap();
    assert!(!d.allowed);
    assert_eq!(d.deciding_zone(), 2);
    let d = decode_decision(View::of(&ints(&[1, 1, 5, 100, 1, 2, 900])), 2).unwrap();
    assert_eq!(d.deciding_zone(), 1);
    // One zone, as give-backs, checks and renewals read it: the same verdict, no list.
    for reply in [ints(&[1, 1, 41, 17_000]), ints(&[0, 0, 0, 900])] {
        let d = decode_decision(View::of(&reply), 1).unwrap();
        assert_eq!(decode_one(View::of(&reply)), Ok((d.allowed, d.zones[0])));
    }
}

#[test]
fn rejects_bad_replies() {
    assert_eq!(
        decode_decision(View::of(b"-NOSCRIPT No matching script\r\n"), 1),
        Err(ReplyError::NoScript)
    );
    assert_eq!(
        decode_decision(View::of(b"-WRONGTYPE Operation\r\n"), 1),
        Err(ReplyError::Redis("WRONGTYPE Operation".into()))
    );
    for bad in [ints(&[1, 1, 2]), ints(&[2, 1, 2, 3]), ints(&[1, 0, 2, 3]), ints(&[1, 1, -2, 3])] {
        assert_eq!(decode_decision(View::of(&bad), 1), Err(ReplyError::Unexpected), "{bad:?}");
    }
    // Nil, other types where the integers go, a nested array, and bytes that are no reply
    // (cut, corrupt, empty): each a clear error, never a panic.
    let bad: [&[u8]; 12] = [
        b"$-1\r\n",
        b"*-1\r\n",
        b"*0\r\n",
        b"+OK\r\n",
        b"*4\r\n:1\r\n$1\r\n1\r\n:5\r\n:100\r\n",
        b"*4\r\n:1\r\n*1\r\n:1\r\n:5\r\n:100\r\n",
        b"*4\r\n:1\r\n:1\r\n:5\r\n$-1\r\n",
        b"*4\r\n:1\r\n:1\r\n:5\r\n",
        b"*4\r\n:1\r\n:1\r\n:5\r\n:10",
        b"*4\r\n:1\r\n:x\r\n:5\r\n:100\r\n",
        b"*4\r\n",
        b"",
    ];
    for bad in bad {
        assert_eq!(decode_decision(View::of(bad), 1), Err(ReplyError::Unexpected), "{bad:?}");
        assert_eq!(decode_one(View::of(bad)), Err(ReplyError::Unexpected), "{bad:?}");
    }
    assert_eq!(
        decode_one(View::of(b"-NOSCRIPT No matching script\r\n")),
        Err(ReplyError::NoScript)
    );
}

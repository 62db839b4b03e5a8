//! Reservations: spending, asking, giving back, and what changes heard of do to them.

use super::*;

impl Leases {
    fn held_mut(&mut self, key: &[u8]) -> Option<&mut Held> {
        self.entry(&TableKey::new(0, &[key]))?.held.as_mut()
    }

    /// What a sweep at `now` gives back.
    fn swept(&mut self, now: u64, timeout_ms: u64) -> Vec<GiveBack> {
        let mut out = Vec::new();
        self.sweep(now, timeout_ms, &mut out);
        out
    }
}

const F: Figures = Figures { limit: 100, window_ms: 60_000 };

fn ask(key: &[u8], cost: u64) -> Ask<'_> {
    ask_in(0, key, cost)
}

fn ask_in(zone: usize, key: &[u8], cost: u64) -> Ask<'_> {
    Ask { key: TableKey::new(zone, &[b"rl:", b"api", b":", key]), cost, figures: F }
}

fn grant(units: u64) -> Grant {
    Grant { units, life_ms: 1000, token: 500, rid: 7 }
}

#[test]
fn life_is_lease_time_at_most_a_quarter_of_the_window() {
    let c = LeaseConf { size: LeaseSize::Auto, time_ms: 1000 };
    assert_eq!(c.life_ms(60_000), 1000);
    assert_eq!(c.life_ms(2000), 500);
    assert_eq!(margin_ms(1000), 20);
    assert_eq!(margin_ms(100), 10);
}

#[test]
fn auto_asks_nothing_for_a_key_seen_once_then_what_it_took_over_a_life() {
    let mut l = Leases::new(10, 0);
    let a = ask(b"k", 1);
    for t in 0..4 {
        assert_eq!(l.want(&a, LeaseSize::Auto, 1000, false, t), 0, "seen {t}");
    }
    assert_eq!(l.want(&a, LeaseSize::Auto, 1000, false, 10), 4);
    // While that is asked for, the key's other requests are decided exactly.
    for t in 11..40 {
        assert_eq!(l.want(&a, LeaseSize::Auto, 1000, false, t), 0);
    }
    l.answered(&a, 40);
    assert_eq!(l.want(&a, LeaseSize::Auto, 1000, false, 50), 34);
    // Unanswered for a whole life: asked again. The next life asks for what the last took.
    assert_eq!(l.want(&a, LeaseSize::Auto, 1000, false, 1100), 35);
    // Never more than the limit; a key quiet for two lives starts over.
    assert_eq!(l.want(&a, LeaseSize::Auto, 1000, false, 5000), 0);
    let big = Ask { cost: 500, ..ask(b"k", 500) };
    assert_eq!(l.want(&big, LeaseSize::Auto, 1000, false, 5001), 0);
    assert_eq!(l.want(&big, LeaseSize::Auto, 1000, false, 5002), 100);
    l.answered(&a, 5002);
    assert_eq!(l.want(&a, LeaseSize::Fixed(7), 1000, false, 5003), 7);
}

#[test]
fn spends_locally_until_spent_or_expired_with_the_margin() {
    let mut l = Leases::new(10, 0);
    let a = ask(b"k", 2);
    assert_eq!(l.try_spend([ask(b"k", 1)], 0), None);
    assert_eq!(l.granted(&a, grant(5), 100, 40, 3000, false, false), None);
    assert_eq!(l.try_spend([ask(b"k", 2)], 150), Some((0, 43, 2950)));
    assert_eq!(l.try_spend([ask(b"k", 2)], 200), Some((0, 41, 2900)));
    // One left: a request of two goes to Redis, one of one spends it.
    assert_eq!(l.try_spend([ask(b"k", 2)], 200), None);
    assert_eq!(l.try_spend([ask(b"k", 1)], 200), Some((0, 40, 2900)));
    assert_eq!(l.try_spend([ask(b"k", 1)], 200), None);
    // Expiry: life 1000 from the start at 100, less a 20 ms margin.
    l.granted(&a, grant(5), 1000, 40, 0, false, false);
    assert!(l.try_spend([ask(b"k", 1)], 1979).is_some());
    assert_eq!(l.try_spend([ask(b"k", 1)], 1980), None);
}

#[test]
fn a_clock_updated_by_timer_resolution_stops_spending_that_much_earlier() {
    let mut l = Leases::new(10, 100);
    l.granted(&ask(b"k", 1), grant(5), 1000, 40, 0, false, false);
    // Life 1000 less the 20 ms margin and the 100 ms the clock may lag.
    assert!(l.try_spend([ask(b"k", 1)], 1879).is_some());
    assert_eq!(l.try_spend([ask(b"k", 1)], 1880), None);
    // A life no longer than both is not kept: it is not spendable at all.
    let short = Grant { life_ms: 110, ..grant(5) };
    assert_eq!(l.granted(&ask(b"j", 1), short, 2000, 40, 0, false, false), None);
    assert_eq!(l.try_spend([ask(b"j", 1)], 2000), None);
}

#[test]
fn a_request_spends_from_every_zone_or_from_none() {
    let mut l = Leases::new(10, 0);
    let b = ask_in(1, b"k", 1);
    l.granted(&ask(b"k", 1), grant(3), 0, 0, 0, false, false);
    assert_eq!(l.try_spend([ask(b"k", 1), ask_in(1, b"k", 1)], 10), None);
    l.granted(&b, grant(1), 0, 0, 0, false, false);
    // Zone 1 has the least left: it describes the request.
    assert_eq!(l.try_spend([ask(b"k", 1), ask_in(1, b"k", 1)], 10), Some((1, 0, 0)));
    // Zone 1 is spent: zone 0 keeps its two.
    assert_eq!(l.try_spend([ask(b"k", 1), ask_in(1, b"k", 1)], 10), None);
    assert_eq!(l.drain().iter().map(|g| g.units).sum::<u64>(), 2);
    // Zone 0's last unit, spent before zone 1 is found empty, is its own again.
    l.granted(&ask(b"k", 1), grant(1), 0, 0, 0, false, false);
    assert_eq!(l.try_spend([ask(b"k", 1), ask_in(1, b"k", 1)], 10), None);
    l.granted(&b, grant(1), 0, 0, 0, false, false);
    assert_eq!(l.try_spend([ask(b"k", 1), ask_in(1, b"k", 1)], 10), Some((0, 0, 0)));
    assert_eq!(l.try_spend([ask(b"k", 1)], 10), None, "used up: let go");
}

#[test]
fn other_figures_are_not_served_from_a_reservation() {
    let mut l = Leases::new(10, 0);
    l.granted(&ask(b"k", 1), grant(3), 0, 0, 0, false, false);
    let other = Ask { figures: Figures { limit: 50, window_ms: 60_000 }, ..ask(b"k", 1) };
    assert_eq!(l.try_spend([other], 10), None);
}

#[test]
fn what_is_left_goes_back_at_expiry_replacement_and_drain() {
    let mut l = Leases::new(10, 0);
    let a = ask(b"k", 1);
    l.granted(&a, grant(5), 0, 0, 0, true, false);
    l.try_spend([ask(b"k", 1)], 10).unwrap();
    l.try_spend([ask(b"k", 1)], 10).unwrap();
    assert_eq!(l.swept(500, 500), vec![]);
    let back = l.swept(980, 500);
    // The log names the unspent members: the token plus the two spent.
    assert_eq!(
        back,
        vec![GiveBack {
            zone: 0,
            key: KeyBuf::of(&[b"rl:api:k"]),
            units: 3,
            token: 502,
            rid: 7,
            limit: 100,
            window_ms: 60_000
        }]
    );
    assert_eq!(l.swept(990, 500), vec![]);
    l.granted(&a, grant(4), 1000, 0, 0, false, false);
    let old = l.granted(&a, grant(4), 1100, 0, 0, false, false).unwrap();
    assert_eq!((old.units, old.token), (4, 500));
    assert_eq!(l.drain().len(), 1);
    assert!(l.is_empty());
}

const KEY: &[u8] = b"rl:api:k";

fn check_of(l: &mut Leases, gone: bool) -> Check {
    let mut c = Vec::new();
    l.checks(3, KEY, gone, 0, |x| c.push(x));
    assert_eq!(c.len(), 1);
    c[0]
}

#[test]
fn a_change_is_checked_by_rid_and_stops_the_spending_unless_it_is_most_likely_our_own() {
    let mut l = Leases::new(10, 0);
    l.granted(&ask(b"k", 1), grant(5), 0, 0, 0, false, false);
    assert!(l.changed(3, KEY, 0).is_some(), "the key's tracking to renew");
    assert_eq!(l.try_spend([ask(b"k", 1)], 10), None, "someone else's change: stopped");
    let c = check_of(&mut l, false);
    assert_eq!((c.zone, c.rid), (0, 7));
    let mut again = 0;
    l.checks(3, KEY, false, 0, |_| again += 1);
    assert_eq!(again, 0, "one check at a time");
    // Still of the key's life.
    assert!(!l.checked(KEY, c, Some(true), 0));
    assert!(l.try_spend([ask(b"k", 1)], 10).is_some());
    // Redis answered this worker's own decision of the key: its write is the change told of.
    l.answered(&ask(b"k", 5), 8);
    assert!(l.changed(3, KEY, 10).is_some());
    assert!(l.try_spend([ask(b"k", 1)], 10).is_some(), "spent during that check");
    let c = check_of(&mut l, false);
    // Of an older life (a reset, whoever re-created the key since): dropped, nothing back.
    assert!(!l.checked(KEY, c, Some(false), 0));
    assert_eq!(l.try_spend([ask(b"k", 1)], 10), None);
    assert_eq!(l.drain(), vec![]);
}

#[test]
fn a_change_heard_long_after_this_workers_decision_is_someone_elses() {
    let mut l = Leases::new(10, 0);
    l.granted(&ask(b"k", 1), grant(5), 0, 0, 0, false, false);
    // A decision that wrote while the key was not tracked: no change of its own is ever told
    // of, and a reset a second later must not pass for it.
    l.answered(&ask(b"k", 5), 0);
    assert!(l.changed(3, KEY, 1000).is_some());
    assert_eq!(l.try_spend([ask(b"k", 1)], 1000), None, "stopped until the check answers");
    let c = check_of(&mut l, false);
    assert!(!l.checked(KEY, c, Some(false), 1000));
    assert_eq!(l.try_spend([ask(b"k", 1)], 1000), None);
}

#[test]
fn a_key_found_gone_stops_the_spending_until_the_check_answers() {
    let mut l = Leases::new(10, 0);
    l.granted(&ask(b"k", 1), grant(5), 0, 0, 0, false, false);
    l.changed(3, KEY, 0);
    let c = check_of(&mut l, true);
    assert_eq!(l.try_spend([ask(b"k", 1)], 10), None);
    // Granted since the reset (a stale "gone"): its rid says so, and it is spent again.
    assert!(!l.checked(KEY, c, Some(true), 0));
    assert!(l.try_spend([ask(b"k", 1)], 10).is_some());
    // Found gone by another's EXISTS, no check on its way: checked too.
    let c = check_of(&mut l, true);
    assert_eq!(l.try_spend([ask(b"k", 1)], 10), None);
    assert!(!l.checked(KEY, c, Some(false), 0));
    assert_eq!(l.drain(), vec![]);
}

#[test]
fn a_change_heard_during_a_check_is_checked_after_it() {
    let mut l = Leases::new(10, 0);
    l.granted(&ask(b"k", 1), grant(5), 0, 0, 0, false, false);
    l.changed(3, KEY, 0);
    let first = check_of(&mut l, false);
    assert!(l.changed(3, KEY, 0).is_none(), "not a second check at once");
    assert!(l.checked(KEY, first, Some(true), 0), "checked again: the tracking to renew");
    let again = check_of(&mut l, false);
    assert!(!l.checked(KEY, again, Some(false), 0), "that check finds a reset");
    assert_eq!(l.try_spend([ask(b"k", 1)], 10), None);
}

#[test]
fn a_reset_or_a_flush_heard_during_the_check_of_an_own_write_stops_the_spending() {
    // t/450's trace: this worker's own write is being checked (spent meanwhile) when another
    // gateway's reset is heard (or a flush); the check on its way may have run before it.
    for flush in [false, true] {
        let mut l = Leases::new(10, 0);
        l.granted(&ask(b"k", 1), grant(5), 0, 0, 0, false, false);
        l.answered(&ask(b"k", 5), 0);
        assert!(l.changed(3, KEY, 10).is_some());
        assert!(l.try_spend([ask(b"k", 1)], 10).is_some(), "its own write: spent during the check");
        let first = check_of(&mut l, false);
        if flush {
            l.suspect_all(300, |_, _| panic!("a check on its way: the next one follows it"));
        } else {
            assert!(
                l.changed(3, KEY, 300).is_none(),
                "a change during the check: checked after it"
            );
        }
        // A flush is never this worker's own.
        assert_eq!(l.try_spend([ask(b"k", 1)], 300), None, "someone else's: not spent meanwhile");
        assert!(l.checked(KEY, first, Some(true), 300), "the first check ran before the reset");
        assert_eq!(
            l.try_spend([ask(b"k", 1)], 300),
            None,
            "still not spent: the next check decides"
        );
        let again = check_of(&mut l, false);
        assert!(!l.checked(KEY, again, Some(true), 310));
        assert!(
            l.try_spend([ask(b"k", 1)], 310).is_some(),
            "of the key's life after all: spent again"
        );
    }
}

#[test]
fn a_reservation_is_checked_once_its_keys_tracking_is_renewed_after_the_grant() {
    // A reset between the decision's write and the renewal of the key's tracking is told of
    // by nothing: the key another gateway re-created since is there when the renewal answers.
    let mut l = Leases::new(10, 0);
    l.answered(&ask(b"k", 5), 0);
    l.granted(&ask(b"k", 1), grant(5), 0, 0, 0, false, true);
    assert!(l.try_spend([ask(b"k", 1)], 1).is_some(), "spent while the tracking is renewed");
    let c = check_of(&mut l, false);
    assert_eq!((c.zone, c.rid), (0, 7));
    assert!(l.try_spend([ask(b"k", 1)], 2).is_some(), "and during the check");
    assert!(!l.checked(KEY, c, Some(false), 3));
    assert_eq!(l.try_spend([ask(b"k", 1)], 3), None, "of an older life: dropped");
    // A change told of after the grant, before the renewal answered (the decision's own write,
    // or a reset right after it): the tracking it ended is renewed again, and the check, sent
    // when a renewal answers, reads the key after the change; nothing spent until it answers.
    l.answered(&ask(b"k", 5), 10);
    l.granted(&ask(b"k", 1), grant(5), 10, 0, 0, false, true);
    assert!(l.changed(3, KEY, 11).is_some(), "renewed again");
    assert_eq!(l.try_spend([ask(b"k", 1)], 11), None, "not taken for the decision's own write");
    let c = check_of(&mut l, false);
    assert!(!l.checked(KEY, c, Some(true), 13), "that check read the key after the change");
    assert!(l.try_spend([ask(b"k", 1)], 13).is_some(), "of the key's life: spent again");
    // So is a flush.
    l.granted(&ask(b"k", 1), Grant { rid: 8, ..grant(5) }, 20, 0, 0, false, true);
    let mut renewed = 0;
    l.suspect_all(21, |_, _| {
        renewed += 1;
        true
    });
    assert_eq!(renewed, 1);
    assert_eq!(l.try_spend([ask(b"k", 1)], 21), None);
    let c = check_of(&mut l, false);
    assert!(!l.checked(KEY, c, Some(true), 23));
    assert!(l.try_spend([ask(b"k", 1)], 23).is_some());
}

#[test]
fn an_answer_about_an_older_grant_touches_neither_a_newer_grant_nor_its_check() {
    let mut l = Leases::new(10, 0);
    l.granted(&ask(b"k", 1), grant(5), 0, 0, 0, false, false);
    l.changed(3, KEY, 0);
    let old = check_of(&mut l, true);
    // The key's reset is answered late: meanwhile its next life granted another.
    l.held_mut(KEY).unwrap().spent = 5;
    l.granted(&ask(b"k", 1), Grant { rid: 8, ..grant(5) }, 20, 0, 0, false, false);
    assert!(!l.checked(KEY, old, Some(false), 0));
    assert!(l.try_spend([ask(b"k", 1)], 30).is_some(), "the new life's grant stands");
    // No answer (Redis silent): spent while Redis cannot be asked, checked again later.
    l.changed(3, KEY, 0);
    let c = check_of(&mut l, true);
    assert!(!l.checked(KEY, c, None, 0));
    assert!(l.try_spend([ask(b"k", 1)], 30).is_some());
    assert_eq!(l.swept(1000, 500).iter().map(|g| (g.units, g.rid)).collect::<Vec<_>>(), [(3, 8)]);
}

#[test]
fn a_check_redis_does_not_answer_in_time_is_given_up_and_tried_again() {
    let mut l = Leases::new(10, 0);
    l.granted(&ask(b"k", 1), grant(5), 0, 0, 0, false, false);
    assert!(l.changed(3, KEY, 100).is_some());
    l.checks(3, KEY, true, 100, |_| {});
    assert_eq!(l.try_spend([ask(b"k", 1)], 200), None);
    // The check unanswered for the whole timeout (300 ms): Redis is silent.
    assert_eq!(l.swept(399, 300), vec![]);
    assert_eq!(l.try_spend([ask(b"k", 1)], 399), None);
    assert_eq!(l.swept(400, 300), vec![]);
    assert!(l.try_spend([ask(b"k", 1)], 400).is_some(), "spent while Redis is silent");
    // Tried again, spent meanwhile; at most once a second.
    let mut tracked = 0;
    l.verify_unverified(400, |_, _| {
        tracked += 1;
        true
    });
    l.verify_unverified(900, |_, _| panic!("not within a second"));
    assert_eq!(tracked, 1);
    assert!(l.try_spend([ask(b"k", 1)], 450).is_some(), "a check in the background");
    let c = check_of(&mut l, false);
    assert!(!l.checked(KEY, c, Some(false), 460), "Redis back: the reservation was reset");
    assert_eq!(l.try_spend([ask(b"k", 1)], 470), None);
}

#[test]
fn lost_tracking_keeps_reservations_spendable_until_they_can_be_checked() {
    let mut l = Leases::new(10, 0);
    l.granted(&ask(b"k", 1), grant(5), 0, 0, 0, false, false);
    l.unverify_all();
    assert!(l.try_spend([ask(b"k", 1)], 10).is_some(), "Redis away: what it counted is spent");
    l.verify_unverified(0, |_, _| false);
    assert!(l.try_spend([ask(b"k", 1)], 10).is_some(), "still no tracking");
    let mut tracked = Vec::new();
    l.verify_unverified(1000, |_, k| {
        tracked.push(k.to_vec());
        true
    });
    assert_eq!(tracked, [KEY.to_vec()]);
    assert!(l.try_spend([ask(b"k", 1)], 10).is_some(), "tracked again: checked meanwhile");
    let c = check_of(&mut l, false);
    assert!(!l.checked(KEY, c, Some(true), 0));
    assert!(l.try_spend([ask(b"k", 1)], 10).is_some());
    l.verify_unverified(5000, |_, _| panic!("nothing left to check"));
}

#[test]
fn a_held_reservation_is_not_replaced_and_an_expired_one_goes_back_before_the_next_ask() {
    let mut l = Leases::new(10, 0);
    let a = ask(b"k", 1);
    for t in 0..5 {
        l.want(&a, LeaseSize::Auto, 1000, false, t);
    }
    l.granted(&a, grant(5), 0, 0, 0, false, false);
    l.changed(3, KEY, 0);
    l.checks(3, KEY, true, 0, |_| {});
    // Not spent (its key was found gone): decided exactly, asking for nothing (a gcra
    // reservation replaced by another cannot be given back).
    assert_eq!(l.want(&a, LeaseSize::Fixed(9), 1000, false, 10), 0);
    assert_eq!(l.take_back().len(), 0);
    // Over: given back ahead of the ask for the next one.
    assert_eq!(l.want(&a, LeaseSize::Fixed(9), 1000, false, 980), 9);
    assert_eq!(l.take_back().map(|g| g.units).collect::<Vec<_>>(), [5]);
    assert_eq!(l.take_back().len(), 0);
    assert_eq!(l.swept(990, 500), vec![], "not twice");
}

#[test]
fn the_table_is_bounded_and_new_keys_beyond_it_are_exact() {
    let mut l = Leases::new(2, 0);
    l.want(&ask(b"a", 1), LeaseSize::Auto, 1000, false, 0);
    l.want(&ask(b"b", 1), LeaseSize::Auto, 1000, false, 0);
    assert_eq!(l.want(&ask(b"c", 1), LeaseSize::Fixed(9), 1000, false, 0), 0);
    // A grant for a key that found no room goes straight back.
    let back = l.granted(&ask(b"c", 1), grant(5), 0, 0, 0, false, false).unwrap();
    assert_eq!(back.units, 5);
    assert_eq!(l.len(), 2);
    // Idle keys leave after two lives, making room, swept every 100 ms as the timer does.
    for t in (100..2000).step_by(100) {
        assert_eq!(l.swept(t, 500), vec![]);
        assert_eq!(l.len(), 2, "at {t}");
    }
    assert_eq!(l.swept(2000, 500), vec![]);
    assert!(l.is_empty());
}

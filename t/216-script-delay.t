# Delayed admissions (issue 33) in the decision script, run directly against a
# real redis-server with an injected clock (no nginx).  The protocol is the
# script's header comment; in short:
#   a zone's algorithm field ends with "~<D>" (l p c g q, plain or reserve form),
#   D the longest it lets the request wait, in ms; every zone of the decision
#   carries one, or none does, and each then answers 7 fields:
#   ok remaining reset_ms granted lease_ms token rid
#   allowed 1: admitted now (granted 0 for a plain letter);
#   allowed 2: delayed: recorded at T = the latest zone's fit time, in every
#   zone, as `cost` units reserved at T (granted = cost, lease_ms = T - now,
#   token as a reservation's, rid its ledger entry); nothing at now
#   allowed 0: rejected as without "~", nothing written, zeros after reset_ms
# Expectations are literals worked out by hand; t below is the offset from T0.
use lib 't/lib';
use RLTest;
use RLTest::Script qw(:all);

my $R = 2**52;    # reserved sliding_log members start here (plus the clock in µs)
my $T0 = 10_000_000;

# A reply as "allowed | ok remaining reset granted lease token | ...": 7 fields a
# zone, the rid kept in %RID by key and checked to be there exactly when units
# were placed (every key here has a ledger).
our %RID;
sub show {
    my ($r, @keys) = @_;
    return zone_fields($r, [(7) x @keys], sub { $RID{ $keys[$_[0]] } = $_[1] });
}

# One decision at T0 + t: zones [key, field, limit, window, cost (1), burst (0)].
sub dec {
    my ($t, @z) = @_;
    my @zz = map { [$_->[0], $_->[1], $_->[2], $_->[3], $_->[4] // 1, $_->[5] // 0] } @z;
    my $r = decide_raw([map { $_->[0] } @zz], $T0 + $t, map { @$_[1 .. 5] } @zz);
    return show($r, map { $_->[0] } @zz);
}

sub zscores {
    my $v = redis_cmd('ZRANGE', $_[0], 0, -1, 'WITHSCORES');
    my @p;
    push @p, ($v->[2 * $_] >= $R ? 'm' : 'a') . '@' . ($v->[2 * $_ + 1] - $T0) for 0 .. $#$v / 2;
    return join ',', @p;
}

sub entries {
    my $v = redis_cmd('GET', $_[0]);
    return 'none' unless defined $v;
    return join ',', map { (unpack('Q<', substr($v, 6 * $_, 6) . "\0\0") - $T0) } 0 .. length($v) / 6 - 1;
}

sub pttl_in {
    my ($key, $lo, $hi, $name) = @_;
    my $t = redis_cmd('PTTL', $key);
    ok($t > $lo && $t <= $hi, "$name: PTTL $t in ($lo, $hi]");
}

# The members of a reservation made at t with a gateway clock, when nothing in
# the set is above them: 2^52 + (T0 + t) in µs.
sub m0 { sprintf '%.0f', $R + ($T0 + $_[0]) * 1000 }
# A gcra token: the TAT left, (ms mod 2^22) * limit + r + 1.
sub gtok { my ($t, $limit, $r) = @_; (($T0 + $t) % 4194304) * $limit + ($r // 0) + 1 }

# A give-back's reply (4 integers) as one line.
sub raw { ref $_[0] eq 'ARRAY' ? "@{$_[0]}" : RLTest::Redis::format_reply($_[0]) }

sub quota_value {
    my $v = redis_cmd('GET', $_[0]);
    return $v unless defined $v && length $v == 10;
    my ($lo, $hi, $c) = unpack('V v V', $v);
    return ($hi * 2**32 + $lo) . ":$c";
}

######################################################################
# Sliding log ("l") and its packed form ("p"): limit 3 per 1000 ms, D 500.
for my $alg ('l', 'p') {
    my $k = "rl:delay:$alg";
    my $f = "$alg~500";
    is(dec(0, [$k, $f, 3, 1000]), '1 | 1 2 1000 0 0 0', "$alg: fits now");
    is(dec(100, [$k, $f, 3, 1000]), '1 | 1 1 900 0 0 0', "$alg: fits now");
    is(dec(200, [$k, $f, 3, 1000]), '1 | 1 0 800 0 0 0', "$alg: fits now, full");
    # t=600: the entry of t=0 leaves at 1000: wait 400 <= 500.  Remaining 0, and
    # one unit is back when the entry of t=100 leaves (500 ms).
    my $tok = $alg eq 'l' ? m0(600) : $T0 + 1000;
    is(dec(600, [$k, $f, 3, 1000]), "2 | 1 0 500 1 400 $tok", "$alg: delayed 400 ms, to t=1000");
    is($alg eq 'l' ? zscores($k) : entries($k), $alg eq 'l' ? 'a@0,a@100,a@200,m@1000' : '0,100,200,1000',
        "$alg: recorded at t=1000, nothing at t=600");
    pttl_in($k, 1300, 1400, "$alg: until the delayed entry leaves the window");
    # t=700: behind it, the entry of t=100 leaves at 1100.
    $tok = $alg eq 'l' ? m0(700) : $T0 + 1100;
    is(dec(700, [$k, $f, 3, 1000]), "2 | 1 0 500 1 400 $tok", "$alg: the next one queues behind, t=1100");
    $tok = $alg eq 'l' ? m0(710) : $T0 + 1200;
    is(dec(710, [$k, $f, 3, 1000]), "2 | 1 0 1290 1 490 $tok", "$alg: and the next, t=1200");
    # t=720: the entry it waits for is the delayed one of t=1000: 1280 ms > 500.
    my $before = snapshot($k);
    is(dec(720, [$k, $f, 3, 1000]), '0 | 0 0 1280 0 0 0', "$alg: beyond D: rejected");
    is(snapshot($k), $before, "$alg: ... writing nothing");
    is($alg eq 'l' ? zscores($k) : entries($k),
        $alg eq 'l' ? 'a@0,a@100,a@200,m@1000,m@1100,m@1200' : '0,100,200,1000,1100,1200',
        "$alg: at most 3 in any window by admission instants");
    # A request costing more than the limit never fits, whatever D.
    is(dec(730, [$k, "$alg~3600000", 3, 1000, 4]), '0 | 0 0 1000 0 0 0', "$alg: cost above the limit");
}

######################################################################
# Sliding counter ("c"): limit 10 per 1000 ms, D 1000.  T0 is bucket 10000
# (index 16 mod 256), the next one 10001 (17).
{
    my $k = 'rl:delay:c';
    is(dec(0, [$k, 'c~1000', 10, 1000, 10]), '1 | 1 0 1100 0 0 0', 'c: fits now, full');
    # t=500: not in this bucket (cur 10 > 9); in the next one, whose previous count
    # is 10, once 10 * (1000 - e) / 1000 <= 9: e = 100, t = 1100, wait 600.
    # Remaining 0; read in full until t=1000, then 1 + 10*(1000-e)/1000 <= 9 at e=200.
    is(dec(500, [$k, 'c~1000', 10, 1000]), '2 | 1 0 700 1 600 10001', 'c: delayed to the next bucket');
    is(counter_value($k), '17:1:10', 'c: the next bucket, its previous count 10');
    pttl_in($k, 2400, 2500, 'c: until the end of the bucket after it');
    # t=600: the key is a bucket ahead: from its start (400 ms on), 1 + 10*(1000-e)/1000
    # + 1 <= 10 at e = 200: t = 1200, in the same bucket.
    is(dec(600, [$k, 'c~1000', 10, 1000]), '2 | 1 0 700 1 600 10001', 'c: queued behind, t=1200');
    is(counter_value($k), '17:2:10', 'c: counted in that bucket');
    my $before = snapshot($k);
    # t=610: from the bucket's start (390 ms), 2 + 10*(1000-e)/1000 + 1 <= 10 at e = 300: 690 > 500.
    # A zone with a delay field answers as a reserve zone: its reset counts from now.
    is(dec(610, [$k, 'c~500', 10, 1000]), '0 | 0 0 690 0 0 0', 'c: beyond D: rejected');
    is(snapshot($k), $before, 'c: ... writing nothing');
    # A fit only two buckets on (cost = limit: at the end of the next one) cannot be placed.
    is(dec(620, [$k, 'c~3600000', 10, 1000, 10]), '0 | 0 0 2380 0 0 0', 'c: two buckets on: rejected');
    is(snapshot($k), $before, 'c: ... writing nothing');
}

######################################################################
# GCRA ("g"): 10 per 1000 ms, burst 1, D 5000: limit_req's leaky bucket with a
# delay.  20 requests at t=0 wait 0, 100, ..., 1900.
{
    my $k = 'rl:delay:g';
    is(dec(0, [$k, 'g~5000', 10, 1000, 1, 1]), '1 | 1 0 100 0 0 0', 'g: the first at once');
    for my $n (1 .. 19) {
        my $tat = ($n + 1) * 100;
        is(dec(0, [$k, 'g~5000', 10, 1000, 1, 1]), "2 | 1 0 $tat 1 " . ($n * 100) . ' ' . gtok($tat, 10),
            "g: request $n waits " . ($n * 100));
    }
    is(gcra_value($k, 10), ($T0 + 2000) . '+0/10', 'g: the TAT after 20');
    pttl_in($k, 1900, 2000, 'g: until the TAT');
    my $before = snapshot($k);
    is(dec(0, [$k, 'g~1500', 10, 1000, 1, 1]), '0 | 0 0 2000 0 0 0', 'g: beyond D: rejected');
    is(snapshot($k), $before, 'g: ... writing nothing');
    is(dec(0, [$k, 'g~5000', 10, 1000, 2, 1]), '0 | 0 0 1000 0 0 0', 'g: cost above burst never fits');

    # The give-back of the last one returns its place: the next takes it (1900 again).
    my $rid = $RID{$k};
    my $r = decide_raw([$k], $T0 + 10, "Gg$rid", 10, 1000, 1, gtok(2000, 10));
    is(raw($r), '1 1 0 1', 'g: give-back of the last delayed request');
    is(gcra_value($k, 10), ($T0 + 1900) . '+0/10', 'g: its place returned');
    is(dec(20, [$k, 'g~5000', 10, 1000, 1, 1]), '2 | 1 0 1980 1 1880 ' . gtok(2000, 10),
        'g: the next takes it: at t=1900');
    # A reset, then a new life: the give-back of the old one writes nothing.
    $rid = $RID{$k};
    redis_cmd('DEL', $k);
    is(dec(30, [$k, 'g~5000', 10, 1000, 1, 1]), '1 | 1 0 100 0 0 0', 'g: a new life, at once');
    is(dec(30, [$k, 'g~5000', 10, 1000, 1, 1]), '2 | 1 0 200 1 100 ' . gtok(230, 10), 'g: delayed in it');
    $before = snapshot($k);
    $r = decide_raw([$k], $T0 + 40, "Gg$rid", 10, 1000, 1, gtok(2000, 10));
    is(raw($r), '1 1 0 0', 'g: an old life\'s give-back: reset field 0');
    is(snapshot($k), $before, 'g: ... writing nothing');
}

######################################################################
# Calendar quota ("q"): 2 an hour (UTC), D 5000; t=0 is 1 s before the hour ends.
{
    my $k = 'rl:delay:q';
    my $hour = 3_600_000;
    my $end = (int($T0 / $hour) + 1) * $hour;    # the next hour
    my $t = $end - 1000 - $T0;
    is(dec($t, [$k, 'q~5000', 2, 14401]), '1 | 1 1 1000 0 0 0', 'q: fits now');
    is(dec($t, [$k, 'q~5000', 2, 14401]), '1 | 1 0 1000 0 0 0', 'q: fits now, full');
    # The next hour, 1000 ms on, empty: counted there.  No room now (a later period).
    is(dec($t, [$k, 'q~5000', 2, 14401]), "2 | 1 0 1000 1 1000 $end", 'q: delayed into the next hour');
    is(quota_value($k), "$end:1", 'q: counted in the next hour');
    is(dec($t + 1, [$k, 'q~5000', 2, 14401]), "2 | 1 0 999 1 999 $end", 'q: the next one too');
    is(quota_value($k), "$end:2", 'q: the next hour full');
    my $before = snapshot($k);
    is(dec($t + 2, [$k, 'q~5000', 2, 14401]), '0 | 0 0 998 0 0 0', 'q: no room then either: rejected');
    is(snapshot($k), $before, 'q: ... writing nothing');
    # The key-in-a-later-period rule, for a plain zone too: no room now, until it starts.
    is(verdict(decide($T0 + $t + 3, [$k, 'q', 5, 14401])), '0 | 0 0 997', 'q: a later period: no room now');
    is(verdict(decide($T0 + $t + 3, [$k, 'q', 5, 14401, 0])), '1 | 1 0 997', 'q: a read sees none left');
    is(snapshot($k), $before, 'q: ... writing nothing');
    # Once it has started: its own count.
    is(verdict(decide($end, [$k, 'q', 5, 14401])), '1 | 1 2 ' . $hour, 'q: in that period, its count');
    # Far from the period's end: beyond D.
    my $k2 = 'rl:delay:q2';
    is(dec($t - 10_000, [$k2, 'q~5000', 1, 14401]), '1 | 1 0 11000 0 0 0', 'q: fits now');
    is(dec($t - 10_000, [$k2, 'q~5000', 1, 14401]), '0 | 0 0 11000 0 0 0', 'q: 11 s > D: rejected');
    is(quota_value($k2), ($end - $hour) . ':1', 'q: nothing written');
}

######################################################################
# Several zones: T is the latest zone's, recorded in all or none.
{
    my ($g, $l) = ('rl:delay:mg', 'rl:delay:ml');
    my @z = ([$g, 'g~5000', 10, 1000, 1, 1], [$l, 'l~5000', 1, 1000]);
    is(dec(0, @z), '1 | 1 0 100 0 0 0 | 1 0 1000 0 0 0', 'zones: fits now');
    # g fits at 100, l at 1000: T = 1000 in both.
    is(dec(0, @z), '2 | 1 0 1100 1 1000 ' . gtok(1100, 10) . ' | 1 0 2000 1 1000 ' . m0(0),
        'zones: the latest zone\'s T');
    is(gcra_value($g, 10), ($T0 + 1100) . '+0/10', 'zones: g recorded at 1000');
    is(zscores($l), 'a@0,m@1000', 'zones: l recorded at 1000');
    # l now waits 2000 > its D 1500: none recorded, though g would fit in 1100.
    my $before = snapshot($g, $l);
    is(dec(100, [$g, 'g~5000', 10, 1000, 1, 1], [$l, 'l~1500', 1, 1000]),
        '0 | 0 0 1000 0 0 0 | 0 0 1900 0 0 0', 'zones: one beyond its D: rejected');
    is(snapshot($g, $l), $before, 'zones: ... none recorded');
    # A zone that is ok now is recorded at T too (the g zone above: its TAT is
    # max(TAT, T) + T_unit).
    my ($c, $l2) = ('rl:delay:mc', 'rl:delay:ml2');
    is(dec(0, [$c, 'c~5000', 10, 1000], [$l2, 'l~5000', 1, 1000]), '1 | 1 9 2000 0 0 0 | 1 0 1000 0 0 0',
        'zones: c and l at once');
    # c moves to the bucket of T: (10001, 1, 1 + 0 weighted), read in full (2) until
    # t=1000, then 1 + ceil(1 * (1000 - e) / 1000): 8 left, one more at t=2000.
    is(dec(300, [$c, 'c~5000', 10, 1000], [$l2, 'l~5000', 1, 1000]),
        '2 | 1 8 1700 1 700 10001 | 1 0 1700 1 700 ' . m0(300), 'zones: c ok now, recorded at T=1000');
    is(counter_value($c), '17:1:1', 'zones: c in the bucket of T');
}

######################################################################
# Give-back of a delayed sliding-log request; a reservation of l with a delay.
{
    my $k = 'rl:delay:gl';
    is(dec(0, [$k, 'l~5000', 1, 1000]), '1 | 1 0 1000 0 0 0', 'Gl: at once');
    is(dec(100, [$k, 'l~5000', 1, 1000]), '2 | 1 0 1900 1 900 ' . m0(100), 'Gl: delayed to 1000');
    my $r = decide_raw([$k], $T0 + 200, "Gl$RID{$k}", 1, 1000, 1, m0(100));
    is(raw($r), '1 1 0 1', 'Gl: given back');
    is(zscores($k), 'a@0', 'Gl: its entry gone');
    is(dec(300, [$k, 'l~5000', 1, 1000]), '2 | 1 0 1700 1 700 ' . m0(300), 'Gl: the next takes its place');
    # A reserve field with a delay: no grant on a delayed decision.
    is(dec(400, [$k, 'l+8:1000~5000', 1, 1000]), '2 | 1 0 2600 1 1600 ' . m0(400),
        'Gl: a reserve zone delayed: cost placed, nothing granted');
    is(dec(0, ['rl:delay:rz', 'l+8:1000~0', 20, 1000]), '1 | 1 15 1000 4 1000 ' . m0(0),
        'a reserve zone with ~0 admitted at once: its grant as ever');
}

######################################################################
# A zone of cost 0 in a delayed decision places nothing; a key that cannot have
# a ledger (a brace, no hash tag) is placed all the same, with rid 0.
{
    my ($g, $c) = ('rl:delay:zg', 'rl:delay:zc');
    is(dec(0, [$g, 'g~5000', 10, 1000, 1, 1], [$c, 'c~5000', 10, 1000, 0]),
        '1 | 1 0 100 0 0 0 | 1 10 0 0 0 0', 'cost 0: at once');
    is(dec(0, [$g, 'g~5000', 10, 1000, 1, 1], [$c, 'c~5000', 10, 1000, 0]),
        '2 | 1 0 200 1 100 ' . gtok(200, 10) . ' | 1 10 0 0 100 0', 'cost 0: delayed, nothing placed there');
    is(redis_cmd('EXISTS', $c), 0, 'cost 0: ... no key written');
    my $b = 'rl:delay:{brace';
    is(dec(0, [$b, 'g~5000', 10, 1000, 1, 1]), '1 | 1 0 100 0 0 0', 'no ledger: at once');
    my $r = decide_raw([$b], $T0, 'g~5000', 10, 1000, 1, 1);
    is(raw($r), '2 1 0 200 1 100 ' . gtok(200, 10) . ' 0', 'no ledger: delayed, rid 0');
    is(gcra_value($b, 10), ($T0 + 200) . '+0/10', 'no ledger: placed all the same');
}

######################################################################
# Bad arguments.
{
    my $bad = 'ERR:ERR ratelimit: bad arguments for zone';
    for my $f ('r~100', 'b~100', 'n~100', 'B~100', 'D~100', 'b+8:1000~100', 'g~3600001',
        'g~', 'g~-1', 'g~1.5', '~100', 'g~100~100') {
        my $r = decide_raw(['rl:delay:bad'], $T0, $f, 10, 1000, 1, 1);
        is(show($r, 'rl:delay:bad'), "$bad 1", "bad: $f");
    }
    is(dec(0, ['rl:delay:bad', 'g~3600000', 10, 1000, 1, 1]), '1 | 1 0 100 0 0 0', 'an hour is fine');
    redis_cmd('DEL', 'rl:delay:bad');
    is(dec(0, ['rl:delay:b1', 'g~100', 10, 1000, 1, 1], ['rl:delay:b2', 'g', 10, 1000, 1, 1]), "$bad 2",
        'a mix: the second zone without ~');
    is(dec(0, ['rl:delay:b1', 'g', 10, 1000, 1, 1], ['rl:delay:b2', 'g~100', 10, 1000, 1, 1]), "$bad 2",
        'a mix: the first zone without ~');
    is(dec(0, ['rl:delay:b1', 'g~100', 10, 1000, 1, 1], ['rl:delay:b2', 'g', 10, 1000, 1, 1],
        ['rl:delay:b3', 'g~100', 10, 1000, 1, 1]), "$bad 3", 'a mix: a zone without ~ between two with it');
    is(snapshot('rl:delay:b1', 'rl:delay:b2'), 'rl:delay:b1=none:(nil) ; rl:delay:b2=none:(nil)',
        'a mix writes nothing');
}

done_testing();

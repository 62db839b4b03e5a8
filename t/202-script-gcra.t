# The decision script's GCRA ("g"), run directly against a real redis-server
# with an injected clock (no nginx).  Expectations are literals worked out by
# hand from the definition:
#   T = window / limit (the spacing); TAT = stored value, or now
#   a request of cost c fits while max(TAT, now) + c*T - now <= burst*T,
#   and then TAT := max(TAT, now) + c*T  (stored with PX ceil(TAT - now))
#   remaining = floor(burst - (TAT - now) / T)
#   reset_ms  = rejected: ms until it fits; admitted: ms until one unit more
#   value     = the TAT exactly, as whole ms plus a remainder r in 1/limit ms
#               (TAT = ms + r/limit, 0 <= r < limit): struct.pack('<dI4', ms, r),
#               12 bytes, read back by gcra_value() as "<ms>+<r>/<limit>"
# Each table runs at a small clock and at a realistic epoch clock (1.7e12 ms).
use lib 't/lib';
use RLTest;
use RLTest::Script qw(:all);
use POSIX qw(ceil);

# The ideal schedule of a saturating client (T >= 1 ms, burst >= 2): `burst`
# at t=0, then the m-th more exactly at t = ceil(m*W/L), never 1 ms earlier
# (and then reset_ms is 1).  Returns the number of decisions that differ.
sub schedule_mismatches {
    my ($key, $L, $W, $B, $T0, $M) = @_;
    my @z = ([$key, 'g', $L, $W, 1, $B]);
    my $bad = 0;
    for (1 .. $B) { $bad++ unless decide($T0, @z)->{allowed} }
    for my $m (1 .. $M) {
        my $t = ceil($m * $W / $L);    # integers: exact in Perl for these sizes
        $t = int($m * $W / $L) if ($m * $W) % $L == 0;
        my $early = decide($T0 + $t - 1, @z);
        $bad++ if $early->{allowed} || $early->{zones}[0]{reset} != 1;
        $bad++ unless decide($T0 + $t, @z)->{allowed};
    }
    return $bad;
}

for my $T0 (10_000_000, 1_700_000_000_000) {
    my $tag = "T0=$T0";

    # limit 10 per 1000 ms (T = 100), burst 1: one at a time, 100 ms apart.
    my $k1 = "rl:gcra:b1$T0";
    my @g1 = ([$k1, 'g', 10, 1000, 1, 1]);
    steps("$tag burst 1", $T0, \@g1, [0, '1 | 1 0 100']);
    is(gcra_value($k1, 10), ($T0 + 100) . '+0/10', "$tag: the stored TAT");
    is(length(redis_cmd('GET', $k1)), 12, "$tag: the value is 12 bytes");
    my $pttl = redis_cmd('PTTL', $k1);
    ok($pttl <= 100 && $pttl > 0, "$tag TTL: PTTL $pttl <= TAT - now = 100");
    steps("$tag burst 1", $T0, \@g1,
        [0,   '0 | 0 0 100'],
        [50,  '0 | 0 0 50'],
        [99,  '0 | 0 0 1'],
    );
    is(gcra_value($k1, 10), ($T0 + 100) . '+0/10', "$tag: denials stored nothing");
    steps("$tag burst 1", $T0, \@g1,
        [100,  '1 | 1 0 100'],
        [250,  '1 | 1 0 100'],    # idle since 200: the TAT restarts from now
        [349,  '0 | 0 0 1'],
        [1000, '1 | 1 0 100'],
        [1050, { cost => 0 }, '1 | 1 0 50'],  # a read: full again in 50 ms
        [1100, { cost => 0 }, '1 | 1 1 0'],
    );
    is(gcra_value($k1, 10), ($T0 + 1100) . '+0/10', "$tag: reads stored nothing");

    # burst 5: five at once, then one per 100 ms.
    my $k5 = "rl:gcra:b5$T0";
    my @g5 = ([$k5, 'g', 10, 1000, 1, 5]);
    steps("$tag burst 5", $T0, \@g5,
        [0,   '1 | 1 4 100'],
        [0,   '1 | 1 3 100'],
        [0,   '1 | 1 2 100'],
        [0,   '1 | 1 1 100'],
        [0,   '1 | 1 0 100'],
        [0,   '0 | 0 0 100'],
        [30,  '0 | 0 0 70'],
        [100, '1 | 1 0 100'],
        [450, '1 | 1 2 50'],                 # TAT 700: 2.5 spacings free
        [450, { cost => 3 }, '0 | 0 2 50'],  # needs TAT <= 650
        [450, { cost => 2 }, '1 | 1 0 50'],
    );
    is(gcra_value($k5, 10), ($T0 + 900) . '+0/10', "$tag burst 5: TAT after cost 2");
    steps("$tag burst 5", $T0, \@g5,
        [2000, { cost => 5 }, '1 | 1 0 100'],   # idle: the whole burst at once
        [2000, { cost => 0 }, '1 | 1 0 100'],
    );
    is(gcra_value($k5, 10), ($T0 + 2500) . '+0/10', "$tag burst 5: TAT after cost 5");
    $pttl = redis_cmd('PTTL', $k5);
    ok($pttl <= 500 && $pttl > 400, "$tag TTL: PTTL $pttl <= TAT - now = 500");

    # Denials store nothing and leave the TTL alone.
    redis_cmd('PEXPIRE', $k5, 30000);
    my $before = snapshot($k5);
    steps("$tag burst 5 deny", $T0, \@g5, [2050, { cost => 2 }, '0 | 0 0 150']);
    is(snapshot($k5), $before, "$tag: a denial changes nothing");
    $pttl = redis_cmd('PTTL', $k5);
    ok($pttl <= 30000 && $pttl > 29000, "$tag: a denial does not touch the TTL ($pttl)");

    steps("$tag empty", $T0, [["rl:gcra:none$T0", 'g', 10, 1000, 1, 5]],
        [0, { cost => 0 }, '1 | 1 5 0']);
    is(redis_cmd('EXISTS', "rl:gcra:none$T0"), 0, "$tag: a read creates no key");

    # Fractional spacing: limit 3 per 1000 ms (T = 333.33), burst 3.
    my $f = "rl:gcra:f3$T0";
    my @f3 = ([$f, 'g', 3, 1000, 1, 3]);
    steps("$tag 3/1000", $T0, \@f3,
        [0,    '1 | 1 2 334'],
        [0,    '1 | 1 1 334'],
        [0,    '1 | 1 0 334'],
        [0,    '0 | 0 0 334'],
    );
    is(gcra_value($f, 3), ($T0 + 1000) . '+0/3', "$tag 3/1000: TAT 3 spacings ahead, exactly");
    steps("$tag 3/1000", $T0, \@f3,
        [333,  '0 | 0 0 1'],
        [334,  '1 | 1 0 333'],
    );
    is(gcra_value($f, 3), ($T0 + 1333) . '+1/3', "$tag 3/1000: TAT 1333 + 1/3 ms");
    $pttl = redis_cmd('PTTL', $f);
    ok($pttl <= 1000 && $pttl > 900, "$tag 3/1000 TTL: PTTL $pttl <= ceil(1333.33 - 334) = 1000");
    steps("$tag 3/1000", $T0, \@f3,
        [666,  '0 | 0 0 1'],
        [667,  '1 | 1 0 333'],
        [999,  '0 | 0 0 1'],
        [1000, '1 | 1 0 334'],   # exactly 3 spacings after t=0
    );
    is(gcra_value($f, 3), ($T0 + 2000) . '+0/3', "$tag 3/1000: TAT 2000, no remainder left over");

    # No drift over thousands of requests: the m-th admission after the burst
    # comes exactly at ceil(m*W/L), for several fractional spacings, and the
    # stored TAT is exactly T0 + (3000 + burst)*W/L: whole ms plus the
    # remainder ((3000 + burst)*W mod L)/L.  (When the TAT was a double, every
    # TAT + T rounded, to 2^-29 ms at 1e7 and 2^-12 ms at 1.7e12, and the error
    # accumulated while the client kept the key saturated.)
    for my $c ([3, 1000, 3], [3, 1000, 2], [7, 1000, 2], [6, 1000, 2], [3, 1001, 5]) {
        my ($L, $W, $B) = @$c;
        my $k = "rl:gcra:sched:$L:$W:$B:$T0";
        is(schedule_mismatches($k, $L, $W, $B, $T0, 3000), 0,
            "$tag $L per $W ms, burst $B: 3000 admissions at exactly ceil(m*$W/$L), each 1 ms earlier denied");
        my $units = (3000 + $B) * $W;    # the TAT after them, in 1/L ms past T0
        my $want = ($T0 + int($units / $L)) . '+' . ($units % $L) . "/$L";
        is(gcra_value($k, $L), $want,
            "$tag $L per $W ms, burst $B: TAT after 3000 is exactly T0 + " . sprintf('%.4f', $units / $L));
    }

    # The simplest case: an empty key, limit 7 per 1000 ms, burst 1.  (With
    # the TAT a double, at the epoch now + T rounded to the ulp of now
    # (2^-12 ms), (now + T) - now > T + EPS, and every request was denied,
    # forever, with reset_ms 1.)
    is(verdict(decide($T0 + 5, ["rl:gcra:f7$T0", 'g', 7, 1000, 1, 1])), '1 | 1 0 143',
        "$tag 7/1000 burst 1: the first request on an empty key is admitted");
    is(gcra_value("rl:gcra:f7$T0", 7), ($T0 + 5 + 142) . '+6/7', "$tag 7/1000 burst 1: TAT now + 142 + 6/7");
    is(verdict(decide($T0 + 147, ["rl:gcra:f7$T0", 'g', 7, 1000, 1, 1])), '0 | 0 0 1',
        "$tag 7/1000 burst 1: 1 ms before the TAT (142.86 ms later): denied");
    is(verdict(decide($T0 + 148, ["rl:gcra:f7$T0", 'g', 7, 1000, 1, 1])), '1 | 1 0 143',
        "$tag 7/1000 burst 1: at ceil(TAT) (the TAT has passed): admitted");
    is(gcra_value("rl:gcra:f7$T0", 7), ($T0 + 148 + 142) . '+6/7',
        "$tag 7/1000 burst 1: the TAT had passed: now + 142 + 6/7 again");
    is(verdict(decide($T0 + 5, ["rl:gcra:f6$T0", 'g', 6, 1000, 1, 2])), '1 | 1 1 167',
        "$tag 6/1000 burst 2: the first request on an empty key");
    is(verdict(decide($T0 + 5, ["rl:gcra:f6$T0", 'g', 6, 1000, 1, 2])), '1 | 1 0 167',
        "$tag 6/1000 burst 2: the second at the same ms (the burst)");
    is(gcra_value("rl:gcra:f6$T0", 6), ($T0 + 5 + 333) . '+2/6', "$tag 6/1000 burst 2: TAT now + 333 + 2/6");

    # Cost larger than the burst never fits.  sliding_log (key with entries)
    # and sliding_counter then answer reset_ms = window; GCRA answers (c-burst)*T.
    my $hk = "rl:gcra:huge$T0";
    my $d = decide($T0, [$hk, 'g', 10, 1000, 6, 5]);
    is($d->{allowed}, 0, "$tag: cost 6 > burst 5 is denied");
    is(redis_cmd('EXISTS', $hk), 0, "$tag: and records nothing");
    is(verdict($d), '0 | 0 5 1000', "$tag: cost > burst: reset_ms = window, as the other algorithms");
}

# A limit that changes between requests (limit= from a variable): the stored
# remainder r is in 1/limit ms of the old limit, 0 <= r < old limit, so the
# TAT it stands for is less than 1 ms past the stored whole ms.  Read with a
# lower limit, it must move the TAT by at most 1 ms (rounding up is safe).
# Here: limit 999 per 1000 ms, burst 999, cost 998 at t=0: TAT = 998*1000/999
# = 998.999 ms, stored as 998 + 998/999.  Then limit 1 per 1000 ms, burst 2
# (T = 1000): new TAT 1998.999 <= 2 spacings, admitted, remaining 0, and one
# more is back when the TAT is within 1 spacing: ceil(998.999) = 999.  The
# script reads r = 998 as 998/1 ms (TAT 1996), so it denies, reset_ms 996;
# with a TAT far ahead (a saturated key) the extra (old limit - 1)/new limit
# ms is stored by the next admission: 1,000,000 -> 10 per hour adds ~1 minute.
{
    my $T = 10_000_000;
    my $k = 'rl:gcra:lowered';
    is(verdict(decide($T, [$k, 'g', 999, 1000, 998, 999])), '1 | 1 1 2', 'limit lowered: 998 of 999 at once');
    is(gcra_value($k, 999), ($T + 998) . '+998/999', 'limit lowered: TAT 998 + 998/999');
    is(verdict(decide($T, [$k, 'g', 1, 1000, 1, 2])), '1 | 1 0 999',
        'limit lowered to 1 per 1000 ms, burst 2: the old TAT counts as 999 ms (rounded up), not 1996');
}

# clock "": Redis TIME.
{
    my $k = 'rl:gcra:redisclock';
    my $t = redis_cmd('TIME');
    my $before = $t->[0] * 1000 + int($t->[1] / 1000);
    is(verdict(decide('', [$k, 'g', 10, 1000, 1, 1])), '1 | 1 0 100', 'clock "": admitted');
    my $after = do { my $t = redis_cmd('TIME'); $t->[0] * 1000 + int($t->[1] / 1000) };
    my ($ms, $r) = (gcra_value($k, 10) // '') =~ /^(\d+)\+(\d+)\/10$/;
    ok(defined $ms && $r == 0 && $ms >= $before + 100 && $ms <= $after + 100,
        "clock \"\": TAT " . (gcra_value($k, 10) // 'undef') . " is Redis TIME + 100 ($before..$after + 100), r 0");
    is(decide('', [$k, 'g', 10, 1000, 1, 1])->{allowed}, 0, 'clock "": the next one is denied');
    is(verdict(decide('', ['rl:gcra:redisclock7', 'g', 7, 1000, 1, 1])), '1 | 1 0 143',
        'clock "": 7 per 1000 ms, burst 1: the first request on an empty key is admitted');
    $after = do { my $t = redis_cmd('TIME'); $t->[0] * 1000 + int($t->[1] / 1000) };
    ($ms, $r) = (gcra_value('rl:gcra:redisclock7', 7) // '') =~ /^(\d+)\+(\d+)\/7$/;
    ok(defined $ms && $r == 6 && $ms >= $before + 142 && $ms <= $after + 142,
        'clock "": 7 per 1000 ms: TAT ' . (gcra_value('rl:gcra:redisclock7', 7) // 'undef')
        . ' is Redis TIME + 142 + 6/7');
}

done_testing();

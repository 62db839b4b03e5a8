# The decision script's calendar quota ("q") and credit balance ("b"), run
# directly against a real redis-server with an injected clock (no nginx).
#   q: window = (UTC offset in minutes + 1440) * 10 + kind (1 hour, 2 day,
#      3 week from Monday, 4 month); the count of the period holding `now`,
#      stored as struct.pack('<I6I4', period start in UTC ms, count), 10 bytes;
#      reset = ms to the period's end, always.
#   b: the key is a decimal integer (SET / INCRBY by the operator); burst = the
#      balance a missing key starts with; reset = 0.
# Period boundaries are worked out independently with Time::Local::timegm.
use lib 't/lib';
use RLTest;
use RLTest::Script qw(:all);
use Time::Local qw(timegm);

my $H = 3_600_000;
my $D = 24 * $H;
sub ms { my ($y, $mo, $d, $h, $mi) = @_; 1000 * timegm(0, $mi // 0, $h // 0, $d, $mo - 1, $y) }
sub spec { my ($kind, $off_min) = @_; ($off_min // 0) * 10 + 14400 + $kind }
sub quota_value {
    my $v = redis_cmd('GET', $_[0]);
    return $v unless defined $v && length $v == 10;
    my ($lo, $hi, $c) = unpack('V v V', $v);
    return ($hi * 2**32 + $lo) . ":$c";
}

# Months: [year, month, days] around every kind of February and both lengths.
my @months = ([2024, 1, 31], [2024, 2, 29], [2023, 2, 28], [2100, 2, 28], [2000, 2, 29],
    [2024, 4, 30], [2024, 12, 31], [1999, 12, 31], [2026, 11, 30]);
for my $m (@months) {
    my ($y, $mo, $days) = @$m;
    my $start = ms($y, $mo, 1);
    my $end = $mo == 12 ? ms($y + 1, 1, 1) : ms($y, $mo + 1, 1);
    is($end - $start, $days * $D, "$y-$mo has $days days (timegm)");
    my $next_end = $mo == 12 ? ms($y + 1, 2, 1) : $mo == 11 ? ms($y + 1, 1, 1) : ms($y, $mo + 2, 1);
    my $next_len = $next_end - $end;
    my $k = "rl:month:$y-$mo";
    my @z = ([$k, 'q', 3, spec(4)]);
    steps("$y-$mo", $start, \@z,
        [0,              "1 | 1 2 " . ($days * $D)],
        [$days * $D / 2, { cost => 2 }, "1 | 1 0 " . ($days * $D / 2)],
        [$days * $D - 1, "0 | 0 0 1"],                # the period's last millisecond
        [$days * $D - 1, { cost => 0 }, "1 | 1 0 1"],
        [$days * $D,     "1 | 1 2 $next_len"],
    );
    is(quota_value($k), "$end:1", "$y-$mo: the next period's count, keyed by its start");
    my $pttl = redis_cmd('PTTL', $k);
    ok($pttl > $next_len - 60_000 && $pttl <= $next_len, "$y-$mo: expires at the next period's end ($pttl)");
}

# Hour, day, week (weeks start on Monday: 2024-01-01 was a Monday).
{
    my $t = ms(2024, 1, 3, 17, 25);    # a Wednesday
    my @h = (["rl:h", 'q', 2, spec(1)]);
    steps('hour', $t, \@h,
        [0,          '1 | 1 1 ' . (35 * 60_000)],
        [35 * 60_000 - 1, '1 | 1 0 1'],
        [35 * 60_000 - 1, '0 | 0 0 1'],
        [35 * 60_000, '1 | 1 1 ' . $H],
    );
    my @d = (["rl:d", 'q', 1, spec(2)]);
    steps('day', $t, \@d,
        [0, '1 | 1 0 ' . (ms(2024, 1, 4) - $t)],
        [ms(2024, 1, 4) - $t - 1, '0 | 0 0 1'],
        [ms(2024, 1, 4) - $t, '1 | 1 0 ' . $D],
    );
    my @w = (["rl:w", 'q', 1, spec(3)]);
    steps('week', $t, \@w,
        [0, '1 | 1 0 ' . (ms(2024, 1, 8) - $t)],                # to Monday the 8th
        [ms(2024, 1, 8) - $t - 1, '0 | 0 0 1'],
        [ms(2024, 1, 8) - $t, '1 | 1 0 ' . 7 * $D],
    );
    # A Monday before 1970's first Monday and a Sunday: weeks of the epoch's Thursday.
    steps('week Sunday', ms(2024, 1, 7, 23, 59), [["rl:w2", 'q', 1, spec(3)]],
        [0, '1 | 1 0 60000']);
    steps('week Monday 00:00', ms(2024, 1, 8), [["rl:w3", 'q', 1, spec(3)]],
        [0, '1 | 1 0 ' . 7 * $D]);
}

# Fixed UTC offsets: a month in UTC+02:00 starts at 22:00 UTC the day before,
# in UTC-05:30 at 05:30 UTC on the 1st.
{
    my $plus = ms(2024, 2, 29, 22, 0);    # 2024-03-01 00:00 at +02:00
    my @p = (["rl:m+2", 'q', 1, spec(4, 120)]);
    steps('month +02:00', $plus, \@p,
        [-1, '1 | 1 0 1'],                        # the last ms of February there
        [-1, '0 | 0 0 1'],
        [0,  '1 | 1 0 ' . 31 * $D],               # March has 31 days
    );
    my $minus = ms(2024, 3, 1, 5, 30);
    my @n = (["rl:m-530", 'q', 1, spec(4, -330)]);
    steps('month -05:30', $minus, \@n,
        [-1, '1 | 1 0 1'],
        [0,  '1 | 1 0 ' . 31 * $D],
    );
    my @dd = (["rl:d+1", 'q', 1, spec(2, 60)]);
    steps('day +01:00', ms(2024, 6, 1, 23, 0), \@dd,
        [-1, '1 | 1 0 1'], [0, '1 | 1 0 ' . $D]);
}

# Exact limits, cost, all-or-nothing with a rate zone, and a gateway clock that
# is already in the next period (its count is kept, never overwritten, and a clock still in
# the earlier period finds no room there).
{
    my $t = ms(2025, 5, 31, 23, 59);
    my $left = 60_000;
    my @z = (["rl:q:x", 'q', 5, spec(4)], ["rl:q:rate", 'g', 10, 1000, 1, 2]);
    steps('with gcra', $t, \@z,
        [0, { costs => [3, 1] }, "1 | 1 2 $left | 1 1 100"],
        [0, { costs => [3, 1] }, "0 | 0 2 $left | 1 1 100"],   # the quota has 2 left
        [0, { costs => [1, 2] }, "0 | 1 2 $left | 0 1 100"],   # the rate says no: nothing taken
        [0, { costs => [2, 1] }, "1 | 1 0 $left | 1 0 100"],
    );
    my $june = ms(2025, 6, 1);
    my @q = (["rl:q:skew", 'q', 5, spec(4)]);
    steps('skew', $t, \@q, [$left + 10, '1 | 1 4 ' . (30 * $D - 10)]);    # a clock in June
    # One still in May: no room until June starts (counting May's requests in June's count
    # would admit them against June's limit), nothing written; a read is ok and sees none left.
    steps('skew', $t, \@q, [$left - 10, '0 | 0 0 10'], [$left - 10, { cost => 0 }, '1 | 1 0 10']);
    is(quota_value('rl:q:skew'), "$june:1", 'a clock behind takes nothing from the newer period');
    steps('too much', $t, [["rl:q:big", 'q', 5, spec(4)]], [0, { cost => 6 }, "0 | 0 5 $left"]);
    is(redis_cmd('EXISTS', 'rl:q:big'), 0, 'a denial stores nothing');
    for my $bad (14400, 14405, 9, 28804) {
        is(verdict(decide($t, ["rl:q:bad", 'q', 5, $bad])), 'ERR:ERR ratelimit: bad arguments for zone 1',
            "period spec $bad is refused");
    }
}

# Balances.
{
    my $t = 1_700_000_000_000;
    my $k = 'rl:credits:a';
    steps('missing, no grant', $t, [[$k, 'b', 100, 1, 1, 0]], [0, '0 | 0 0 0']);
    is(redis_cmd('EXISTS', $k), 0, 'a missing balance with no grant: nothing written');
    redis_cmd('SET', $k, 5);
    steps('balance 5', $t, [[$k, 'b', 100, 1]],
        [0, { cost => 2 }, '1 | 1 3 0'],
        [0, { cost => 4 }, '0 | 0 3 0'],    # would go below zero: nothing drawn
        [0, { cost => 0 }, '1 | 1 3 0'],
        [0, { cost => 3 }, '1 | 1 0 0'],
        [0, '0 | 0 0 0'],
    );
    is(redis_cmd('GET', $k), '0', 'drawn to exactly 0');
    redis_cmd('INCRBY', $k, 10);
    redis_cmd('PEXPIRE', $k, 600_000);
    steps('topped up', $t, [[$k, 'b', 100, 1]], [0, { cost => 4 }, '1 | 1 6 0']);
    ok(redis_cmd('PTTL', $k) > 0, "drawing keeps the operator's TTL");
    my $g = 'rl:credits:g';
    steps('default grant 50', $t, [[$g, 'b', 50, 1, 1, 50]],
        [0, { cost => 0 }, '1 | 1 50 0'],
        [0, { cost => 51 }, '0 | 0 50 0'],
    );
    is(redis_cmd('EXISTS', $g), 0, 'a read or a denial does not write the grant');
    steps('default grant 50', $t, [[$g, 'b', 50, 1, 1, 50]], [0, { cost => 20 }, '1 | 1 30 0']);
    is(redis_cmd('GET', $g), '30', 'the grant, less the cost, written on first use');
    is(redis_cmd('PTTL', $g), -1, 'a granted balance does not expire');
    redis_cmd('SET', $k, -3);
    steps('negative', $t, [[$k, 'b', 100, 1]], [0, '0 | 0 0 0']);
    # All-or-nothing with a quota.
    redis_cmd('SET', $k, 1);
    my @both = (["rl:q:c", 'q', 10, spec(2)], [$k, 'b', 100, 1]);
    steps('with a quota', ms(2024, 1, 1, 12), \@both,
        [0, { costs => [1, 2] }, '0 | 1 10 ' . 12 * $H . ' | 0 1 0'],
        [0, { costs => [1, 1] }, '1 | 1 9 ' . 12 * $H . ' | 1 0 0'],
    );
    for my $v ('abc', '1.5', '', "\x00" x 9) {
        redis_cmd('SET', $k, $v);
        is(verdict(decide($t, [$k, 'b', 100, 1])), "ERR:WRONGTYPE ratelimit: $k holds other data",
            "a balance of " . show($v) . ' is not ours');
    }
    redis_cmd('DEL', $k);
    redis_cmd('RPUSH', $k, 1);
    like(verdict(decide($t, [$k, 'b', 100, 1])), qr/^ERR:WRONGTYPE/, 'a list under a balance key');
    is(verdict(decide($t, [$k, 'b', 100, 1, 1, -1])), 'ERR:ERR ratelimit: bad arguments for zone 1',
        'a negative grant is refused');
}
# Balance admin ("B"): window 1 sets, 2 adds; a decision of its own.
{
    my $k = 'rl:credits:admin';
    is(verdict(decide(1, [$k, 'B', 1, 2, 5])), '1 | 1 5 0', 'add to a missing balance');
    is(verdict(decide(1, [$k, 'B', 1, 2, 7])), '1 | 1 12 0', 'add');
    redis_cmd('PEXPIRE', $k, 600_000);
    is(verdict(decide(1, [$k, 'B', 1, 1, 3])), '1 | 1 3 0', 'set');
    is(redis_cmd('GET', $k), '3', 'the balance set');
    ok(redis_cmd('PTTL', $k) > 0, 'setting keeps the TTL');
    is(verdict(decide(1, [$k, 'B', 1, 1, 0])), '1 | 1 0 0', 'set to 0');
    is(verdict(decide(1, [$k, 'B', 1, 3, 1])), 'ERR:ERR ratelimit: bad arguments for zone 1',
        'an unknown mode');
    redis_cmd('SET', $k, 'x');
    is(verdict(decide(1, [$k, 'B', 1, 2, 1])), "ERR:WRONGTYPE ratelimit: $k holds other data",
        'not a balance');
}
sub show { my $v = shift; $v =~ /\A[\x20-\x7e]*\z/ ? "\"$v\"" : 'binary' }

done_testing();

# Every algorithm at the documented maxima: limit 10^9, a window of one year
# (31,536,000,000 ms), costs near the limit.  limit * window and cost * window
# are about 3e19 there, past 2^53, where doubles are no longer exact; the script
# must still answer exactly.  Expectations were worked out with exact rationals
# from each algorithm's definition (see t/200..202):
#   gcra: TAT' = max(TAT, now) + cost * window / limit, admitted while
#         (TAT' - now) * limit <= burst * window
#   sliding_counter: admitted while prev * (window - elapsed) + (cur + cost) * window
#         <= limit * window
use lib 't/lib';
use RLTest;
use RLTest::Script qw(:all);

my ($L, $W) = (1_000_000_000, 31_536_000_000);

{
    my $T0 = 1_734_000_000_000;
    my @g = (['rl:max:gcra', 'g', $L, $W, 1, $L]);
    steps('gcra at the maxima', $T0, \@g, [0, { cost => 999_999_999 }, '1 | 1 1 32']);
    # cost * window = 31535999968464000000: as a double its last digits are lost (the old
    # script stored r = 463998976).
    is(gcra_value('rl:max:gcra', $L), '1765535999968+464000000/1000000000',
        'gcra at the maxima: TAT = now + cost * window / limit exactly');
    steps('gcra at the maxima', $T0, \@g,
        [0, { cost => 2 }, '0 | 0 1 32'],
        [0, { cost => 1 }, '1 | 1 0 32'],
        [1, { cost => 1 }, '0 | 0 0 31'],
        [40, { cost => 1 }, '1 | 1 0 24'],
        [$W / 2, { cost => 1 }, '1 | 1 499999998 32'],
    );
    is(gcra_value('rl:max:gcra', $L), '1765536000063+72000000/1000000000',
        'gcra at the maxima: the TAT exactly, to 1/limit ms');
    my $pttl = redis_cmd('PTTL', 'rl:max:gcra');
    ok($pttl > 31536000063 - $W / 2 - 60_000 && $pttl <= 31536000064 - $W / 2,
        "gcra at the maxima: the key lives until the TAT ($pttl ms)");
}

{
    my $start = 1_734_480_000_000;    # 55 windows of a year since the epoch
    my @c = (['rl:max:counter', 'c', $L, $W]);
    steps('sliding_counter at the maxima', $start, \@c,
        [0, { cost => 999_999_999 }, '1 | 1 1 31536000032'],
        [0, { cost => 2 }, '0 | 0 1 31536000032'],
        [0, { cost => 1 }, '1 | 1 0 31536000032'],
        [$W - 1, { cost => 1 }, '0 | 0 0 33'],
        [$W, { cost => 1 }, '0 | 0 0 32'],
        [$W + 1, { cost => 1 }, '0 | 0 0 31'],
        [$W + $W / 3, { cost => 5 }, '1 | 1 333333328 22'],
        [$W + $W / 3 + 1, { cost => 0 }, '1 | 1 333333328 21'],
    );
    is(counter_value('rl:max:counter'), '56:5:1000000000',
        'sliding_counter at the maxima: window 56, 5 now, 10^9 before');

    # At the edge: 999,999,997 in the previous window, weighted at 5,458,666,667 ms into this
    # one to 826,906,812 + 1/31,536,000,000: a cost of 173,093,188 - 1 is over by that
    # 1/31,536,000,000 of a unit (the old script, in doubles, admitted it), one less fits.
    my $s2 = 1_829_088_000_000;
    my $el = $W + 5_458_666_667;
    my @e = (['rl:max:edge', 'c', $L, $W]);
    steps('sliding_counter at the edge', $s2, \@e,
        [0, { cost => 999_999_997 }, '1 | 1 3 31536000032'],
        [$el, { cost => 173_093_187 }, '0 | 0 173093186 1'],
        [$el, { cost => 173_093_186 }, '1 | 1 0 1'],
        [$el, { cost => 0 }, '1 | 1 0 1'],
    );
    is(counter_value('rl:max:edge'), '59:173093186:999999997', 'sliding_counter at the edge: state');
}

{
    # The log has no products to overflow; at the maxima it still answers in whole ms.
    my $T0 = 1_734_000_000_000;
    my @l = (['rl:max:log', 'l', $L, $W]);
    steps('sliding_log at the maxima', $T0, \@l,
        [0, { cost => 5 }, '1 | 1 999999995 31536000000'],
        [0, { cost => $L + 1 }, '0 | 0 999999995 31536000000'],
        [1, { cost => 0 }, '1 | 1 999999995 31535999999'],
        [$W - 1, { cost => 1 }, '1 | 1 999999994 1'],
        [$W, { cost => 1 }, '1 | 1 999999998 31535999999'],   # the 5 of t=0 left
    );
}

done_testing();

# The decision script's sliding_log algorithm ("l"), run directly against a
# real redis-server with an injected clock (no nginx).  Every expectation is a
# literal worked out by hand from the definition: an entry scored s counts
# while now < s + window; a request of cost c fits while used + c <= limit;
# reset_ms is when the oldest entry that has to leave leaves.
#
# Each table runs twice: at a small clock and at a realistic epoch clock
# (1.7e12 ms), where members are 16-digit integers.
use lib 't/lib';
use RLTest;
use RLTest::Script qw(:all);

my @parts = RLTest::Script::script_parts();
is_deeply(\@parts, ['lua/decide.lua'], 'SCRIPT is concat! of lua/decide.lua')
    or diag(explain \@parts);
is(load_script(), script_sha(), 'SCRIPT LOAD answers the SHA-1 of the assembled text');
{
    # EVAL of the text and EVALSHA agree (the module's NOSCRIPT fallback sends EVAL).
    my $a = redis_cmd('EVAL', script_text(), 1, 'rl:t:eval', 5000, 'l', 3, 1000, 1, 0);
    my $b = decide(5000, ['rl:t:evalsha', 'l', 3, 1000]);
    is(RLTest::Redis::format_reply($a), '1 1 2 1000', 'EVAL of the assembled text');
    is(verdict($b), '1 | 1 2 1000', 'EVALSHA of the same text');
}

for my $T0 (10_000_000, 1_700_000_000_000) {
    my $tag = "T0=$T0";
    my $key = "rl:log:a$T0";
    my @z = ([$key, 'l', 3, 1000]);

    # limit 3, window 1000: exactly 3 admitted, the next denied until the
    # oldest leaves (t = s + window), with Retry-After exact to the ms.
    steps("$tag limit", $T0, \@z,
        [0,    '1 | 1 2 1000'],
        [100,  '1 | 1 1 900'],
        [200,  '1 | 1 0 800'],
        [300,  '0 | 0 0 700'],
        [999,  '0 | 0 0 1'],      # window - 1 after the oldest: still inside
    );
    is(redis_cmd('ZCARD', $key), 3, "$tag: denied requests are not recorded");
    steps("$tag boundary", $T0, \@z,
        [1000, '1 | 1 0 100'],    # now = s + window: the entry at 0 has left
        [1099, '0 | 0 0 1'],
        [1100, '1 | 1 0 100'],
        [1199, '0 | 0 0 1'],
        [1200, '1 | 1 0 800'],
    );
    # Gateway clock: member = now * 1000 + (entries in the window) % 1000, score = now.
    is_deeply(redis_cmd('ZRANGE', $key, 0, -1, 'WITHSCORES'),
        [($T0 + 1000) * 1000 + 2, $T0 + 1000, ($T0 + 1100) * 1000 + 2, $T0 + 1100,
         ($T0 + 1200) * 1000 + 2, $T0 + 1200],
        "$tag: members are now*1000 + used%1000 (integers), scores the ms");

    # A client hammering past its limit: every try denied, the set never grows,
    # and it is admitted at the first ms its oldest entry has left.
    {
        my ($admitted, $max_card, $bad_retry) = (0, 0, 0);
        # The key's TTL (the window, 1 s) runs on Redis's real clock, and 799 round trips on a
        # loaded machine took longer: the key expired mid-loop and a request was admitted.
        # Rejections write nothing, so without a TTL the set is exactly what they see.
        redis_cmd('PERSIST', $key);
        for my $dt (1201 .. 1999) {
            my $d = decide($T0 + $dt, @z);
            $admitted++ if $d->{allowed};
            $bad_retry++ unless $d->{zones}[0]{reset} == 2000 - $dt;
            my $c = redis_cmd('ZCARD', $key);
            $max_card = $c if $c > $max_card;
        }
        is($admitted, 0, "$tag: 799 hammering requests in 1201..1999 all denied");
        is($bad_retry, 0, "$tag: each one's reset_ms is exactly 2000 - t");
        is($max_card, 3, "$tag: ZCARD never exceeded the limit while hammering");
        steps("$tag after hammering", $T0, \@z, [2000, '1 | 1 0 100']);
    }

    # A gap longer than the window: everything left.
    steps("$tag gap", $T0, \@z, [5000, '1 | 1 2 1000']);
    is(redis_cmd('ZCARD', $key), 1, "$tag: after the gap only the new entry is left");

    # Cost: limit 10.  A request takes `cost` units, one member each.
    my $ck = "rl:log:cost$T0";
    my @c = ([$ck, 'l', 10, 1000]);
    steps("$tag cost", $T0, \@c,
        [0,  { cost => 4 },  '1 | 1 6 1000'],
        [10, { cost => 5 },  '1 | 1 1 990'],
        [20, { cost => 2 },  '0 | 0 1 980'],   # needs the 1st oldest (score 0) gone
        [20, { cost => 5 },  '0 | 0 1 980'],   # needs the 4 oldest gone: the 4th is at 0
        [20, { cost => 6 },  '0 | 0 1 990'],   # needs 5 gone: the 5th is at 10
        [20, { cost => 11 }, '0 | 0 1 1000'],  # more than the limit: never fits
        [20, { cost => 1 },  '1 | 1 0 980'],
        [30, { cost => 0 },  '1 | 1 0 970'],   # a read: room is 0, oldest leaves at 1000
        [1000, { cost => 0 }, '1 | 1 4 10'],   # the 4 units at 0 have left
    );
    my $m = redis_cmd('ZRANGE', $ck, 0, -1);
    is(scalar @$m, 6, "$tag cost: ZCARD is the units admitted and still in the window");
    is_deeply([sort { $a <=> $b } @$m],
        [map({ ($T0 + 10) * 1000 + $_ } 4 .. 8), ($T0 + 20) * 1000 + 9],
        "$tag cost: cost N adds N consecutive integer members from now*1000 + used");
    steps("$tag cost 0 on an empty key", $T0, [["rl:log:none$T0", 'l', 10, 1000]],
        [0, { cost => 0 }, '1 | 1 10 0']);
    is(redis_cmd('EXISTS', "rl:log:none$T0"), 0, "$tag: a read creates no key");

    # Member uniqueness: many decisions at the same injected ms all count.
    my $uk = "rl:log:same$T0";
    my @u = ([$uk, 'l', 1000, 60000]);
    my $ok = 0;
    $ok += decide($T0 + 500, @u)->{allowed} for 1 .. 50;
    is($ok, 50, "$tag same ms: 50 decisions at one injected ms all admitted");
    is(redis_cmd('ZCARD', $uk), 50, "$tag same ms: ZCARD == 50 (no member reused)");
    steps("$tag same ms", $T0, \@u, [500, { cost => 3 }, '1 | 1 947 60000']);
    my $um = redis_cmd('ZRANGE', $uk, 0, -1);
    is_deeply([sort { $a <=> $b } @$um], [map { ($T0 + 500) * 1000 + $_ } 0 .. 52],
        "$tag same ms: members are now*1000 + 0, 1, 2, ... (the count spreads them)");
    is(scalar(grep { !/^[0-9]+$/ } @$um), 0, "$tag: every member is an integer");

    # More than 1000 at one ms: the 1001st finds now*1000 + 1001%1000 taken and moves past
    # the newest member; the next ms starts at its own now*1000 + used%1000.
    my $ok2 = 0;
    my $xk = "rl:log:k$T0";
    $ok2 += decide($T0, [$xk, 'l', 2000, 60000])->{allowed} for 1 .. 1001;
    is($ok2, 1001, "$tag 1001 at one ms: all admitted");
    steps("$tag 1001 at one ms", $T0, [[$xk, 'l', 2000, 60000]], [1, '1 | 1 998 59999']);
    is_deeply([sort { $a <=> $b } @{ redis_cmd('ZRANGE', $xk, 0, -1) }],
        [map({ $T0 * 1000 + $_ } 0 .. 1000), ($T0 + 1) * 1000 + 1],
        "$tag 1001 at one ms: 1002 distinct members");

    # A large cost (more than one ZADD chunk of 256): members now*1000 + 0..1499, running
    # into the next ms's range.  Then a request at the same ms whose member
    # (now*1000 + 1500%1000) is taken, and one 1 ms later whose member is free.
    my $bk = "rl:log:big$T0";
    my @b = ([$bk, 'l', 2000, 60000]);
    steps("$tag big cost", $T0, \@b,
        [0, { cost => 1500 }, '1 | 1 500 60000'],
        [0, { cost => 1 }, '1 | 1 499 60000'],
        [1, { cost => 1 }, '1 | 1 498 59999'],
    );
    is(redis_cmd('ZCARD', $bk), 1502, "$tag big cost: ZCARD == 1502 units");
    is(redis_cmd('ZSCORE', $bk, $T0 * 1000 + 500), $T0,
        "$tag big cost: now*1000 + 500 belongs to the cost-1500 request");
    is(redis_cmd('ZSCORE', $bk, $T0 * 1000 + 1500), $T0,
        "$tag big cost: the colliding request moved past the newest member");
    is(redis_cmd('ZSCORE', $bk, ($T0 + 1) * 1000 + 501), $T0 + 1,
        "$tag big cost: the t=1 request took now*1000 + 1501%1000");

    # TTL: the key lives one window after its newest entry.
    my $tk = "rl:log:ttl$T0";
    decide($T0, [$tk, 'l', 2, 60000]);
    my $pttl = redis_cmd('PTTL', $tk);
    ok($pttl > 59000 && $pttl <= 60000, "$tag TTL: 59000 < PTTL $pttl <= window");
    decide($T0 + 1, [$tk, 'l', 2, 60000]);
    redis_cmd('PEXPIRE', $tk, 30000);
    is(verdict(decide($T0 + 2, [$tk, 'l', 2, 60000])), '0 | 0 0 59998', "$tag TTL: denied");
    $pttl = redis_cmd('PTTL', $tk);
    ok($pttl <= 30000 && $pttl > 29000, "$tag TTL: a denial does not touch the TTL ($pttl)");
    is(verdict(decide($T0 + 2, [$tk, 'l', 2, 60000, 0])), '1 | 1 0 59998', "$tag TTL: read");
    $pttl = redis_cmd('PTTL', $tk);
    ok($pttl <= 30000 && $pttl > 29000, "$tag TTL: a cost-0 read does not touch it ($pttl)");
}

# A request costing more than the limit never fits: reset_ms = window, on a
# key holding entries (above: "0 | 0 1 1000") and on an empty one alike.
is(verdict(decide(10_000, ['rl:log:huge', 'l', 10, 1000, 11])), '0 | 0 10 1000',
    'cost > limit on an empty key: reset_ms = window, as on a non-empty key');
is(redis_cmd('EXISTS', 'rl:log:huge'), 0, 'cost > limit on an empty key records nothing');

# clock "": the script reads Redis TIME; the score is that ms, the member that us.
{
    my $k = 'rl:log:redisclock';
    my $t = redis_cmd('TIME');
    my $before = $t->[0] * 1000 + int($t->[1] / 1000);
    is(verdict(decide('', [$k, 'l', 5, 60000])), '1 | 1 4 60000', 'clock "": admitted');
    my $after = do { my $t = redis_cmd('TIME'); $t->[0] * 1000 + int($t->[1] / 1000) };
    my $e = redis_cmd('ZRANGE', $k, 0, -1, 'WITHSCORES');
    ok($e->[1] >= $before && $e->[1] <= $after,
        "clock \"\": score $e->[1] is Redis TIME in ms (between $before and $after)");
    like($e->[0], qr/^[0-9]{16}$/, 'clock "": member is an integer (microseconds)');
    is(int($e->[0] / 1000), $e->[1], 'clock "": member / 1000 == score');
    decide(undef, [$k, 'l', 5, 60000]) for 1 .. 3;
    is(redis_cmd('ZCARD', $k), 4, 'clock "": consecutive decisions all recorded');
    my $d = decide(undef, [$k, 'l', 5, 60000, 2]);
    is($d->{allowed}, 0, 'clock "": cost 2 with 1 unit left is denied');
    my $r = $d->{zones}[0]{reset};
    ok($r > 59000 && $r <= 60000, "clock \"\": reset_ms $r is (oldest + window) - TIME");
}

done_testing();

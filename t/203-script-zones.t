# The decision script over several zones of mixed algorithms in one call
# (no nginx): all-or-nothing (a zone that denies means nothing is recorded in
# any zone), one verdict per zone, error replies for bad arguments and for
# keys holding someone else's data, which then change nothing.  Expectations
# are literals worked out by hand (see t/200..202 for each algorithm's rules).
use lib 't/lib';
use RLTest;
use RLTest::Script qw(:all);

for my $T0 (10_000_000, 1_700_000_000_000) {
    my $tag = "T0=$T0";
    my $S = $T0 / 1000 % 256;    # the counter's stored window index at t = 0

    # Two zones: sliding_log limit 3 + GCRA 10 per 1000 ms burst 2.
    my @k2 = ("rl:log:$T0", "rl:gcra:$T0");
    my @two = ([$k2[0], 'l', 3, 1000], [$k2[1], 'g', 10, 1000, 1, 2]);
    steps("$tag 2 zones", $T0, \@two,
        [0, '1 | 1 2 1000 | 1 1 100'],
        [0, '1 | 1 1 1000 | 1 0 100'],
    );
    my $before = snapshot(@k2);
    steps("$tag 2 zones", $T0, \@two,
        [0, '0 | 1 1 1000 | 0 0 100'],   # the log has room, GCRA does not
    );
    is(snapshot(@k2), $before, "$tag 2 zones: GCRA denied, so the log recorded nothing");
    is(redis_cmd('ZCARD', $k2[0]), 2, "$tag 2 zones: ZCARD still 2");
    is(gcra_value($k2[1], 10), ($T0 + 200) . '+0/10', "$tag 2 zones: TAT still +200");
    steps("$tag 2 zones", $T0, \@two,
        [100, '1 | 1 0 900 | 1 0 100'],
    );
    $before = snapshot(@k2);
    steps("$tag 2 zones", $T0, \@two,
        [200, '0 | 0 0 800 | 1 1 100'],  # GCRA has room, the log does not
    );
    is(snapshot(@k2), $before, "$tag 2 zones: the log denied, so GCRA stored nothing");

    # Three zones: log limit 2, counter limit 3, GCRA 10/1000 burst 5.
    my @k3 = ("rl:a:$T0", "rl:b:$T0", "rl:c:$T0");
    my @three = ([$k3[0], 'l', 2, 1000], [$k3[1], 'c', 3, 1000], [$k3[2], 'g', 10, 1000, 1, 5]);
    steps("$tag 3 zones", $T0, \@three,
        [0,  '1 | 1 1 1000 | 1 2 2000 | 1 4 100'],
        [10, '1 | 1 0 990 | 1 1 1490 | 1 3 90'],
    );
    $before = snapshot(@k3);
    steps("$tag 3 zones", $T0, \@three,
        [20, '0 | 0 0 980 | 1 1 1480 | 1 3 80'],   # only the log denies
    );
    is(snapshot(@k3), $before, "$tag 3 zones: one zone denied: no zone changed");
    is(redis_cmd('ZCARD', $k3[0]), 2, "$tag 3 zones: log ZCARD 2");
    is(counter_value($k3[1]), "$S:2:0", "$tag 3 zones: counter value unchanged");
    is(gcra_value($k3[2], 10), ($T0 + 200) . '+0/10', "$tag 3 zones: GCRA TAT unchanged");
    steps("$tag 3 zones", $T0, \@three,
        [1000, '1 | 1 0 10 | 1 0 500 | 1 4 100'],
    );
    $before = snapshot(@k3);
    steps("$tag 3 zones", $T0, \@three,
        [1005, '0 | 0 0 5 | 0 0 495 | 1 4 95'],    # log and counter deny
    );
    is(snapshot(@k3), $before, "$tag 3 zones: two zones denied: no zone changed");
    my @bc = map { snapshot($_) } @k3[1, 2];
    steps("$tag 3 zones", $T0, \@three,
        [1010, '0 | 1 1 990 | 0 0 490 | 1 4 90'],  # the log has room again, the counter not
    );
    is_deeply(redis_cmd('ZRANGE', $k3[0], 0, -1, 'WITHSCORES'), [($T0 + 1000) * 1000 + 1, $T0 + 1000],
        "$tag 3 zones: the log only dropped its expired entry (t=10), added nothing");
    is_deeply([map { snapshot($_) } @k3[1, 2]], \@bc, "$tag 3 zones: counter and GCRA unchanged");
    steps("$tag 3 zones", $T0, \@three,
        [1500, '1 | 1 0 500 | 1 0 500 | 1 4 100'],
    );
    is(redis_cmd('ZCARD', $k3[0]), 2, "$tag 3 zones: admitted: log recorded");
    is(counter_value($k3[1]), ($S + 1) . ':2:2', "$tag 3 zones: admitted: counter counted");
    is(gcra_value($k3[2], 10), ($T0 + 1600) . '+0/10', "$tag 3 zones: admitted: GCRA advanced");

    # Per-zone cost: a read-only zone (cost 0) next to a counting one.
    my @kr = ("rl:ro:$T0", "rl:rw:$T0");
    my @rz = ([$kr[0], 'l', 2, 1000], [$kr[1], 'c', 5, 1000]);
    steps("$tag per-zone cost", $T0, \@rz,
        [0, { costs => [0, 1] }, '1 | 1 2 0 | 1 4 2000'],
        [0, { costs => [0, 4] }, '1 | 1 2 0 | 1 0 1200'],
        [0, { costs => [1, 1] }, '0 | 1 2 0 | 0 0 1200'],
    );
    is(redis_cmd('EXISTS', $kr[0]), 0, "$tag per-zone cost: the cost-0 zone recorded nothing");
    is(counter_value($kr[1]), "$S:5:0", "$tag per-zone cost: the other counted 1 + 4");
}

# Bad arguments: an error reply, and nothing recorded in any zone.
{
    my $T = 20_000_000;
    my ($ka, $kb) = ('rl:bad:a', 'rl:bad:b');
    decide($T, [$ka, 'l', 5, 60000]);    # give zone 1 some state
    my $before = snapshot($ka, $kb);
    my $e1 = 'ERR:ERR ratelimit: bad arguments for zone 1';
    my $e2 = 'ERR:ERR ratelimit: bad arguments for zone 2';
    my @cases = (
        ['unknown algorithm',   [$ka], [$T, 'x', 5, 60000, 1, 0], $e1],
        ['algorithm in full',   [$ka], [$T, 'sliding_log', 5, 60000, 1, 0], $e1],
        ['limit 0',             [$ka], [$T, 'l', 0, 60000, 1, 0], $e1],
        ['limit not a number',  [$ka], [$T, 'l', 'ten', 60000, 1, 0], $e1],
        ['window 0',            [$ka], [$T, 'c', 5, 0, 1, 0], $e1],
        ['cost -1',             [$ka], [$T, 'g', 5, 60000, -1, 1], $e1],
        ['burst missing',       [$ka], [$T, 'l', 5, 60000, 1], $e1],
        ['no arguments',        [$ka], [], $e1],
        ['zone 2 unknown algorithm', [$ka, $kb], [$T, 'l', 5, 60000, 1, 0, 'z', 5, 60000, 1, 0], $e2],
        ['zone 2 limit 0',      [$ka, $kb], [$T, 'l', 5, 60000, 1, 0, 'c', 0, 60000, 1, 0], $e2],
        ['zone 2 args missing', [$ka, $kb], [$T, 'l', 5, 60000, 1, 0], $e2],
        ['zone 2 half there',   [$ka, $kb], [$T, 'l', 5, 60000, 1, 0, 'g', 5], $e2],
    );
    for my $c (@cases) {
        my ($name, $keys, $argv, $want) = @$c;
        is(verdict(decide_raw($keys, @$argv)), $want, "bad arguments: $name");
        is(snapshot($ka, $kb), $before, "bad arguments: $name: nothing changed");
    }
    # GCRA with burst 0 could never admit anything (new TAT - now = cost*T > 0):
    # a configuration error like limit 0.  Also as a later zone, after zones
    # that would admit: nothing recorded anywhere.
    is(verdict(decide_raw([$kb], $T, 'g', 10, 1000, 1, 0)), $e1, 'bad arguments: GCRA burst 0');
    is(verdict(decide_raw([$kb], $T, 'g', 10, 1000, 0, 0)), $e1, 'bad arguments: GCRA burst 0, cost 0');
    is(verdict(decide_raw([$kb], $T, 'g', 10, 1000, 1, -1)), $e1, 'bad arguments: GCRA burst -1');
    is(verdict(decide_raw([$ka, $kb], $T, 'l', 5, 60000, 1, 0, 'g', 10, 1000, 1, 0)), $e2,
        'bad arguments: zone 2 GCRA burst 0');
    is(snapshot($ka, $kb), $before, 'bad arguments: GCRA burst 0: nothing changed');
    is(redis_cmd('EXISTS', $kb), 0, 'GCRA burst 0: nothing stored');
    # burst 0 means nothing to the other algorithms.
    is(verdict(decide_raw([$kb], $T, 'c', 10, 1000, 1, 0)), 'RAW:1 1 9 2000', 'counter with burst 0: fine');
    redis_cmd('DEL', $kb);
}

# Someone else's data under a zone key: WRONGTYPE, and nothing changes in any
# zone (the error comes from the check phase, before any zone records).
{
    my $T = 30_000_000;
    redis_cmd('RPUSH', 'foreign:list', 'x', 'y');
    redis_cmd('HSET', 'foreign:hash', 'f', 'v');
    redis_cmd('ZADD', 'foreign:zset', 1, 'm');
    my @ok = (['rl:wt:l', 'l', 5, 60000], ['rl:wt:c', 'c', 5, 60000], ['rl:wt:g', 'g', 5, 60000, 1, 2]);
    decide($T, @ok);    # every algorithm's key holds state
    my @all = ('foreign:list', 'foreign:hash', 'foreign:zset', map { $_->[0] } @ok);
    my $before = snapshot(@all);
    my @foreign = (
        ['list', 'l', 'foreign:list'], ['list', 'c', 'foreign:list'], ['list', 'g', 'foreign:list'],
        ['hash', 'l', 'foreign:hash'], ['zset', 'c', 'foreign:zset'], ['zset', 'g', 'foreign:zset'],
    );
    for my $f (@foreign) {
        my ($type, $alg, $key) = @$f;
        my $bad = [$key, $alg, 5, 60000, 1, $alg eq 'g' ? 2 : 0];
        for my $pos ('first', 'middle', 'last') {
            my @z = $pos eq 'first' ? ($bad, @ok) : $pos eq 'last' ? (@ok, $bad) : ($ok[0], $bad, @ok[1, 2]);
            like(verdict(decide($T + 10, @z)), qr/^ERR:WRONGTYPE /,
                "$type under a '$alg' zone ($pos of 4): WRONGTYPE error reply");
            is(snapshot(@all), $before, "$type under a '$alg' zone ($pos of 4): nothing changed");
        }
    }
}

# A string of the wrong length under a counter key (9 bytes) or a gcra key (12
# bytes): someone else's data, a value of another format, or the other
# algorithm's value (a zone whose algorithm changed).  The script's own
# WRONGTYPE error reply, naming the key, and nothing changes in any zone.
{
    my $T = 40_000_000;
    my @ok = (['rl:wl:l', 'l', 5, 60000], ['rl:wl:c', 'c', 5, 60000], ['rl:wl:g', 'g', 5, 60000, 1, 2]);
    decide($T, @ok);    # every algorithm's key holds state
    my @strings = (
        ['empty string',          ''],
        ['short text',            'hello'],
        ['8 bytes',               "\0" x 8],
        ['10 bytes',              "\0" x 10],
        ['11 bytes',              "\0" x 11],
        ['13 bytes',              "\0" x 13],
        ['old gcra text',         '40000200'],
        ['old gcra text (epoch)', '1700000000333.3333'],
        ['old counter text',      '666:1:0'],
        ['a gcra value',          pack('d< V', 40_000_100, 0)],     # 12 bytes
        ['a counter value',       pack('C V V', 666 % 256, 1, 0)],  # 9 bytes
    );
    my @fk;
    for my $i (0 .. $#strings) {
        push @fk, "foreign:str:$i";
        redis_cmd('SET', $fk[-1], $strings[$i][1], 'PX', 600000);
    }
    my @all = (@fk, map { $_->[0] } @ok);
    my $before = snapshot(@all);
    for my $i (0 .. $#strings) {
        my ($what, $v) = @{ $strings[$i] };
        for my $alg ('c', 'g') {
            my $len = $alg eq 'c' ? 9 : 12;
            next if length $v == $len;    # the right length is read as a value (t/201, t/202)
            my $bad = [$fk[$i], $alg, 5, 60000, 1, $alg eq 'g' ? 2 : 0];
            for my $pos ('first', 'last') {
                my @z = $pos eq 'first' ? ($bad, @ok) : (@ok, $bad);
                is(verdict(decide($T + 10, @z)), "ERR:WRONGTYPE ratelimit: $fk[$i] holds other data",
                    "$what (" . length($v) . " bytes) under a '$alg' zone ($pos of 4): WRONGTYPE naming the key");
                is(snapshot(@all), $before, "$what under a '$alg' zone ($pos of 4): nothing changed");
            }
        }
    }
}

done_testing();

# sliding_log_packed ("p"): the exact log of t/200, stored as one string of
# 6-byte little-endian admission times in ms, oldest first.  The same decisions
# as the sorted-set log (t/204 checks that on random traffic); here the literal
# tables and what the string holds.
use lib 't/lib';
use RLTest;
use RLTest::Script qw(:all);

sub entries {
    my $v = redis_cmd('GET', $_[0]);
    return 'none' unless defined $v;
    return "BAD:" . length($v) . ' bytes' if ref $v || length($v) % 6;
    return join ',', map { unpack 'Q<', substr($v, 6 * $_, 6) . "\0\0" } 0 .. length($v) / 6 - 1;
}

for my $T0 (10_000_000, 1_700_000_000_000) {
    my $tag = "T0=$T0";
    my $key = "rl:plog:a$T0";
    my @z = ([$key, 'p', 3, 1000]);
    steps("$tag limit", $T0, \@z,
        [0,    '1 | 1 2 1000'],
        [100,  '1 | 1 1 900'],
        [200,  '1 | 1 0 800'],
        [300,  '0 | 0 0 700'],
        [999,  '0 | 0 0 1'],
        [1000, '1 | 1 0 100'],
        [1099, '0 | 0 0 1'],
        [1100, '1 | 1 0 100'],
    );
    is(entries($key), join(',', map { $T0 + $_ } 200, 1000, 1100),
        "$tag: the string holds the admitted times in the window, oldest first");
    steps("$tag read", $T0, \@z, [1150, { cost => 0 }, '1 | 1 0 50']);
    steps("$tag prune on denial", $T0, \@z, [1200, { cost => 2 }, '0 | 0 1 800']);
    is(entries($key), join(',', map { $T0 + $_ } 1000, 1100),
        "$tag: a denial drops what has left the window, as the log's ZREMRANGEBYSCORE does");
    my $pttl = redis_cmd('PTTL', $key);
    ok($pttl > 0 && $pttl <= 1000, "$tag: the TTL of the last admission stays ($pttl)");

    # Cost: a request of cost N is N entries; a gateway clock behind the others
    # inserts in order.
    my $ck = "rl:plog:cost$T0";
    my @c = ([$ck, 'p', 10, 1000]);
    steps("$tag cost", $T0, \@c,
        [0,  { cost => 4 },  '1 | 1 6 1000'],
        [10, { cost => 5 },  '1 | 1 1 990'],
        [5,  { cost => 1 },  '1 | 1 0 995'],     # a clock 5 ms behind
        [20, { cost => 1 },  '0 | 0 0 980'],
    );
    is(entries($ck), join(',', ($T0) x 4, $T0 + 5, ($T0 + 10) x 5), "$tag cost: entries sorted");
    is(verdict(decide($T0 + 20, [$ck, 'p', 10, 1000, 11])), '0 | 0 0 1000',
        "$tag: cost > limit answers the window");
}

# Someone else's data: another type, or a string whose length is no multiple of 6.
redis_cmd('RPUSH', 'rl:plog:list', 'x');
redis_cmd('SET', 'rl:plog:str', 'abcde');
is(verdict(decide(5000, ['rl:plog:list', 'p', 3, 1000])),
    'ERR:WRONGTYPE Operation against a key holding the wrong kind of value', 'a list: WRONGTYPE');
is(verdict(decide(5000, ['rl:plog:str', 'p', 3, 1000])),
    'ERR:WRONGTYPE ratelimit: rl:plog:str holds other data', 'a 5-byte string: not ours');
is(redis_cmd('GET', 'rl:plog:str'), 'abcde', 'and it is left alone');

# clock "": Redis TIME, one entry per unit, all in order.
{
    my $k = 'rl:plog:redisclock';
    my $r = batch_raw(map { [[$k], '', 'p', 100, 60000, 2, 0] } 1 .. 10);
    is(scalar(grep { $_->[0] == 1 } @$r), 10, 'clock "": 10 decisions of cost 2 admitted');
    my @e = split /,/, entries($k);
    is(scalar @e, 20, 'clock "": 20 entries');
    is("@e", join(' ', sort { $a <=> $b } @e), 'clock "": sorted');
}

done_testing();

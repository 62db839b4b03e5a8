# Several decisions in one script call (no nginx): one reply per decision, in
# order, each decision seeing what the ones before it wrote; an error (bad
# arguments, someone else's data under a key) fails only its own decision and
# records nothing for it; what cannot be told apart (NOSCRIPT, keys that do not
# add up) fails the whole call; with clock=redis one TIME serves the call.
use lib 't/lib';
use RLTest;
use RLTest::Script qw(:all);

my $T = 1_700_000_000_000;

sub replies_of {
    my ($r) = @_;
    return is_error($r) ? 'ERR:' . $r->message
        : join ' / ', map { is_error($_) ? 'ERR:' . $_->message : "@$_" } @$r;
}

sub replies { replies_of(batch_raw(@_)) }
# A call of one decision answers its reply itself.
sub one { replies_of([batch_raw(@_)]) }

# In order, on the same key: each decision sees the previous one's entry.
is(replies(map { [['rl:b:same'], $T, 'l', 3, 1000, 1, 0] } 1 .. 5),
    '1 1 2 1000 / 1 1 1 1000 / 1 1 0 1000 / 0 0 0 1000 / 0 0 0 1000',
    'five decisions on one key: three admitted in order, then denied');
is(redis_cmd('ZCARD', 'rl:b:same'), 3, 'three entries recorded');

# A batch of one answers that decision's reply itself, as before.
is(RLTest::Redis::format_reply(batch_raw([['rl:b:one'], $T, 'c', 5, 1000, 2, 0])), '1 1 3 1500',
    'a batch of one: the decision reply, not an array of one');

# Per-decision errors.
redis_cmd('RPUSH', 'rl:b:list', 'x');
redis_cmd('SET', 'rl:b:str', 'not ours');
my @keys = map { "rl:b:k$_" } 1 .. 4;
my $before = snapshot('rl:b:list', 'rl:b:str');
is(replies(
        [[$keys[0]], $T, 'l', 5, 1000, 1, 0],
        [['rl:b:list'], $T, 'l', 5, 1000, 1, 0],                          # WRONGTYPE on ZRANGE
        [[$keys[1], 'rl:b:list'], $T, 'g', 5, 1000, 1, 2, 'c', 5, 1000, 1, 0],   # on GET, zone 2
        [[$keys[2]], $T, 'x', 5, 1000, 1, 0],                             # bad arguments
        [['rl:b:str'], $T, 'g', 5, 1000, 1, 1],                           # other data
        [[$keys[3], $keys[0]], $T, 'c', 5, 1000, 1, 0, 'l', 5, 1000, 1, 0],
    ),
    join(' / ',
        '1 1 4 1000',
        'ERR:WRONGTYPE Operation against a key holding the wrong kind of value',
        'ERR:WRONGTYPE Operation against a key holding the wrong kind of value',
        'ERR:ERR ratelimit: bad arguments for zone 1',
        'ERR:WRONGTYPE ratelimit: rl:b:str holds other data',
        '1 1 4 2000 1 3 1000'),
    'errors fail their own decision only, the others are decided in order');
is(redis_cmd('EXISTS', $keys[1]), 0, 'a decision failing in zone 2 records nothing in zone 1');
is(redis_cmd('EXISTS', $keys[2]), 0, 'a decision with bad arguments records nothing');
is(redis_cmd('ZCARD', $keys[0]), 2, 'the decisions around the errors were recorded');
is(snapshot('rl:b:list', 'rl:b:str'), $before,
    'the foreign keys are untouched');

# Arguments missing at the end are the last decision's bad arguments.
is(replies([[$keys[0]], $T, 'l', 5, 1000, 1, 0], [['rl:b:x'], $T, 'l', 5]),
    '1 1 2 1000 / ERR:ERR ratelimit: bad arguments for zone 1',
    'a truncated last decision fails alone');

# A decision's zones run up to the next clock; the last one has the keys left, so
# a key too many is its zone without arguments.  Keys that run out before the last
# decision, or a clock that is neither a number nor "", fail the whole call.
{
    my ($k, @a) = batch_argv([[$keys[0]], $T, 'l', 5, 1000, 1, 0], [[$keys[1]], $T, 'l', 5, 1000, 1, 0]);
    is(replies_of(redis_cmd('EVALSHA', script_sha(), 3, @$k, 'extra', @a)),
        '1 1 1 1000 / ERR:ERR ratelimit: bad arguments for zone 2',
        'a key too many: the last decision has bad arguments');
    like(RLTest::Redis::format_reply(redis_cmd('EVALSHA', script_sha(), 1, $k->[0], @a)),
        qr/^ERR:ERR ratelimit: malformed batch at decision 2/, 'keys running out fail the call');
    like(RLTest::Redis::format_reply(redis_cmd('EVALSHA', script_sha(), 1, $k->[0], 'soon', @a[1 .. $#a])),
        qr/^ERR:ERR ratelimit: malformed batch at decision 1/, 'a clock that is no number fails the call');
    like(RLTest::Redis::format_reply(redis_cmd('EVALSHA', script_sha(), 0)),
        qr/^ERR:ERR ratelimit: malformed batch/, 'no decision at all fails the call');
}

# NOSCRIPT concerns the whole call.
redis_cmd('SCRIPT', 'FLUSH');
{
    my ($k, @a) = batch_argv(map { [["rl:b:ns$_"], $T, 'l', 5, 1000, 1, 0] } 1 .. 3);
    like(RLTest::Redis::format_reply(redis_cmd('EVALSHA', script_sha(), scalar @$k, @$k, @a)),
        qr/^ERR:NOSCRIPT/, 'NOSCRIPT: one error for the call');
    is(RLTest::Redis::format_reply(redis_cmd('EVAL', script_text(), scalar @$k, @$k, @a)),
        '1 1 4 1000 1 1 4 1000 1 1 4 1000', 'EVAL of the same batch decides all three');
}

# clock=redis: one TIME for the call, distinct members for every unit.
{
    redis_cmd('CONFIG', 'RESETSTAT');
    my @b = map { [['rl:b:rc' . ($_ % 4)], '', 'l', 100, 60000, 1 + $_ % 3, 0] } 1 .. 64;
    my $r = batch_raw(@b);
    is(scalar(grep { ref $_ eq 'ARRAY' && $_->[0] == 1 } @$r), 64, 'clock=redis: 64 decisions admitted');
    my ($time) = redis_cmd('INFO', 'commandstats') =~ /cmdstat_time:calls=(\d+)/;
    is($time, 1, 'clock=redis: one TIME for the 64 decisions');
    my $units = 0;
    $units += 1 + $_ % 3 for 1 .. 64;
    my $card = 0;
    $card += redis_cmd('ZCARD', "rl:b:rc$_") for 0 .. 3;
    is($card, $units, "clock=redis: $units units, $units entries");
    my ($zadd) = redis_cmd('INFO', 'commandstats') =~ /cmdstat_zadd:calls=(\d+)/;
    is($zadd, 64, 'clock=redis: one ZADD per decision, no member taken twice');
}

# Commands per admitted sliding_log decision: ZRANGE, ZCARD, ZADD, PEXPIRE while nothing has
# left the window; the reset comes from the first ZRANGE.
{
    my $k = 'rl:b:cmds';
    batch_raw(map { [[$k], $T, 'l', 100, 60000, 1, 0] } 1 .. 3);
    redis_cmd('CONFIG', 'RESETSTAT');
    is(replies(map { [[$k], $T + $_, 'l', 100, 60000, 1, 0] } 1 .. 16),
        join(' / ', map { '1 1 ' . (96 - $_) . ' ' . (59999 - $_) } 0 .. 15), '16 admitted');
    my %calls = redis_cmd('INFO', 'commandstats') =~ /cmdstat_(\w+):calls=(\d+)/g;
    delete @calls{qw(evalsha info config)};
    is(join(' ', map { "$_=$calls{$_}" } sort keys %calls), 'pexpire=16 zadd=16 zcard=16 zrange=16',
        'four commands per admitted decision');
}

# Figures out of range fail their own decision before anything is written: a 20-digit balance
# made DECRBY raise and abort the whole call after earlier decisions had been recorded.
{
    redis_cmd('SET', 'rl:b:big', '99999999999999999999');
    redis_cmd('SET', 'rl:b:ok', '10');
    redis_cmd('SET', 'rl:b:gnan', pack('d<V', 9**9**9 - 9**9**9, 0));
    redis_cmd('ZADD', 'rl:b:inf', 'inf', 'x');
    my $before = snapshot('rl:b:big', 'rl:b:gnan', 'rl:b:inf');
    is(replies(
            [['rl:b:ok'], $T, 'b', 1, 1, 1, 0],
            [['rl:b:big'], $T, 'b', 1, 1, 1, 0],
            [['rl:b:big'], $T, 'B', 1, 2, 5, 0],     # add: INCRBY would overflow
            [['rl:b:gnan'], $T, 'g', 5, 1000, 1, 1],
            [['rl:b:inf'], $T, 'l', 5, 1000, 1, 0],
            [['rl:b:ok'], $T, 'b', 1, 1, 1, 0],
        ),
        join(' / ',
            '1 1 9 0',
            'ERR:ERR ratelimit: rl:b:big holds a balance out of range (15 digits at most)',
            'ERR:ERR ratelimit: rl:b:big holds a balance out of range (15 digits at most)',
            'ERR:WRONGTYPE ratelimit: rl:b:gnan holds other data',
            'ERR:WRONGTYPE ratelimit: rl:b:inf holds scores that are not times',
            '1 1 8 0'),
        'each bad figure fails its own decision; the ones around it are recorded');
    is(redis_cmd('GET', 'rl:b:ok'), 8, 'both good decisions drew their credit');
    is(snapshot('rl:b:big', 'rl:b:gnan', 'rl:b:inf'), $before, 'the bad keys are untouched');
    is(one([['rl:b:big'], $T, 'B', 1, 1, 7, 0]), '1 1 7 0',
        'setting a balance replaces one out of range');
    is(replies([['rl:b:f15'], $T, 'B', 1, 1, 0, 0], [['rl:b:f15'], $T, 'B', 1, 2, 999999999, 0]),
        '1 1 0 0 / 1 1 999999999 0', 'a balance of 15 digits is still counted');
}

# An error naming a key stays short whatever the key: a reply line over the client's cap (4 KiB)
# dropped the connection and every decision on it.
{
    my $long = 'rl:b:' . ('k' x 5000);
    redis_cmd('SET', $long, 'not ours');
    my $r = one([[$long], $T, 'c', 5, 1000, 1, 0]);
    like($r, qr/^ERR:WRONGTYPE ratelimit: rl:b:k{95}\.\.\. holds other data$/, 'the key is cut at 100 bytes');
    cmp_ok(length($r), '<', 200, 'the error line is short');
}

# Two zones of one decision on one key with different algorithms (exact keys) are refused before
# either writes: one would write what the other cannot read.
is(one([['rl:b:shared', 'rl:b:shared'], $T, 'l', 5, 1000, 1, 0, 'b', 5, 1000, 1, 0]),
    'ERR:ERR ratelimit: zones 1 and 2 share a key with different algorithms',
    'one key, two algorithms: refused');
is(redis_cmd('EXISTS', 'rl:b:shared'), 0, 'and nothing written');

done_testing();

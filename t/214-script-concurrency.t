# Concurrency slots (issue 23) in the decision script, run directly against a
# real redis-server with an injected clock (no nginx).  The protocol is the
# script's header comment; in short:
#   zone "n": limit, window = the slot's life (lease_time) in ms, cost 1 takes
#   a slot (0 reads), burst = the request's member; a member per request in
#   flight, scored by when its slot lapses; reset 0 when admitted, 1000 when not
#   "Gn" releases the member (always ok; reset 1 if it was there), "Rn" renews
#   it (ok while it is there; gone, it is written back all the same: its request
#   is in flight); both cost 1, window = life, burst = the member
# Expectations are literals worked out by hand; t below is the offset from T0.
use lib 't/lib';
use RLTest;
use RLTest::Script qw(:all);

sub show {
    my ($r) = @_;
    return 'ERR:' . $r->message if is_error($r);
    return 'RAW:' . RLTest::Redis::format_reply($r) if ref $r ne 'ARRAY';
    my @v = @$r;
    my @out = (shift @v);
    push @out, join ' ', splice(@v, 0, 3) while @v;
    return join ' | ', @out;
}

# One decision: zones [key, letter, limit, window, cost, burst].
sub dec {
    my ($now, @z) = @_;
    return show(decide_raw([map { $_->[0] } @z], $now, map { @$_[1 .. 5] } @z));
}
sub take    { my ($now, $k, $m, $lim, $life) = @_; dec($now, [$k, 'n', $lim // 3, $life // 1000, 1, $m]) }
sub release { my ($now, $k, $m, $lim) = @_; dec($now, [$k, 'Gn', $lim // 3, 1000, 1, $m]) }
sub renew   { my ($now, $k, $m, $lim, $life) = @_; dec($now, [$k, 'Rn', $lim // 3, $life // 1000, 1, $m]) }

sub zscores {
    my $v = redis_cmd('ZRANGE', $_[0], 0, -1, 'WITHSCORES');
    my @p;
    push @p, "$v->[2*$_]\@$v->[2*$_+1]" for 0 .. $#$v / 2;
    return join ',', @p;
}

for my $T0 (10_000_000, 1_700_000_000_000) {
    my $tag = "T0=$T0";
    my $k = "rl:conc:a$T0";
    # limit 3, life 1000: three slots, the fourth rejected with reset 1000.
    is(take($T0, $k, 'r1'), '1 | 1 2 0', "$tag: the 1st slot");
    is(take($T0 + 1, $k, 'r2'), '1 | 1 1 0', "$tag: the 2nd");
    is(take($T0 + 2, $k, 'r3'), '1 | 1 0 0', "$tag: the 3rd: none left");
    is(take($T0 + 3, $k, 'r4'), '0 | 0 0 1000', "$tag: the 4th rejected, Retry-After 1 s");
    is(zscores($k), join(',', "r1\@" . ($T0 + 1000), "r2\@" . ($T0 + 1001), "r3\@" . ($T0 + 1002)),
        "$tag: one member per request, scored by its lapse; the rejected one wrote nothing");
    my $ttl = redis_cmd('PTTL', $k);
    # Redis's own clock runs between the calls: a loaded machine took tens of ms.
    ok($ttl > 500 && $ttl <= 1002, "$tag: the key lives as long as its latest slot (PTTL $ttl)");
    # A request that holds its member already keeps it: no second slot.
    is(take($T0 + 4, $k, 'r3'), '1 | 1 0 0', "$tag: the same member again: still one slot");
    # A read (cost 0) counts without taking.
    is(dec($T0 + 5, [$k, 'n', 3, 1000, 0, 'x']), '1 | 1 0 0', "$tag: a read takes nothing");
    is(redis_cmd('ZCARD', $k), 3, "$tag: ... and writes nothing");
    # Release: the member goes, its room comes back; twice is harmless.
    is(release($T0 + 10, $k, 'r2'), '1 | 1 1 1', "$tag: r2 released (reset 1: it was there)");
    is(release($T0 + 11, $k, 'r2'), '1 | 1 1 0', "$tag: r2 released again: nothing changes");
    is(release($T0 + 12, $k, 'nobody'), '1 | 1 1 0', "$tag: a member never taken: nothing changes");
    is(take($T0 + 13, $k, 'r4'), '1 | 1 0 0', "$tag: r4 admitted in r2's place");
    # Renewal: r1 (lapsing at 1000) renewed at 500 lapses at 1500.
    is(renew($T0 + 500, $k, 'r1'), '1 | 1 0 0', "$tag: r1 renewed");
    is(redis_cmd('ZSCORE', $k, 'r1'), $T0 + 1500, "$tag: ... to now + life");
    # At 1002 r3 lapsed (at 1004: taken again at 4); at 1004 it is gone, at 1013 r4.
    is(take($T0 + 1003, $k, 'r5'), '0 | 0 0 1000', "$tag: r3 still holds at 1003");
    is(take($T0 + 1004, $k, 'r5'), '1 | 1 0 0', "$tag: r3 lapsed at its score: r5 in its place");
    is(renew($T0 + 1005, $k, 'r3'), '0 | 0 0 0', "$tag: r3's renewal finds it gone: says so (lapsed)");
    is(redis_cmd('ZSCORE', $k, 'r3'), $T0 + 2005,
        "$tag: ... and writes it back, beyond the limit: its request is in flight, and counts until it ends");
    is(take($T0 + 1005, $k, 'r7'), '0 | 0 0 1000', "$tag: 4 in flight on a limit of 3: nothing more admitted");
    is(release($T0 + 1006, $k, 'r3'), '1 | 1 0 1', "$tag: r3's release removes it");
    is(release($T0 + 1007, $k, 'r3'), '1 | 1 0 0', "$tag: a second release is harmless");
    is(redis_cmd('ZCARD', $k), 3, "$tag: r1, r4, r5 hold");
    # Everything lapses: at 2013 r4 (1013), r5 (2004) and r1 (1500) are gone.
    is(take($T0 + 2013, $k, 'r6'), '1 | 1 2 0', "$tag: all lapsed: a fresh key");
    # Release to an emptied Redis: harmless, creates nothing.
    redis_cmd('DEL', $k);
    is(release($T0 + 2014, $k, 'r6'), '1 | 1 3 0', "$tag: release after a reset");
    is(redis_cmd('EXISTS', $k), 0, "$tag: ... creates nothing");
    is(renew($T0 + 2014, $k, 'r6'), '0 | 0 2 0', "$tag: renewal after a reset (Redis lost the slot): written back");
    is(redis_cmd('ZSCORE', $k, 'r6'), $T0 + 3014, "$tag: ... counted again from now");
}

# All-or-nothing with a rate zone: a slot is taken only when every zone admits,
# and a request without a slot is not counted against the rate.
{
    my $T0 = 10_000_000;
    my ($c, $l) = ('rl:conc:both', 'rl:rate:both');
    is(dec($T0, [$c, 'n', 1, 1000, 1, 'a'], [$l, 'l', 2, 60000, 1, 0]), '1 | 1 0 0 | 1 1 60000',
        'both: admitted by both zones');
    is(dec($T0 + 1, [$c, 'n', 1, 1000, 1, 'b'], [$l, 'l', 2, 60000, 1, 0]), '0 | 0 0 1000 | 1 1 59999',
        'both: no slot: rejected, the rate not counted');
    is(redis_cmd('ZCARD', $l), 1, 'both: ... the rate log holds the first request only');
    is(release($T0 + 2, $c, 'a', 1), '1 | 1 1 1', 'both: a released');
    is(dec($T0 + 3, [$c, 'n', 1, 1000, 1, 'c'], [$l, 'l', 2, 60000, 1, 0]), '1 | 1 0 0 | 1 0 59997',
        'both: c takes the slot and the last unit of rate');
    is(release($T0 + 4, $c, 'c', 1), '1 | 1 1 1', 'both: c released');
    is(dec($T0 + 5, [$c, 'n', 1, 1000, 1, 'd'], [$l, 'l', 2, 60000, 1, 0]), '0 | 1 1 0 | 0 0 59995',
        'both: the rate rejects: no slot taken');
    is(redis_cmd('EXISTS', $c), 0, 'both: ... the concurrency key holds nothing');
}

# clock=redis: scores are Redis TIME + life.
{
    my $k = 'rl:conc:redis';
    my $before = int(Time::HiRes::time() * 1000);
    is(take('', $k, 'm', 2, 5000), '1 | 1 1 0', 'clock=redis: a slot');
    my $s = redis_cmd('ZSCORE', $k, 'm');
    ok($s >= $before + 5000 && $s <= $before + 6000, "clock=redis: scored TIME + life ($s)");
}

# Bad arguments, refused like any other zone's.
{
    my $k = 'rl:conc:bad';
    like(dec(1000, [$k, 'n', 3, 1000, 1, '']), qr/^ERR:.*bad arguments for zone 1/, 'an empty member');
    like(dec(1000, [$k, 'n', 3, 1000, 2, 'm']), qr/^ERR:.*bad arguments for zone 1/, 'cost 2');
    like(dec(1000, [$k, 'Gn', 3, 1000, 2, 'm']), qr/^ERR:.*bad arguments for zone 1/, 'a release of cost 2');
    like(dec(1000, [$k, 'Rn', 3, 1000, 1, '']), qr/^ERR:.*bad arguments for zone 1/, 'a renewal without member');
    like(dec(1000, [$k, 'n', 0, 1000, 1, 'm']), qr/^ERR:.*bad arguments for zone 1/, 'limit 0');
    redis_cmd('SET', $k, 'x');
    like(dec(1000, [$k, 'n', 3, 1000, 1, 'm']), qr/^ERR:WRONGTYPE/, 'a key of other data: WRONGTYPE');
    is(redis_cmd('GET', $k), 'x', '... left alone');
    like(dec(1000, ['rl:conc:same', 'n', 3, 1000, 1, 'm'], ['rl:conc:same', 'l', 3, 1000, 1, 0]),
        qr/share a key with different algorithms/, 'one key, two algorithms');
}

done_testing();

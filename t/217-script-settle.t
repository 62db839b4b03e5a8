# Settled costs (issue 32) in the decision script, run directly against a real
# redis-server with an injected clock (no nginx).  The protocol is the script's
# header comment; in short:
#   a zone's field ending with "!" (l p c g q b, plain or "~<D>") records its
#   cost as a placement even when admitted now: at T = now, as a delayed
#   request's placement, its ledger entry kept for an hour (+ grace); it answers
#   7 fields: ok remaining reset_ms granted lease_ms token rid
#   "G<letter><rid>" gives u units of it back (u = estimate - value);
#   "C<letter><rid>" charges u more (value - estimate) at now, past the limit,
#   only while rid is in the key's ledger (it leaves it): reply 1 1 remaining r.
#   "^" instead of "!" (several backends): the same placement, its ledger entry
#   kept for the grace only.
# Expectations are literals worked out by hand; t below is the offset from T0.
use lib 't/lib';
use RLTest;
use RLTest::Script qw(:all);

my $R = 2**52;    # reserved sliding_log members start here (plus the clock in µs)
my $T0 = 10_000_000;
my $HORIZON = 3_600_000 + 10_000;    # a placement's ledger entry: an hour + the grace

# A reply as "allowed | ok remaining reset [granted lease token] | ...": 7 fields
# for a zone whose field has "!", "~" or "+", 3 for the others; the rid kept in
# %RID by key (zone_fields checks it is there exactly when units were placed).
our %RID;
sub show {
    my ($r, @z) = @_;
    return zone_fields($r, [map { $_->[1] =~ /[!~+^]/ ? 7 : 3 } @z], sub { $RID{ $z[$_[0]][0] } = $_[1] });
}

# One decision at T0 + t: zones [key, field, limit, window, cost (1), burst (0)].
sub dec {
    my ($t, @z) = @_;
    my @zz = map { [$_->[0], $_->[1], $_->[2], $_->[3], $_->[4] // 1, $_->[5] // 0] } @z;
    my $r = decide_raw([map { $_->[0] } @zz], $T0 + $t, map { @$_[1 .. 5] } @zz);
    return show($r, @zz);
}

# A give-back or charge at T0 + t: its reply's 4 integers as one line.
sub op {
    my ($t, $key, $op, $limit, $w, $u, $last) = @_;
    my $r = decide_raw([$key], $T0 + $t, $op, $limit, $w, $u, $last);
    return ref $r eq 'ARRAY' ? "@$r" : is_error($r) ? 'ERR:' . $r->message : RLTest::Redis::format_reply($r);
}

sub zscores { log_scores($_[0], $T0, $R) }

sub entries { packed_times($_[0], $T0) }

sub quota_value {
    my $v = redis_cmd('GET', $_[0]);
    return $v unless defined $v && length $v == 10;
    my ($lo, $hi, $c) = unpack('V v V', $v);
    return ($hi * 2**32 + $lo) . ":$c";
}

# The members of units placed at t with a gateway clock, when nothing in the set
# is above them: 2^52 + (T0 + t) in µs.
sub m0 { sprintf '%.0f', $R + ($T0 + $_[0]) * 1000 }
# A gcra token: the TAT left, (ms mod 2^22) * limit + r + 1.
sub gtok { my ($t, $limit, $r) = @_; (($T0 + $t) % 4194304) * $limit + ($r // 0) + 1 }

sub ledger { "$_[0]|lease{$_[0]}" }

my $hour = 3_600_000;
my $qstart = int($T0 / $hour) * $hour;    # the hour T0 is in
my $qend = $qstart + $hour;

# Per algorithm: the zone (limit 20), what the key holds as text, and per step
# the expected reply.  Estimate 10 at t=0, settled at 3 (G of 7); estimate 10 at
# t=10, settled at 25 (C of 15): 3 + 10 + 15 = 28 counted, over the limit of 20.
my %case = (
    l => {
        zone => [20, 1000], show => \&zscores, token => sub { m0($_[0]) },
        placed => 'm@0,m@0,m@0,m@0,m@0,m@0,m@0,m@0,m@0,m@0', first => '1 | 1 10 1000 10 0',
        back => '1 1 17 1', left => 'm@0,m@0,m@0', second => '1 | 1 7 990 10 0',
        charge => '1 1 0 1',
        charged => 'm@0,m@0,m@0,m@10,m@10,m@10,m@10,m@10,m@10,m@10,m@10,m@10,m@10'
            . ',a@20,a@20,a@20,a@20,a@20,a@20,a@20,a@20,a@20,a@20,a@20,a@20,a@20,a@20,a@20',
        # 28 in the window: one unit fits once 28 + 1 - 20 = 9 have left: the 9th
        # oldest, of t=10, leaves at 1010.
        next => '0 | 0 0 980',
    },
    p => {
        zone => [20, 1000], show => \&entries, token => sub { $T0 + $_[0] },
        placed => '0,0,0,0,0,0,0,0,0,0', first => '1 | 1 10 1000 10 0',
        back => '1 1 17 1', left => '0,0,0', second => '1 | 1 7 990 10 0',
        charge => '1 1 0 1',
        charged => '0,0,0,10,10,10,10,10,10,10,10,10,10,20,20,20,20,20,20,20,20,20,20,20,20,20,20,20',
        next => '0 | 0 0 980',
    },
    c => {
        # T0 is bucket 10000 (16 mod 256), elapsed 0.
        zone => [20, 1000], show => \&counter_value, token => sub { 10000 },
        # One unit more once the 10 weigh 9 in the next bucket: t = 1100.
        placed => '16:10:0', first => '1 | 1 10 1100 10 0',
        # 13 weigh 12 at 77 ms into the next bucket: t = 1077.
        back => '1 1 17 1', left => '16:3:0', second => '1 | 1 7 1067 10 0',
        charge => '1 1 0 1', charged => '16:28:0',
        # At t=30: 28 + 1 fits in the next bucket once 28 (1000 - e) / 1000 <= 19:
        # e = 322 (28 * 678 = 18984), t = 1322.
        next => '0 | 0 0 1292',
    },
    g => {
        # 20 per 1000 ms: T = 50 ms; burst 20.
        # The token is the TAT left: 500 after the first, 150 + 500 after the second.
        zone => [20, 1000, 20], show => sub { gcra_value($_[0], 20) },
        token => sub { gtok($_[0] ? 650 : 500, 20) },
        placed => ($T0 + 500) . '+0/20', first => '1 | 1 10 50 10 0',
        # At t=10 the TAT is 640 ms ahead: 12.8 units, 7 left; one more once it is
        # 12 units (600 ms) ahead: t = 50.
        back => '1 1 0 1', left => ($T0 + 150) . '+0/20', second => '1 | 1 7 40 10 0',
        charge => '1 1 0 1', charged => ($T0 + 1400) . '+0/20',
        # TAT 1400 + 50 must be within 1000 of the instant: t = 450.
        next => '0 | 0 0 420',
    },
    q => {
        zone => [20, 14401], show => \&quota_value, token => sub { $qstart },
        placed => "$qstart:10", first => '1 | 1 10 ' . ($qend - $T0) . ' 10 0',
        back => '1 1 17 1', left => "$qstart:3", second => '1 | 1 7 ' . ($qend - $T0 - 10) . ' 10 0',
        charge => '1 1 0 1', charged => "$qstart:28",
        next => '0 | 0 0 ' . ($qend - $T0 - 30),
    },
    b => {
        # A missing balance starts at 20 (burst); limit and window name nothing.
        zone => [1, 1, 20], show => sub { redis_cmd('GET', $_[0]) }, token => sub { 0 },
        placed => '10', first => '1 | 1 10 0 10 0',
        back => '1 1 17 1', left => '17', second => '1 | 1 7 0 10 0',
        charge => '1 1 0 1', charged => '-8',
        next => '0 | 0 0 0',
    },
);

for my $alg (qw(l p c g q b)) {
    my $c = $case{$alg};
    my $k = "rl:settle:$alg";
    my ($limit, $w, $burst) = (@{ $c->{zone} }, 0);
    $burst = $c->{zone}[2] // 0;
    my $tok = $c->{token}->(0);
    is(dec(0, [$k, "$alg!", $limit, $w, 10, $burst]), "$c->{first} $tok", "$alg: placed at once");
    my $rid = $RID{$k};
    is($c->{show}->($k), $c->{placed}, "$alg: the key holds the placement");
    is(redis_cmd('ZSCORE', ledger($k), $rid), $T0 + $HORIZON, "$alg: its ledger entry, for an hour");
    my $pttl = redis_cmd('PTTL', ledger($k));
    ok($pttl > $HORIZON - 1000 && $pttl <= $HORIZON, "$alg: the ledger lives as long ($pttl)");
    # Settled at 3: 7 back.  Sliding log: the members from the token on.
    my $back_tok = $alg eq 'l' ? m0(0) + 3 : $tok;
    $back_tok = sprintf '%.0f', $back_tok;
    is(op(5, $k, "G$alg$rid", $limit, $w, 7, $back_tok), $c->{back}, "$alg: a partial give-back");
    is($c->{show}->($k), $c->{left}, "$alg: 3 left");
    # g: the TAT left was 500: back by 7 units, 150.
    is(dec(10, [$k, "$alg!", $limit, $w, 10, $burst]), "$c->{second} " . $c->{token}->(10),
        "$alg: the next placement");
    $rid = $RID{$k};
    is(op(20, $k, "C$alg$rid", $limit, $w, 15, $burst), $c->{charge}, "$alg: a charge of 15, past the limit");
    is($c->{show}->($k), $c->{charged}, "$alg: the excess counted at settle time");
    my $before = snapshot($k, ledger($k));
    is(op(25, $k, "C$alg$rid", $limit, $w, 15, $burst), '1 1 0 0', "$alg: the same charge again: not of the ledger");
    is(snapshot($k, ledger($k)), $before, "$alg: ... writing nothing");
    is(dec(30, [$k, $alg, $limit, $w, 1, $burst]), $c->{next}, "$alg: the next decision rejected, honest reset");
    # A rejected "!" zone: its four more fields 0, nothing written.
    $before = snapshot($k, ledger($k));
    is(dec(30, [$k, "$alg!", $limit, $w, 1, $burst]), "$c->{next} 0 0 0", "$alg: a rejected placement");
    is(snapshot($k, ledger($k)), $before, "$alg: ... writing nothing");
}

######################################################################
# "^" (issue 34, zones on several backends): the same placement, its ledger entry
# kept for the grace only; given back whole when another backend refuses.
my $GRACE = 10_000;
my %empty = (l => 'gone', p => 'gone', c => '16:0:0', g => 'gone', q => "$qstart:0", b => '20');
for my $alg (qw(l p c g q b)) {
    my $c = $case{$alg};
    my $k = "rl:undo:$alg";
    my ($limit, $w) = @{ $c->{zone} };
    my $burst = $c->{zone}[2] // 0;
    my $tok = $c->{token}->(0);
    is(dec(0, [$k, "$alg^", $limit, $w, 10, $burst]), "$c->{first} $tok", "$alg^: placed at once");
    my $rid = $RID{$k};
    is($c->{show}->($k), $c->{placed}, "$alg^: the key holds the placement");
    is(redis_cmd('ZSCORE', ledger($k), $rid), $T0 + $GRACE, "$alg^: its ledger entry, for the grace only");
    my $back = $alg eq 'g' ? '1 1 0 1' : "1 1 $limit 1";
    $back = '1 1 20 1' if $alg eq 'b';
    is(op(5, $k, "G$alg$rid", $limit, $w, 10, sprintf('%.0f', $tok)), $back, "$alg^: given back whole");
    is(redis_cmd('EXISTS', $k) ? $c->{show}->($k) : 'gone', $empty{$alg}, "$alg^: nothing left counted");
    my $before = snapshot($k, ledger($k));
    is(op(6, $k, "G$alg$rid", $limit, $w, 10, sprintf('%.0f', $tok)), '1 1 0 0',
        "$alg^: the same give-back again: not of the ledger ...");
    is(snapshot($k, ledger($k)), $before, "$alg^: ... writing nothing");
}
for my $f ('r^', 'n^', 'B^', 'l+50:1000^', 'c^!', 'c!^', 'l^^', '^', 'g~0^') {
    my $r = decide_raw(['rl:undo:bad'], $T0, $f, 10, 1000, 1, 1);
    is(show($r, ['rl:undo:bad', $f]), 'ERR:ERR ratelimit: bad arguments for zone 1', "bad: $f");
}
is(redis_cmd('EXISTS', 'rl:undo:bad'), 0, 'bad: nothing written');

######################################################################
# A balance charged below zero refuses every cost until topped up past it.
{
    my $k = 'rl:settle:b';
    is(verdict(decide($T0 + 40, [$k, 'b', 1, 1, 0, 20])), '1 | 1 0 0', 'b: a read is ok');
    is(op(40, $k, 'B', 1, 2, 5, 0), '1 1 0 0', 'b: +5: -3');
    is(verdict(decide($T0 + 40, [$k, 'b', 1, 1, 1, 20])), '0 | 0 0 0', 'b: still refused');
    is(redis_cmd('INCRBY', $k, 10), 7, 'b: INCRBY 10: 7');
    is(verdict(decide($T0 + 40, [$k, 'b', 1, 1, 1, 20])), '1 | 1 6 0', 'b: admitted again');
}

######################################################################
# A charge of a balance's placement whose key went missing without a new life
# starts from the default, as a decision would read it.
{
    my $k = 'rl:settle:bm';
    is(dec(0, [$k, 'b!', 1, 1, 5, 20]), '1 | 1 15 0 5 0 0', 'b: placed');
    redis_cmd('DEL', $k);
    is(op(1, $k, "Cb$RID{$k}", 1, 1, 3, 20), '1 1 17 1', 'b: a charge on the missing key: the default less 3');
    is(redis_cmd('GET', $k), '17', 'b: written');
    # A give-back on a missing balance writes nothing, as ever: a deleted balance was reset.
    is(dec(2, [$k, 'b!', 1, 1, 5, 20]), '1 | 1 12 0 5 0 0', 'b: placed again');
    redis_cmd('DEL', $k);
    is(op(3, $k, "Gb$RID{$k}", 1, 1, 5, 0), '1 1 0 1', 'b: a give-back on the missing key');
    is(redis_cmd('EXISTS', $k), 0, 'b: ... writes nothing');
}

######################################################################
# A reset, then a new life: a give-back or a charge of the old one writes nothing.
for my $alg (qw(l p c g q b)) {
    my $c = $case{$alg};
    my $k = "rl:settle:old$alg";
    my ($limit, $w) = @{ $c->{zone} };
    my $burst = $c->{zone}[2] // 0;
    is(dec(0, [$k, "$alg!", $limit, $w, 5, $burst]) =~ /^1 \| 1 15 \d+ 5 0 \d+$/ ? 'placed' : 'not',
        'placed', "$alg: placed in the old life");
    my ($rid, $tok) = ($RID{$k}, $c->{token}->(0));
    $tok = $alg eq 'g' ? gtok(250, 20) : $tok;
    redis_cmd('DEL', $k);
    like(dec(100, [$k, "$alg!", $limit, $w, 1, $burst]), qr/^1 \| 1 19 \d+ 1 0 \d+$/, "$alg: a new life");
    my $before = snapshot($k, ledger($k));
    is(op(110, $k, "G$alg$rid", $limit, $w, 5, $tok), '1 1 0 0', "$alg: the old life's give-back: r 0");
    is(op(120, $k, "C$alg$rid", $limit, $w, 5, $burst) =~ /^1 1 19 0$/ ? 'nothing' : 'wrote', 'nothing',
        "$alg: the old life's charge: r 0");
    is(snapshot($k, ledger($k)), $before, "$alg: ... writing nothing");
}

######################################################################
# A DEL of the key alone leaves its ledger; the old life's charge coming first re-creates the key
# and starts its new life: another placement of the old life gives nothing back into it.
for my $alg (qw(l p c g q b)) {
    my $c = $case{$alg};
    my $k = "rl:settle:first$alg";
    my ($limit, $w) = @{ $c->{zone} };
    my $burst = $c->{zone}[2] // 0;
    dec(0, [$k, "$alg!", $limit, $w, 5, $burst]);
    my ($rid, $tok) = ($RID{$k}, $alg eq 'g' ? gtok(250, 20) : $c->{token}->(0));
    dec(1, [$k, "$alg!", $limit, $w, 1, $burst]);
    my $charged = $RID{$k};
    redis_cmd('DEL', $k);
    like(op(10, $k, "C$alg$charged", $limit, $w, 2, $burst), qr/^1 1 \d+ 1$/,
        "$alg: after a DEL, the old life's charge writes");
    is(redis_cmd('EXISTS', ledger($k)), 0, "$alg: ... and starts a new life");
    my $before = snapshot($k);
    like(op(20, $k, "G$alg$rid", $limit, $w, 5, $tok), qr/^1 1 \d+ 0$/,
        "$alg: another placement of the old life: r 0");
    is(snapshot($k), $before, "$alg: ... writing nothing");
}

######################################################################
# "!" with "~": a delayed decision places at T as it does; its ledger entry
# lasts as a placement's.  Settled by G and by C.
{
    my $k = 'rl:settle:dg';
    my @z = ([$k, 'g~5000!', 10, 1000, 1, 1]);
    is(dec(0, @z), '1 | 1 0 100 1 0 ' . gtok(100, 10), 'g~!: at once, placed at now');
    my $rid0 = $RID{$k};
    is(dec(0, @z), '2 | 1 0 200 1 100 ' . gtok(200, 10), 'g~!: delayed 100');
    my $rid1 = $RID{$k};
    is(redis_cmd('ZSCORE', ledger($k), $rid1), $T0 + 100 + $HORIZON, 'g~!: its ledger entry, T + an hour');
    is(dec(0, @z), '2 | 1 0 300 1 200 ' . gtok(300, 10), 'g~!: delayed 200');
    my $rid2 = $RID{$k};
    # The last one settles at 0: its place back.
    is(op(10, $k, "Gg$rid2", 10, 1000, 1, gtok(300, 10)), '1 1 0 1', 'g~!: the last settled at 0');
    is(gcra_value($k, 10), ($T0 + 200) . '+0/10', 'g~!: its place returned');
    # The delayed one settles at 3: 2 more, after the TAT.
    is(op(20, $k, "Cg$rid1", 10, 1000, 2, 1), '1 1 0 1', 'g~!: the delayed one charged 2');
    is(gcra_value($k, 10), ($T0 + 400) . '+0/10', 'g~!: counted after the TAT');
    is(op(30, $k, "Cg$rid0", 10, 1000, 1, 1), '1 1 0 1', 'g~!: the first charged 1');
    is(gcra_value($k, 10), ($T0 + 500) . '+0/10', 'g~!: counted');

    my $l = 'rl:settle:dl';
    is(dec(0, [$l, 'l~5000!', 1, 1000]), '1 | 1 0 1000 1 0 ' . m0(0), 'l~!: at once, placed at now');
    is(dec(100, [$l, 'l~5000!', 1, 1000]), '2 | 1 0 1900 1 900 ' . m0(100), 'l~!: delayed to 1000');
    is(op(200, $l, "Cl$RID{$l}", 1, 1000, 2, 0), '1 1 0 1', 'l~!: the delayed one charged 2 at settle time');
    is(zscores($l), 'm@0,a@200,a@200,m@1000', 'l~!: its excess counted at t=200');
    my $pttl = redis_cmd('PTTL', $l);
    ok($pttl > 1700 && $pttl <= 1800, "l~!: the key lives until the delayed entry leaves ($pttl)");
}

######################################################################
# Zones with and without "!" in one decision; cost 0; a key without a ledger.
{
    my ($c, $l) = ('rl:settle:mc', 'rl:settle:ml');
    # c: one unit more once the 3 weigh 2 in the next bucket: t = 1334.
    is(dec(0, [$c, 'c!', 10, 1000, 3], [$l, 'l', 10, 1000, 1]), '1 | 1 7 1334 3 0 10000 | 1 9 1000',
        'mixed: one zone places, the other admits');
    is(counter_value($c), '16:3:0', 'mixed: the placement');
    is(zscores($l), 'a@0', 'mixed: the plain entry');
    is(dec(0, [$c, 'c!', 10, 1000, 0]), '1 | 1 7 1334 0 0 0', 'cost 0: nothing placed');
    like(dec(0, ['rl:settle:same', 'c!', 10, 1000, 1], ['rl:settle:same', 'c', 10, 1000, 1]), qr/^1 \| /,
        'one key, with and without "!": the same algorithm');
    is(counter_value($c), '16:3:0', 'cost 0: ... nor written');
    my $b = 'rl:settle:{brace';
    my $r = decide_raw([$b], $T0, 'g!', 10, 1000, 1, 5);
    is(ref $r ? "@$r" : $r, '1 1 4 100 1 0 ' . gtok(100, 10) . ' 0', 'no ledger: placed, rid 0');
    is(gcra_value($b, 10), ($T0 + 100) . '+0/10', 'no ledger: written');
}

######################################################################
# A lease granted after a placement never shortens the ledger the placement needs.
{
    my $k = 'rl:settle:lease';
    like(dec(0, [$k, 'c!', 100, 1000, 1]), qr/^1 \| 1 99 /, 'lease: a placement');
    # The grant moves to the next bucket (now + 1000), the placement weighed in full there.
    is(dec(0, [$k, 'c+8:1000', 100, 1000, 1]), '1 | 1 90 2000 8 1000 10001', 'lease: then a grant');
    my $pttl = redis_cmd('PTTL', ledger($k));
    ok($pttl > $HORIZON - 1000, "lease: the ledger still lives an hour ($pttl)");
}

######################################################################
# Bad arguments.
{
    my $bad = 'ERR:ERR ratelimit: bad arguments for zone 1';
    for my $f ('r!', 'n!', 'B!', 'D!', 'l+50:1000!', 'b~0!', 'l!~0', '!', 'c!!', 'Gl123!', 'Cl123!', 'V1!',
        'Cl', 'Cr123', 'Cn123', 'CB123') {
        my $r = decide_raw(['rl:settle:bad'], $T0, $f, 10, 1000, 1, 1);
        is(show($r, ['rl:settle:bad', $f]), $bad, "bad: $f");
    }
    is(op(0, 'rl:settle:bad', 'Cl123', 10, 1000, 0, 0), $bad, 'bad: a charge of 0');
    is(op(0, 'rl:settle:bad', 'Cl123', 10, 1000, 1000000001, 0), $bad, 'bad: a charge above 10^9');
    is(op(0, 'rl:settle:bad', 'Cg123', 10, 1000, 1, 0), $bad, 'bad: a gcra charge without its burst');
    is(redis_cmd('EXISTS', 'rl:settle:bad'), 0, 'bad: nothing written');
}

done_testing();

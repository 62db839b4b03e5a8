# Reservations (leases, issue 20) in the decision script, run directly against
# a real redis-server with an injected clock (no nginx).  The protocol is the
# script's header comment; in short:
#   a reserve zone sends "<letter>+<want>:<lease_ms>" as its algorithm and
#   answers 7 fields: ok remaining reset_ms granted lease_ms token rid
#   granted = min(want, floor(room / 4)), room = what the zone admits after this
#   request's cost; 0 when the decision is rejected or room < 4; rid names the
#   reservation in the key's ledger (shown here only as 0 or not)
#   a give-back "G<letter><rid>" (cost = units, burst = token) answers
#   1 | 1 remaining 1, or 1 | 1 0 0 having written nothing when rid is not of the
#   key's present life (a reset emptied the ledger, or it was given back already)
#   a check "V<rid>" answers 1 | 1 1 0 when rid is of the key's life (the key exists
#   and rid is in its ledger), else 1 | 1 0 0
# Expectations are literals worked out by hand; t below is the offset from T0.
use lib 't/lib';
use RLTest;
use RLTest::Script qw(:all);
use Time::Local qw(timegm);
use Time::HiRes qw(sleep);

my $R = 2**52;    # reserved sliding_log members start here (plus the clock in µs)

# A reply as "allowed | ok remaining reset [granted lease token] | ...", a
# reserve zone (a field with "+") answering 7 fields, of which the rid is kept
# in %RID by key (@KEYS, when the caller names them) and not shown: it comes
# from Redis's clock.
our (@KEYS, %RID);
sub show {
    my ($r, @fields) = @_;
    my $rid = sub { $RID{ $KEYS[$_[0]] } = $_[1] if defined $KEYS[$_[0]] };
    return zone_fields($r, [map { /\+/ ? 7 : 3 } @fields], $rid);
}

# One decision: zones [key, field, limit, window, cost (1), burst (0)].
sub dec {
    my ($now, @z) = @_;
    my @zz = map { [$_->[0], $_->[1], $_->[2], $_->[3], $_->[4] // 1, $_->[5] // 0] } @z;
    my $r = decide_raw([map { $_->[0] } @zz], $now, map { @$_[1 .. 5] } @zz);
    local @KEYS = map { $_->[0] } @zz;
    return show($r, map { $_->[1] } @zz);
}

# The key's ledger, as the script names it.
sub ledger_of {
    my ($key) = @_;
    return "$key|lease" if $key =~ /^[^{]*\{[^}]+\}/;
    return undef if $key =~ /[{}]/;
    return "$key|lease{$key}";
}

# A give-back: G<letter>, limit, window, units, token; of a reservation entered
# in the key's ledger for it (as if granted in the key's present life), so that
# it tests what the algorithm returns.
my $next_rid = 1;
sub give {
    my ($now, $key, $g, $limit, $w, $u, $token) = @_;
    my $rid = $next_rid++;
    redis_cmd('ZADD', ledger_of($key), $now + 60_000, $rid);
    return show(decide_raw([$key], $now, "$g$rid", $limit, $w, $u, $token), $g);
}

# A give-back of the key's last grant (or of $rid): what the ledger allows.
sub give_of {
    my ($now, $key, $g, $limit, $w, $u, $token, $rid) = @_;
    $rid //= $RID{$key} // 0;
    return show(decide_raw([$key], $now, "$g$rid", $limit, $w, $u, $token), $g);
}

# A check of the key's last grant.
sub check_rid {
    my ($key, $rid) = @_;
    return show(decide_raw([$key], 0, 'V' . ($rid // $RID{$key} // 0), 1, 1, 0, 0), 'V');
}

sub zscores {
    my $v = redis_cmd('ZRANGE', $_[0], 0, -1, 'WITHSCORES');
    my @p;
    push @p, "$v->[2*$_]\@$v->[2*$_+1]" for 0 .. $#$v / 2;
    return join ',', @p;
}

sub entries {
    my $v = redis_cmd('GET', $_[0]);
    return 'none' unless defined $v;
    return join ',', map { unpack 'Q<', substr($v, 6 * $_, 6) . "\0\0" } 0 .. length($v) / 6 - 1;
}

sub pttl_in {
    my ($key, $lo, $hi, $name) = @_;
    my $t = redis_cmd('PTTL', $key);
    ok($t > $lo && $t <= $hi, "$name: PTTL $t in ($lo, $hi]");
}

# The members of a reservation made at clock $now (ms) with a gateway clock, when
# nothing in the set is above them: 2^52 + now in µs.
sub m0 { sprintf '%.0f', $R + $_[0] * 1000 }

######################################################################
# Sliding log ("l").
for my $T0 (10_000_000, 1_700_000_000_000) {
    my $tag = "T0=$T0";
    my $k = "rl:lease:l$T0";
    my $m = m0($T0);
    # limit 20, window 1000, lease 500: cost 1 at t=0, room 19, 4 granted.
    is(dec($T0, [$k, 'l+8:500', 20, 1000]), "1 | 1 15 1000 4 500 $m", "$tag l: 4 of 8 granted");
    is(zscores($k), join(',', ($T0 * 1000) . "\@$T0", map { ($m + $_) . '@' . ($T0 + 500) } 0 .. 3),
        "$tag l: the cost at t, the 4 reserved members consecutive, scored t + lease");
    pttl_in($k, 1000, 1500, "$tag l: window + lease");
    # Remaining excludes the grant: a read sees 15, counting the future scores.
    is(dec($T0 + 10, [$k, 'l', 20, 1000, 0]), '1 | 1 15 990', "$tag l: a plain read counts them");
    # Give back half (2 spent: the holder sends m0 + 2).
    is(give($T0 + 100, $k, 'Gl', 20, 1000, 2, $m + 2), '1 | 1 17 1', "$tag l: 2 given back");
    is(zscores($k), join(',', ($T0 * 1000) . "\@$T0", map { ($m + $_) . '@' . ($T0 + 500) } 0 .. 1),
        "$tag l: the last two members removed");
    # The rest lapses: counted until r + L + W, i.e. at t = 1499, gone at t = 1500.
    is(dec($T0 + 1000, [$k, 'l+0:500', 20, 1000, 0]), '1 | 1 18 500 0 0 0',
        "$tag l: the cost entry left at t=1000, the 2 reserved still count");
    is(dec($T0 + 1499, [$k, 'l+0:500', 20, 1000, 0]), '1 | 1 18 1 0 0 0', "$tag l: still at r+L+W-1");
    is(dec($T0 + 1500, [$k, 'l+0:500', 20, 1000, 0]), '1 | 1 20 0 0 0 0', "$tag l: gone at r+L+W");
    # A give-back after they lapsed, then after a reset, writes nothing.
    is(give($T0 + 1500, $k, 'Gl', 20, 1000, 2, $m), '1 | 1 20 1', "$tag l: a give-back of lapsed units");
    redis_cmd('DEL', $k);
    is(give($T0 + 1600, $k, 'Gl', 20, 1000, 2, $m), '1 | 1 20 1', "$tag l: a give-back after a reset");
    is(redis_cmd('EXISTS', $k), 0, "$tag l: ... creates nothing");

    # The grant shrinks with the room: floor(room / 4), 0 when room < 4; a rejected
    # decision reserves nothing.
    my $s = "rl:lease:ls$T0";
    my @want = ([$s, 'l+100:300', 20, 1000]);
    my @exp = ([15, 4], [11, 3], [8, 2], [6, 1], [4, 1], [3, 0], [2, 0], [1, 0], [0, 0]);
    my $next = m0($T0 + 50);
    for my $e (@exp) {
        my ($rem, $g) = @$e;
        my $tok = $g ? $next : 0;
        is(dec($T0 + 50, @want), "1 | 1 $rem 1000 $g " . ($g ? 300 : 0) . " $tok",
            "$tag l: room " . ($rem + $g) . ": $g granted");
        $next += $g;
    }
    is(dec($T0 + 50, @want), '0 | 0 0 1000 0 0 0', "$tag l: full: rejected, nothing granted");
    is(redis_cmd('ZCARD', $s), 20, "$tag l: 9 admissions + 11 reserved units");
    # A rejection by another zone of the decision reserves nothing.
    my $o = "rl:lease:lo$T0";
    my $before = snapshot($o, "$o:g");
    is(dec($T0, [$o, 'l+8:500', 20, 1000], ["$o:g", 'g', 1, 1000, 2, 1]),
        '0 | 1 20 0 0 0 0 | 0 1 1000', "$tag l: the other zone rejects: nothing granted");
    is(snapshot($o, "$o:g"), $before, "$tag l: and nothing written");
}

# Members taken: the block goes after the entry scored last, and when a member of
# the block is already there (another gateway's), a further block is tried; the
# first try leaves nothing behind.
{
    my $T0 = 10_000_000;
    my $k = 'rl:lease:lcoll';
    my $m = m0($T0);
    redis_cmd('ZADD', $k, $T0 - 100, $m + 2, $T0 + 900, 5);
    # used 2, room 38: 9 granted; the entry scored last is "5", below 2^52: the block
    # starts at 2^52 + the clock, meets the other member, and moves on by 9.
    is(dec($T0, [$k, 'l+100:500', 40, 1000, 0]), '1 | 1 29 900 9 500 ' . ($m + 9),
        'l: a member of the block taken: the next block');
    is(redis_cmd('ZCOUNT', $k, '-inf', '-inf'), 0, 'l: no member left at -inf');
    is(redis_cmd('ZSCORE', $k, $m + 2), $T0 - 100, 'l: the other member keeps its score');
    is(redis_cmd('ZCOUNT', $k, $T0 + 500, $T0 + 500), 9, 'l: 9 reserved');
    # A ms later, with "5" still scored last: from that clock's own members.
    is(dec($T0 + 1, [$k, 'l+100:500', 40, 1000, 0]), '1 | 1 22 899 7 500 ' . ($m + 1000),
        'l: the next reservation from its own clock');
}

# clock=redis: reservations in one call get distinct blocks.
{
    my $k = 'rl:lease:lredis';
    my $r = batch_raw(map { [[$k], '', 'l+10:1000', 100, 60000, 1, 0] } 1 .. 3);
    my @tok = map { $_->[6] } @$r;
    is(join(' ', map { $_->[4] } @$r), '10 10 10', 'clock=redis: 10 granted each');
    ok($tok[1] == $tok[0] + 10 && $tok[2] == $tok[1] + 10, "clock=redis: consecutive blocks (@tok)");
    ok($tok[0] >= $R, 'clock=redis: reserved members from 2^52');
    is(redis_cmd('ZCARD', $k), 33, 'clock=redis: 3 admissions + 30 reserved');
}

######################################################################
# Packed log ("p"): the same numbers as "l"; the token is the score, now + lease.
for my $T0 (10_000_000, 1_700_000_000_000) {
    my $tag = "T0=$T0";
    my $k = "rl:lease:p$T0";
    my $e = $T0 + 500;
    is(dec($T0, [$k, 'p+8:500', 20, 1000]), "1 | 1 15 1000 4 500 $e", "$tag p: 4 of 8 granted");
    is(entries($k), join(',', $T0, ($e) x 4), "$tag p: the cost at t, 4 entries at t + lease");
    pttl_in($k, 1000, 1500, "$tag p: window + lease");
    # A later admission at t=100 goes before the reserved entries.
    is(dec($T0 + 100, [$k, 'p+0:500', 20, 1000]), '1 | 1 14 900 0 0 0', "$tag p: want 0: exact");
    is(entries($k), join(',', $T0, $T0 + 100, ($e) x 4), "$tag p: sorted");
    pttl_in($k, 1000, 1500, "$tag p: want 0 still keeps window + lease");
    is(give($T0 + 200, $k, 'Gp', 20, 1000, 2, $e), '1 | 1 16 1', "$tag p: 2 given back");
    is(entries($k), join(',', $T0, $T0 + 100, ($e) x 2), "$tag p: two entries of the token gone");
    is(give($T0 + 200, $k, 'Gp', 20, 1000, 5, $e), '1 | 1 18 1', "$tag p: at most what is there");
    is(give($T0 + 200, $k, 'Gp', 20, 1000, 1, $e), '1 | 1 18 1', "$tag p: none left: nothing");
    pttl_in($k, 1000, 1500, "$tag p: the TTL is kept");

    my $s = "rl:lease:ps$T0";
    my @want = ([$s, 'p+100:300', 20, 1000]);
    for my $x ([15, 4], [11, 3], [8, 2], [6, 1], [4, 1], [3, 0], [2, 0], [1, 0], [0, 0]) {
        my ($rem, $g) = @$x;
        is(dec($T0 + 50, @want), "1 | 1 $rem 1000 $g " . ($g ? 300 : 0) . ' ' . ($g ? $T0 + 350 : 0),
            "$tag p: room " . ($rem + $g) . ": $g granted");
    }
    is(dec($T0 + 50, @want), '0 | 0 0 1000 0 0 0', "$tag p: full: rejected");
    # Lapse at r + L + W: the 11 reserved entries scored 350 count at 1349, not at 1350.
    is(dec($T0 + 1349, [$s, 'p', 20, 1000, 0]), '1 | 1 9 1', "$tag p: reserved count at r+L+W-1");
    is(dec($T0 + 1350, [$s, 'p', 20, 1000, 0]), '1 | 1 20 0', "$tag p: gone at r+L+W");
    redis_cmd('DEL', $s);
    is(give($T0 + 1400, $s, 'Gp', 20, 1000, 2, $T0 + 350), '1 | 1 20 1', "$tag p: give-back after a reset");
    is(redis_cmd('EXISTS', $s), 0, "$tag p: ... creates nothing");
}

######################################################################
# Sliding counter ("c"): limit 100, window 1000; the units go to the bucket of
# now + lease, the token is its absolute index.
{
    my $T0 = 10_000_000;
    my $I = $T0 / 1000;
    my $S = $I % 256;
    my $k = 'rl:lease:c';
    # t=100, lease 400: the bucket of 500 is this one. room 99: 10 granted (want 10).
    is(dec($T0 + 100, [$k, 'c+10:400', 100, 1000]), "1 | 1 89 991 10 400 $I", 'c: same bucket');
    is(counter_value($k), "$S:11:0", 'c: cost + grant in the current bucket');
    pttl_in($k, 1400, 1900, 'c: to the end of the bucket after the one written');
    # t=700: the bucket of 1100 is the next one. room 88: 10 granted; the state moves
    # on: (next, 1 + 10, previous = 11 + 0 weighted). Reset: from t=1000 the estimate
    # 11*(1000-e)/1000 + 11 is 21 at e=91.
    is(dec($T0 + 700, [$k, 'c+10:400', 100, 1000]), '1 | 1 78 391 10 400 ' . ($I + 1),
        'c: into the next bucket');
    is(counter_value($k), ($S + 1) . ':11:11', 'c: written as the next bucket');
    pttl_in($k, 1900, 2300, 'c: to the end of the bucket after the next (plain: 2w - e = 1300)');
    # Estimates made before that bucket starts count it (and the previous) in full.
    is(dec($T0 + 999, [$k, 'c', 100, 1000, 0]), '1 | 1 78 91', 'c: a plain read at t=999 counts 22');
    is(dec($T0 + 1000, [$k, 'c', 100, 1000, 0]), '1 | 1 78 91', 'c: and at the bucket start');
    # e=500: 11 * 1/2 rounded up + 11 = 17; one more at 11*(1000-e)/1000 <= 5, e=546.
    is(dec($T0 + 1500, [$k, 'c', 100, 1000, 0]), '1 | 1 83 46', 'c: then the previous one weighs');
    # Give-backs: the first reservation's bucket is now the previous one.
    is(give($T0 + 1500, $k, 'Gc', 100, 1000, 5, $I), '1 | 1 86 1', 'c: give back 5 to the previous bucket');
    is(counter_value($k), ($S + 1) . ':11:6', 'c: previous 11 - 5');
    is(give($T0 + 1500, $k, 'Gc', 100, 1000, 5, $I + 1), '1 | 1 91 1', 'c: give back 5 to the current one');
    is(counter_value($k), ($S + 1) . ':6:6', 'c: current 11 - 5');
    is(give($T0 + 1500, $k, 'Gc', 100, 1000, 50, $I + 1), '1 | 1 97 1', 'c: never below zero');
    is(counter_value($k), ($S + 1) . ':0:6', 'c: current 0');
    my $before = snapshot($k);
    is(give($T0 + 1500, $k, 'Gc', 100, 1000, 5, $I - 1), '1 | 1 97 1', 'c: another bucket: nothing');
    is(snapshot($k), $before, 'c: unchanged');
    pttl_in($k, 1000, 2300, 'c: give-backs keep the TTL');
    redis_cmd('DEL', $k);
    is(give($T0 + 1500, $k, 'Gc', 100, 1000, 5, $I + 1), '1 | 1 100 1', 'c: give-back after a reset');
    is(redis_cmd('EXISTS', $k), 0, 'c: ... creates nothing');

    # The previous bucket's weighted share is kept when the state moves on early:
    # 40 in bucket I, then at t=1500 (weight 1/2: 20) a reservation into bucket I+2.
    my $f = 'rl:lease:cfold';
    is(dec($T0, [$f, 'c', 100, 1000, 40]), '1 | 1 60 1025', 'c fold: 40 in bucket I');
    is(dec($T0 + 1500, [$f, 'c+50:600', 100, 1000]), '1 | 1 60 550 19 600 ' . ($I + 2),
        'c fold: room 79, 19 granted into bucket I+2');
    is(counter_value($f), ($S + 2) . ':20:20', 'c fold: previous = 0 + the 20 still weighted');
    # At t=1600 the audit estimate of bucket I alone is 16: a plain read must not see
    # 80 left (it would with previous = the current count, 0).
    # (A plain zone counts its reset from the start of a bucket ahead, as for a clock ahead.)
    is(dec($T0 + 1600, [$f, 'c', 100, 1000, 0]), '1 | 1 60 50', 'c fold: 40 counted before I+2 starts');
    is(dec($T0 + 1600, [$f, 'c+0:600', 100, 1000, 0]), '1 | 1 60 450 0 0 0',
        'c fold: a reserve zone counts it from now');
    is(dec($T0 + 2500, [$f, 'c', 100, 1000, 0]), '1 | 1 70 50', 'c fold: then 20 * 1/2 + 20');

    # Boundaries: lease = window at a bucket start lands in the next bucket; a
    # lease above the window is capped at it; want 0 writes where a plain one does.
    my $b = 'rl:lease:cb';
    # 5 in bucket I+1 from t=1000; one more once 5*(1000-e)/1000 <= 4 in I+2: t=2200.
    is(dec($T0, [$b, 'c+4:1000', 100, 1000]), '1 | 1 95 2200 4 1000 ' . ($I + 1), 'c: lease = window');
    is(counter_value($b), ($S + 1) . ':5:0', 'c: the next bucket');
    is(dec($T0 + 10, [$b, 'c+4:5000', 100, 1000]), '1 | 1 90 2090 4 1000 ' . ($I + 1),
        'c: lease capped at the window');
    is(dec($T0 + 20, [$b, 'c+0:1000', 100, 1000]), '1 | 1 89 2071 0 0 0', 'c: want 0');
    is(counter_value($b), ($S + 1) . ':11:0', 'c: counted in the bucket the key holds');
    # Grant shrinks with the room; 0 when room < 4.
    my $g = 'rl:lease:cg';
    is(dec($T0, [$g, 'c', 10, 1000, 4]), '1 | 1 6 1250', 'c: 4 taken');
    is(dec($T0, [$g, 'c+9:100', 10, 1000]), '1 | 1 4 1167 1 100 ' . $I, 'c: room 5: 1');
    is(dec($T0, [$g, 'c+9:100', 10, 1000]), '1 | 1 3 1143 0 0 0', 'c: room 3: 0');
    is(dec($T0, [$g, 'c+9:100', 10, 1000, 4]), '0 | 0 3 1143 0 0 0', 'c: rejected: 0');
    is(counter_value($g), "$S:7:0", 'c: the rejection wrote nothing');
}

######################################################################
# GCRA ("g"): limit 10 per 1000 ms (T = 100).
{
    my $T0 = 10_000_000;
    my $tok = sub { my ($ms, $r, $limit) = @_; ($ms % 4194304) * $limit + $r + 1 };
    my $k = 'rl:lease:g';
    # burst 40: cost 1 at t=0 (TAT 100), the grant counted as arriving at t=300:
    # room (0 + 4000 - 300) / 100 = 37, 9 granted; TAT' = 300 + 900 = 1200.
    is(dec($T0, [$k, 'g+100:300', 10, 1000, 1, 40]), '1 | 1 28 100 9 300 ' . $tok->($T0 + 1200, 0, 10),
        'g: 9 granted, TAT advanced as if they arrived at t + lease');
    is(gcra_value($k, 10), ($T0 + 1200) . '+0/10', 'g: TAT = max(TAT, t + lease) + g*T');
    pttl_in($k, 700, 1200, 'g: PX to the TAT');
    is(dec($T0, [$k, 'g', 10, 1000, 0, 40]), '1 | 1 28 100', 'g: a plain read sees 28');
    # Give back 5: TAT 1200 - 500 = 700.
    is(give($T0 + 100, $k, 'Gg', 10, 1000, 5, $tok->($T0 + 1200, 0, 10)), '1 | 1 0 1', 'g: 5 given back');
    is(gcra_value($k, 10), ($T0 + 700) . '+0/10', 'g: TAT - 5T');
    pttl_in($k, 100, 600, 'g: PX to the new TAT');
    # Again with the same token: the TAT is not the one it left any more.
    is(give($T0 + 100, $k, 'Gg', 10, 1000, 5, $tok->($T0 + 1200, 0, 10)), '1 | 1 0 1', 'g: twice: nothing');
    is(gcra_value($k, 10), ($T0 + 700) . '+0/10', 'g: unchanged');

    # The grant shrinks with the room (T = 100, burst 40, lease 300, cost 1 each at t=0):
    # TAT after the cost c, room (4000 - max(c, 300)) / 100, TAT' = c + g*100.
    my $s = 'rl:lease:gs';
    my $tat = 0;
    for my $g (9, 6, 5, 3, 2, 1, 1, 0, 0, 0, 0) {
        my $c = $tat + 100;
        $c = 300 if $c < 300 && $g;    # the first: the grant starts at t + lease
        my $new = $c + 100 * $g;
        $new = $tat + 100 unless $g;
        my $rem = 40 - $new / 100;
        is(dec($T0, [$s, 'g+100:300', 10, 1000, 1, 40]),
            "1 | 1 $rem 100 $g " . ($g ? '300 ' . $tok->($T0 + $new, 0, 10) : '0 0'),
            "g: room " . (($g ? 4000 - $c : 4000 - $new) / 100) . ": $g granted");
        $tat = $new;
    }
    is(gcra_value($s, 10), ($T0 + 4000) . '+0/10', 'g: full');
    is(dec($T0, [$s, 'g+100:300', 10, 1000, 1, 40]), '0 | 0 0 100 0 0 0', 'g: full: rejected');

    # lease >= burst * T grants nothing: burst 3, lease 300 and 1000.
    for my $l (300, 1000) {
        my $z = "rl:lease:gb$l";
        is(dec($T0, [$z, "g+10:$l", 10, 1000, 1, 3]), '1 | 1 2 100 0 0 0', "g: lease $l >= 3T: nothing");
        is(gcra_value($z, 10), ($T0 + 100) . '+0/10', "g: lease $l: the cost alone");
    }
    # lease 299 < 3T: the room (300 - 299) / 100 holds no unit either.
    is(dec($T0, ['rl:lease:gb299', 'g+10:299', 10, 1000, 1, 3]), '1 | 1 2 100 0 0 0', 'g: lease 299: no whole unit');

    # Two holders (T = 10, burst 10, lease 50): A at 0 gets 1 (TAT 60), B at 10 gets
    # 1 behind it (TAT 70). A's give-back would move B's slot before B's arrival
    # (60): 9 plain units at t=60 + B's unit would make 11 at once. Refused.
    my $h = 'rl:lease:gh';
    my @z = ([$h, 'g+4:50', 100, 1000, 0, 10]);
    is(dec($T0, @z), '1 | 1 4 10 1 50 ' . $tok->($T0 + 60, 0, 100), 'g holders: A 1 (room 5)');
    is(dec($T0 + 10, @z), '1 | 1 4 10 1 50 ' . $tok->($T0 + 70, 0, 100), 'g holders: B 1 behind A');
    is(give($T0 + 10, $h, 'Gg', 100, 1000, 1, $tok->($T0 + 60, 0, 100)), '1 | 1 0 1', 'g holders: A gives back');
    is(gcra_value($h, 100), ($T0 + 70) . '+0/100', 'g holders: refused, the TAT moved since');
    is(give($T0 + 10, $h, 'Gg', 100, 1000, 1, 0), '1 | 1 0 1', 'g holders: token 0: nothing');
    is(give($T0 + 10, $h, 'Gg', 100, 1000, 1, $tok->($T0 + 70, 0, 100)), '1 | 1 0 1', 'g holders: B gives back');
    is(gcra_value($h, 100), ($T0 + 60) . '+0/100', 'g holders: B\'s slot freed');
    is(give($T0 + 10, $h, 'Gg', 100, 1000, 1, $tok->($T0 + 60, 0, 100)), '1 | 1 0 1', 'g holders: then A');
    is(gcra_value($h, 100), ($T0 + 50) . '+0/100', 'g holders: A\'s slot freed; the skipped 0..50 stays');
    # A TAT brought to or below now: the key goes.
    is(give($T0 + 50, $h, 'Gg', 100, 1000, 1, $tok->($T0 + 50, 0, 100)), '1 | 1 0 1', 'g: to now');
    is(redis_cmd('EXISTS', $h), 0, 'g: TAT at now: deleted');
    is(give($T0 + 50, $h, 'Gg', 100, 1000, 1, $tok->($T0 + 50, 0, 100)), '1 | 1 0 1', 'g: after a reset');
    is(redis_cmd('EXISTS', $h), 0, 'g: ... creates nothing');

    # Remainders: limit 3 per 1000 (T = 333 1/3), burst 30, lease 500, at t=0, cost 1:
    # TAT 333+1/3; start 500; room (10000 - 500) / 333.33 = 28.5 -> 28, 7 granted;
    # TAT' = 500 + 7000/3 = 2833 + 1/3.
    my $q = 'rl:lease:gq';
    is(dec($T0, [$q, 'g+10:500', 3, 1000, 1, 30]), '1 | 1 21 167 7 500 ' . $tok->($T0 + 2833, 1, 3),
        'g: exact thirds');
    is(gcra_value($q, 3), ($T0 + 2833) . '+1/3', 'g: TAT with its remainder');
    is(give($T0 + 100, $q, 'Gg', 3, 1000, 2, $tok->($T0 + 2833, 1, 3)), '1 | 1 0 1', 'g: give back 2');
    is(gcra_value($q, 3), ($T0 + 2166) . '+2/3', 'g: TAT - 2000/3 exactly');
    # Rejected: nothing reserved.
    my $before = snapshot($q);
    is(dec($T0 + 100, [$q, 'g+10:500', 3, 1000, 30, 30]), '0 | 0 23 2067 0 0 0', 'g: rejected');
    is(snapshot($q), $before, 'g: nothing written');
}

######################################################################
# Calendar quota ("q"): hourly, limit 100.
{
    my $H = 3_600_000;
    my $start = 1000 * timegm(0, 0, 17, 3, 0, 2024);
    my $end = $start + $H;
    my $spec = 14401;
    my $k = 'rl:lease:q';
    my $t = $end - 300_000;    # 5 minutes before the hour
    # room 99: 24 granted; lease 10 min capped at the 5 min left.
    is(dec($t, [$k, 'q+100:600000', 100, $spec]), "1 | 1 75 300000 24 300000 $start", 'q: lease capped');
    is(dec($t, [$k, 'q', 100, $spec, 0]), '1 | 1 75 300000', 'q: a plain read sees 75');
    pttl_in($k, 280_000, 300_000, 'q: to the period end');
    is(give($t + 1000, $k, 'Gq', 100, $spec, 10, $start), '1 | 1 85 1', 'q: give back 10 in the period');
    pttl_in($k, 270_000, 300_000, 'q: TTL kept');
    is(give($t + 1000, $k, 'Gq', 100, $spec, 100, $start), '1 | 1 100 1', 'q: never below zero');
    # The last ms of the period: 1 ms of lease.
    is(dec($end - 1, [$k, 'q+8:600000', 100, $spec]), "1 | 1 91 1 8 1 $start", 'q: last ms: lease 1');
    # The next period: the give-back for the old one does nothing.
    is(dec($end, [$k, 'q', 100, $spec]), "1 | 1 99 $H", 'q: next period');
    my $before = snapshot($k);
    is(give($end + 1, $k, 'Gq', 100, $spec, 5, $start), '1 | 1 99 1', 'q: give-back after the period');
    is(snapshot($k), $before, 'q: nothing written');
    redis_cmd('DEL', $k);
    is(give($end + 1, $k, 'Gq', 100, $spec, 5, $end), '1 | 1 100 1', 'q: give-back after a reset');
    is(redis_cmd('EXISTS', $k), 0, 'q: ... creates nothing');
    # Shrinking: limit 10.
    my $s = 'rl:lease:qs';
    is(dec($t, [$s, 'q+9:1000', 10, $spec, 4]), "1 | 1 5 300000 1 1000 $start", 'q: room 6: 1');
    is(dec($t, [$s, 'q+9:1000', 10, $spec, 2]), '1 | 1 3 300000 0 0 0', 'q: room 3: 0');
    is(dec($t, [$s, 'q+9:1000', 10, $spec, 4]), '0 | 0 3 300000 0 0 0', 'q: rejected: 0');
}

######################################################################
# Balance ("b").
{
    my $T = 1_700_000_000_000;
    my $k = 'rl:lease:b';
    redis_cmd('SET', $k, 100);
    is(dec($T, [$k, 'b+50:1000', 1, 1]), '1 | 1 75 0 24 1000 0', 'b: room 99: 24');
    is(redis_cmd('GET', $k), 75, 'b: DECRBY cost + grant');
    is(give($T, $k, 'Gb', 1, 1, 12, 0), '1 | 1 87 1', 'b: give back half');
    is(redis_cmd('GET', $k), 87, 'b: INCRBY');
    redis_cmd('SET', $k, 5);
    is(dec($T, [$k, 'b+50:1000', 1, 1]), '1 | 1 3 0 1 1000 0', 'b: room 4: 1');
    is(dec($T, [$k, 'b+50:1000', 1, 1]), '1 | 1 2 0 0 0 0', 'b: room 2: 0');
    is(dec($T, [$k, 'b+50:1000', 1, 1, 3]), '0 | 0 2 0 0 0 0', 'b: rejected');
    is(dec($T, [$k, 'b+50:1000', 1, 1, 2]), '1 | 1 0 0 0 0 0', 'b: drawn to exactly 0');
    is(redis_cmd('GET', $k), '0', 'b: never below zero');
    # A missing key with a default grant of 50: room 49, 12.
    my $d = 'rl:lease:bd';
    is(dec($T, [$d, 'b+50:1000', 1, 1, 1, 50]), '1 | 1 37 0 12 1000 0', 'b: default grant');
    is(redis_cmd('GET', $d), 37, 'b: written whole');
    # A give-back after a reset does not recreate the balance.
    redis_cmd('DEL', $d);
    is(give($T, $d, 'Gb', 1, 1, 12, 0), '1 | 1 0 1', 'b: give-back after a reset');
    is(redis_cmd('EXISTS', $d), 0, 'b: ... creates nothing');
}

######################################################################
# Bad reserve and give-back fields: an error for that decision, nothing written
# (not even by an earlier zone of it).
{
    my $T = 10_000_000;
    my $ok = 'rl:lease:v:ok';
    my @bad = (
        ['r+1:100', 5, 1000, 1, 'id'], ['l+:100'], ['l+1:'], ['l+-1:100'], ['l+1.5:100'], ['l+1:1e3'],
        ['x+1:100'], ['B+1:1'], ['D+1:1'], ['l+1:100:'], [' l+1:100'], ['L+1:100'],
        ['Gr', 5, 1000, 1, 1], ['GB', 5, 1000, 1, 1], ['GD', 5, 1000, 1, 1], ['Gx', 5, 1000, 1, 1], ['G', 5, 1000, 1, 1],
        ['Gl', 5, 1000, 0, 1], ['Gl', 5, 1000, 1, ''], ['Gl', 5, 1000, 1, '-1'], ['Gl', 5, 1000, 1, 'x'],
        ['Gl', 5, 1000, 1.5, 1], ['Gl', 5, 1000, 1, 2**53], ['Gq', 5, 14405, 1, 1], ['Gc', 0, 1000, 1, 1],
        ['g+1:100', 5, 1000, 1, 0],    # gcra needs a burst
    );
    for my $b (@bad) {
        my ($f, $limit, $w, $cost, $burst) = @$b;
        my $r = decide_raw([$ok, 'rl:lease:v:bad'], $T, 'l+4:100', 10, 1000, 1, 0,
            $f, $limit // 5, $w // 1000, $cost // 1, $burst // 0);
        is(show($r, 'l+4:100', $f), 'ERR:ERR ratelimit: bad arguments for zone 2', "bad field '$f'");
    }
    is(redis_cmd('EXISTS', $ok, 'rl:lease:v:bad'), 0, 'bad fields: nothing written');
    # want above 10^9 counts as 10^9; lease above a year as a year.
    is(dec($T, ['rl:lease:v:big', 'q+99999999999999999999:99999999999999999', 100, 14402]),
        '1 | 1 75 ' . (86_400_000 - $T % 86_400_000) . ' 24 ' . (86_400_000 - $T % 86_400_000) . ' 0',
        'huge want and lease: capped (the quota then caps the lease at the day)');
    is(dec($T, ['rl:lease:v:year', 'l+1:99999999999999', 100, 1000]), '1 | 1 98 1000 1 31536000000 ' . m0($T),
        'lease above a year: a year');
    pttl_in('rl:lease:v:year', 31536000000, 31536001000, 'lease a year: PTTL window + a year');
    # A reserve and a plain zone may share a key (same letter); a give-back may not.
    is(dec($T, ['rl:lease:v:sh', 'l+4:100', 10, 1000], ['rl:lease:v:sh', 'l', 10, 1000, 0]),
        '1 | 1 7 1000 2 100 ' . m0($T) . ' | 1 10 0', 'reserve and plain on one key: the same algorithm');
    is(show(decide_raw(['rl:lease:v:sh', 'rl:lease:v:sh'], $T, 'l', 10, 1000, 1, 0, 'Gl', 10, 1000, 1, 1), 'l', 'Gl'),
        'ERR:ERR ratelimit: zones 1 and 2 share a key with different algorithms', 'give-back and plain on one key');
    # A give-back on someone else's data.
    redis_cmd('SET', 'rl:lease:v:str', 'not ours');
    is(give($T, 'rl:lease:v:str', 'Gl', 5, 1000, 1, 1),
        'ERR:WRONGTYPE Operation against a key holding the wrong kind of value', 'Gl on a string');
    is(give($T, 'rl:lease:v:str', 'Gc', 5, 1000, 1, 1), 'ERR:WRONGTYPE ratelimit: rl:lease:v:str holds other data',
        'Gc on other data');
    # The first three fields of a reserve zone are those of the plain zone.
    for my $alg (qw(l p c q b)) {
        my ($w, $burst) = $alg eq 'q' ? (14402, 0) : (1000, $alg eq 'b' ? 50 : 0);
        my $plain = dec($T + 7, ["rl:lease:v:p$alg", $alg, 10, $w, 3, $burst]);
        my $res = dec($T + 7, ["rl:lease:v:r$alg", "$alg+0:100", 10, $w, 3, $burst]);
        is($res, "$plain 0 0 0", "$alg: want 0 answers as the plain zone");
    }
}

######################################################################
# A batch mixing reserve, plain and give-back decisions, in order; the give-backs
# return reservations granted before it (their rids are Redis's to choose).
{
    my $T = 10_000_000;
    my $m = m0($T);
    is(dec($T, ['rl:lease:x:lb', 'l+8:500', 20, 1000]), "1 | 1 15 1000 4 500 $m", 'batch: a reservation before it');
    is(dec($T, ['rl:lease:x:cb', 'c+8:500', 20, 1000]), '1 | 1 15 1200 4 500 ' . ($T / 1000), 'batch: and another');
    my $r = batch_raw(
        [['rl:lease:x:l'], $T, 'l+8:500', 20, 1000, 1, 0],
        [['rl:lease:x:l', 'rl:lease:x:c'], $T, 'l', 20, 1000, 1, 0, 'c+8:500', 20, 1000, 1, 0],
        [['rl:lease:x:lb'], $T, "Gl$RID{'rl:lease:x:lb'}", 20, 1000, 2, $m + 2],
        [['rl:lease:x:g'], $T, 'g+8:200', 10, 1000, 1, 20],
        [['rl:lease:x:l'], $T, 'r+1:100', 20, 1000, 1, 'id'],
        [['rl:lease:x:cb'], $T, "Gc$RID{'rl:lease:x:cb'}", 20, 1000, 1, $T / 1000],
        [['rl:lease:x:l'], $T, 'l+0:500', 20, 1000, 0, 0],
    );
    my @f = (['l+8:500'], ['l', 'c+8:500'], ['Gl'], ['g+8:200'], ['r+1:100'], ['Gc'], ['l+0:500']);
    my @got = map { show($r->[$_], @{ $f[$_] }) } 0 .. $#$r;
    is(join("\n", @got), join("\n",
        "1 | 1 15 1000 4 500 $m",
        '1 | 1 14 1000 | 1 15 1200 4 500 ' . ($T / 1000),
        '1 | 1 17 1',
        '1 | 1 14 100 4 200 ' . ((($T + 600) % 4194304) * 10 + 1),
        'ERR:ERR ratelimit: bad arguments for zone 1',
        '1 | 1 16 1',
        '1 | 1 14 1000 0 0 0',
    ), 'a batch: reserve, plain + reserve, give-back, bad, give-back, read');
    is(counter_value('rl:lease:x:cb'), ($T / 1000 % 256) . ':4:0', 'batch: the counter after its give-back');
}

######################################################################
# The ledger: a reservation belongs to the life of its key (issue 27). A reset
# (DEL, FLUSHALL, an admin "D", expiry) followed by a new life of the key, even
# one made by another gateway at once, leaves the old reservation's give-back
# and check nothing to act on, for every algorithm that leases.
{
    my $T = 1_700_000_000_000;
    my $spec = 14401;
    my @algs = (
        ['l', 20, 1000, 0], ['p', 20, 1000, 0], ['c', 20, 1000, 0], ['g', 20, 1000, 20],
        ['q', 20, $spec, 0], ['b', 1, 1, 20],
    );
    for my $a (@algs) {
        my ($alg, $limit, $w, $burst) = @$a;
        for my $reset (['DEL', sub { redis_cmd('DEL', $_[0]) }],
                       ['D', sub { decide_raw([$_[0]], $T, 'D', 1, 1, 0, 0) }],
                       ['FLUSHALL', sub { redis_cmd('FLUSHALL') }]) {
            my ($how, $do) = @$reset;
            my $k = "rl:lease:life:$alg:$how";
            my $f = "$alg+8:500";
            my $first = dec($T, [$k, $f, $limit, $w, 1, $burst]);
            like($first, qr/^1 \| 1 \d+ \d+ [1-9]\d* /, "life $alg/$how: 4 reserved ($first)");
            my $old = $RID{$k};
            is(check_rid($k, $old), '1 | 1 1 0', "life $alg/$how: the check says it is of the key's life");
            $do->($k);
            # A DEL of the key alone leaves its ledger: the missing key says it all the same.
            is(check_rid($k, $old), '1 | 1 0 0', "life $alg/$how: after the reset it is not");
            # The key's next life, by another gateway: a reservation of its own.
            like(dec($T + 1, [$k, $f, $limit, $w, 1, $burst]), qr/^1 \| 1 \d+ \d+ [1-9]\d* /, "life $alg/$how: a new life, 4 reserved");
            isnt($RID{$k}, $old, "life $alg/$how: another rid");
            is(check_rid($k, $old), '1 | 1 0 0', "life $alg/$how: the old reservation is not of the new life");
            is(check_rid($k), '1 | 1 1 0', "life $alg/$how: the new one is");
            my $before = snapshot($k);
            my $token = $alg eq 'l' ? m0($T) : $alg eq 'p' ? $T + 500 : $alg eq 'c' ? int($T / $w)
                : $alg eq 'q' ? 1000 * timegm(0, 0, int(($T % 86_400_000) / 3_600_000), 14, 10, 2023) : 0;
            $token = ((($T + 900) % 4194304) * $limit + 1) if $alg eq 'g';
            is(give_of($T + 2, $k, "G$alg", $limit, $w, 4, $token, $old), '1 | 1 0 0',
                "life $alg/$how: the old give-back writes nothing");
            is(snapshot($k), $before, "life $alg/$how: the new life is untouched");
        }
    }
    # Expiry: a quota's reservation lapses with its period; the next period is a new life.
    my $k = 'rl:lease:life:q:expiry';
    like(dec($T, [$k, 'q+8:500', 20, $spec]), qr/^1 \| 1 \d+ \d+ [1-9]\d* /, 'life q/expiry: reserved');
    my $old = $RID{$k};
    redis_cmd('PEXPIRE', $k, 1);
    sleep 0.05;
    like(dec($T + 1, [$k, 'q+8:500', 20, $spec]), qr/^1 \| 1 \d+ \d+ [1-9]\d* /, 'life q/expiry: a new life');
    is(check_rid($k, $old), '1 | 1 0 0', 'life q/expiry: the old reservation is not of it');
    # Within one life a check holds through other writers' decisions and give-backs.
    my $s = 'rl:lease:life:c:busy';
    dec($T, [$s, 'c+8:500', 100, 1000]);
    my $a = $RID{$s};
    dec($T + 1, [$s, 'c+8:500', 100, 1000]);
    give_of($T + 2, $s, 'Gc', 100, 1000, 4, int($T / 1000));
    dec($T + 3, [$s, 'c', 100, 1000]);
    is(check_rid($s, $a), '1 | 1 1 0', 'one life: still of it after others wrote');
    is(redis_cmd('ZCARD', ledger_of($s)), 1, 'one life: the given-back rid left the ledger');
    my $ttl = redis_cmd('PTTL', ledger_of($s));
    ok($ttl > 10_000 && $ttl <= 10_500, "the ledger lives lease_time + 10 s ($ttl)");
    # A key whose ledger could not share its slot (a brace, no hash tag): nothing granted.
    is(dec($T, ['rl:lease:life:{x', 'l+8:500', 20, 1000]), '1 | 1 19 1000 0 0 0', 'no ledger: exact');
    # A hash tag: the ledger follows the key's tag.
    dec($T, ['rl:lease:{life}:t', 'l+8:500', 20, 1000]);
    is(redis_cmd('EXISTS', 'rl:lease:{life}:t|lease'), 1, 'a tagged key: its ledger is key|lease');
    is(redis_cmd('EXISTS', 'rl:lease:life:c:busy|lease{rl:lease:life:c:busy}'), 1,
        'an untagged key: key|lease{key}, in its slot');
}

done_testing();

# Per-node batches on a Redis Cluster: the decisions an event-loop iteration
# queues for one node share one script call whatever their slots; only the
# first decision's keys are declared, the script probes the others (their
# first access, a read whose error is caught, is the probe).  A
# decision whose key is not on the node after all (its slot moved and this
# worker's table does not know yet, or it is migrating and the key left) is
# answered NOTLOCAL having written nothing, and goes again alone, where MOVED
# or ASK lead it: decided by Redis, exactly, never wrongly.
#
# HTTP/2 streams sent in one write make the batch deterministic: nginx reads
# them in one event and runs their access phases one after another, so their
# decisions are queued in one iteration on the node's one connection.
use lib 't/lib';
use RLTest;
use RLTest::Cluster;
use RLTest::H2;

my $c = RLTest::Cluster->new(dir => servroot() . '/cluster', primaries => 3, replicas => 0)->start;
my @p = $c->primaries;
my $SLOW = $RLTest::Nginx::SLOW;
my $LIMIT = 3;

my $H2 = free_port();
my ($version) = `@{[RLTest::Nginx::binary()]} -v 2>&1` =~ m{nginx/(\d+\.\d+\.\d+)};
my $new_h2 = sprintf('%03d%03d%03d', split /\./, $version // '0.0.0') ge '001025001';
my ($h2_listen, $h2_on) = $new_h2 ? ("127.0.0.1:$H2", 'http2 on;') : ("127.0.0.1:$H2 http2", '');
my $timeout = $SLOW > 1 ? '3s' : '1s';

nginx()->write_html({ t => "ok\n" });
start_nginx(workers => 1, log_level => 'info', http_config => <<"EOF", config => <<'EOF');
    ratelimit_redis @{[join ' ', map { "127.0.0.1:$_" } @p]} cluster=on timeout=$timeout;
    ratelimit_zone api key=\$arg_k limit=$LIMIT window=1m;
    ratelimit_fail closed;
    ratelimit_deny_cache off;
    ratelimit_metrics_zone 64k;
    server {
        listen $h2_listen;
        $h2_on
        location /t { ratelimit api; }
    }
EOF
    location = /metrics { ratelimit_metrics; }
EOF

sub evalsha_calls { my $n = $c->info_field($_[0], 'commandstats', 'cmdstat_evalsha'); $n && $n =~ /calls=(\d+)/ ? $1 : 0 }
sub reroutes {
    my $body = http_get('/metrics')->{body} // '';
    my $n = 0;
    $n += $1 while $body =~ /^ratelimit_redis_reroutes_total\{[^}]*\} (\d+)$/mg;
    return $n;
}
# Sends one request per key as HTTP/2 streams in one write; returns their statuses, in order.
sub burst {
    my @keys = @_;
    my $h2 = RLTest::H2->connect(port => $H2) or die "h2: $RLTest::H2::error\n";
    $h2->cork;
    my @sids = map { $h2->get("/t?k=$_") } @keys;
    $h2->uncork;
    $h2->wait_until(10 * $SLOW, sub { !grep { !defined $h2->status($_) } @sids });
    my @st = map { $h2->status($_) // 'none' } @sids;
    $h2->close;
    return @st;
}

# Eight keys on the first primary, each in a slot of its own.
my $home = $p[0];
my (@keys, %slot_taken);
for (my $i = 0; @keys < 8; $i++) {
    my $slot = $c->keyslot("rl:api:b$i");
    next if $c->primary_of_slot($slot) != $home || $slot_taken{$slot}++;
    push @keys, "b$i";
}
my %slot = map { $_ => $c->keyslot("rl:api:$_") } @keys;

SKIP: {
    my $probe = RLTest::H2->connect(port => $H2);
    skip "no HTTP/2 connection: $RLTest::H2::error", 17 unless $probe;
    $probe->close;

    # Warm-up: the worker learns the slots, connects to the node and loads the script.
    my @warm = burst('warm0');
    is("@warm", '200', 'a first decision over HTTP/2');
    for my $k (@keys) { $c->cmd($home, 'DEL', "rl:api:$k") }

    # --- One call for eight slots.
    my $before = evalsha_calls($home);
    my @st = burst(@keys);
    is("@st", join(' ', ('200') x 8), 'eight keys of eight slots on one node: all admitted');
    my $calls = evalsha_calls($home) - $before;
    cmp_ok($calls, '<=', 2, "they took $calls script call(s) on their node, not 8");
    is(scalar(grep { $c->cmd($home, 'ZCARD', "rl:api:$_") == 1 } @keys), 8,
        'each key holds its one admission on its node');
    is(reroutes(), 0, 'nothing re-routed while the table is right');

    # --- Two slots move behind the worker's back: one resharded whole (the key
    # goes with it), one left migrating with its key gone to the importing node.
    my ($moved, $migrating) = @keys[2, 5];
    my $to = $p[1];
    $c->migrate_slot_begin($slot{$moved}, $home, $to);
    $c->migrate_keys($slot{$moved}, $home, $to);
    $c->migrate_slot_end($slot{$moved}, $to);
    $c->migrate_slot_begin($slot{$migrating}, $home, $to);
    $c->migrate_keys($slot{$migrating}, $home, $to);
    # COUNTKEYSINSLOT answers for a slot being migrated too, where a key's own command would be
    # redirected.
    my $keys_in = sub { $c->cmd($_[0], 'CLUSTER', 'COUNTKEYSINSLOT', $slot{ $_[1] }) };
    is($keys_in->($to, $_), 1, "$_: its key is on the other node now") for $moved, $migrating;

    $before = evalsha_calls($home);
    my $to_before = evalsha_calls($to);
    @st = burst(@keys);
    is("@st", join(' ', ('200') x 8),
        'the same eight again: all decided by Redis (ratelimit_fail closed would say 503)');
    is(reroutes(), 2, 'the two whose keys left were answered NOTLOCAL and sent again alone');
    $calls = evalsha_calls($home) - $before;
    cmp_ok($calls, '<=', 3, "the six that stayed shared calls ($calls on their node; the two "
        . 'sent again there alone were redirected before they ran)');
    is($c->cmd($to, 'ZCARD', "rl:api:$moved"), 2, "$moved: its second admission written where it lives");
    is($keys_in->($home, $_), 0, "$_: nothing written on the node it left") for $moved, $migrating;
    cmp_ok(evalsha_calls($to) - $to_before, '>=', 2, 'the other node decided them');

    # Exactness for all eight: one more each is the limit, then 429.
    @st = burst(@keys);
    is("@st", join(' ', ('200') x 8), 'a third request each: admitted (limit 3)');
    @st = burst(@keys, @keys);
    is("@st", join(' ', ('429') x 16), 'then every one of the 16 rejected, moved keys included');
    $c->migrate_slot_end($slot{$migrating}, $to);
    is($c->cmd($to, 'ZCARD', "rl:api:$migrating"), $LIMIT,
        "$migrating: its $LIMIT admissions on the node that imported its slot");
}

# --- The script itself, called on a node with one decision whose second zone
# is on another node: that decision writes nothing, even in its local zone; the
# decisions before and after it stand.
my @local = grep { $c->primary_of_slot($c->keyslot($_)) == $home } map { "rl:x:l$_" } 0 .. 200;
my ($remote) = grep { $c->primary_of_slot($c->keyslot($_)) == $p[2] } map { "rl:x:r$_" } 0 .. 200;
open my $fh, '<', 'lua/decide.lua' or die "lua/decide.lua: $!";
my $script = do { local $/; <$fh> };
my @zone = ('c', 10, 60000, 1, 0);
my $r = $c->cmd($home, 'EVAL', $script, 1, $local[0],
    'k3', $local[1], $remote, $local[2],
    '', @zone,                     # decision 1: declared
    '', @zone, @zone,              # decision 2: a local zone, then one on another node
    '', @zone);                    # decision 3: local, undeclared
is(ref $r, 'ARRAY', 'the call answers one reply per decision');
is($r->[0][0], 1, 'decision 1 admitted');
like(ref $r->[1] eq 'ARRAY' ? "@{$r->[1]}" : ref $r->[1] ? $r->[1]->message : "$r->[1]",
    qr/^NOTLOCAL ERR Script attempted to access a non local key/,
    'decision 2: NOTLOCAL, with the reason Redis gave');
is($r->[2][0], 1, 'decision 3 admitted');
is(join(' ', map { $c->cmd($home, 'EXISTS', $_) } @local[0 .. 2]), '1 0 1',
    'decisions 1 and 3 written; not even the local zone of decision 2');

# --- No EXISTS probes: an undeclared key's first access (a read, its error caught) is its
# probe. Every kind of zone, on a key of another node: NOTLOCAL alone, first in its decision,
# and after a local zone whose first access prunes (a sliding_log entry out of its window, a
# lapsed concurrency slot), which must not prune then; the same kind on a local key is decided.
my $str = sub { my $x = shift; ref $x eq 'ARRAY' ? "@$x" : ref $x ? $x->message : "$x" };
my ($decl, $pruned, $slots, $wrong_s, $wrong_z, $spare) = @local[3 .. 8];
# A key with braces and no hash tag has no ledger: a check ("V") of it touches nothing but the
# probe.
my ($untagged) = grep { $c->primary_of_slot($c->keyslot($_)) == $p[2] } map { "rl:{}:v$_" } 0 .. 200;
# One call on $home: decision 1 declared (a counter zone on $decl), then each of @_, as
# [[its keys], [its zones' fields]], undeclared. Returns the replies of those.
my $batch = sub {
    my @und = map { @{ $_->[0] } } @_;
    my @argv = ('', 'c', 100, 60000, 1, 0);
    push @argv, '', @{ $_->[1] } for @_;
    my $r = $c->cmd($home, 'EVAL', $script, 1, $decl, 'k' . scalar(@und), @und, @argv);
    return ref $r eq 'ARRAY' ? @$r[1 .. $#$r] : ($r);
};
my $now_ms = do { my $t = $c->cmd($home, 'TIME'); int($t->[0] * 1000 + $t->[1] / 1000) };
$c->cmd($home, 'ZADD', $pruned, $now_ms - 120000, 'old');
$c->cmd($home, 'ZADD', $slots, $now_ms - 1000, 'lapsed');
my @l_zone = ('l', 10, 60000, 1, 0);
my @n_zone = ('n', 10, 60000, 1, 'm-0');
my $token = sprintf '%d', 2**52;
my @kinds = (
    ['l', 10, 60000, 1, 0], ['r', 10, 60000, 1, 'req-1'], ['p', 10, 60000, 1, 0],
    ['c', 10, 60000, 1, 0], ['g', 10, 60000, 1, 5], ['q', 10, 14404, 1, 0],
    ['b', 10, 60000, 1, 100], ['B', 10, 1, 50, 0], ['D', 1, 1, 0, 0],
    ['n', 10, 60000, 1, 'm-1'], ['Gn', 10, 60000, 1, 'm-1'], ['Rn', 10, 60000, 1, 'm-1'],
    ['V17', 1, 1, 0, 0],
    ['l+8:1000', 100, 60000, 1, 0], ['p+8:1000', 100, 60000, 1, 0], ['c+8:1000', 100, 60000, 1, 0],
    ['g+8:1000', 100, 60000, 1, 50], ['q+8:1000', 100, 14404, 1, 0], ['b+8:1000', 100, 60000, 1, 100],
    ['l~0', 10, 60000, 1, 0], ['g~5000', 10, 60000, 1, 5], ['c+8:1000~2000', 100, 60000, 1, 0],
    ['q~0!', 10, 14404, 1, 0],
    ['l!', 10, 60000, 1, 0], ['p!', 10, 60000, 1, 0], ['c^', 10, 60000, 1, 0],
    ['g!', 10, 60000, 1, 5], ['q^', 10, 14404, 1, 0], ['b!', 10, 60000, 1, 100],
    ["Gl17", 10, 60000, 1, $token], ['Gp17', 10, 60000, 1, 5], ['Gc17', 10, 60000, 1, 5],
    ['Gg17', 10, 60000, 1, 5], ['Gq17', 10, 14404, 1, 5], ['Gb17', 10, 60000, 1, 0],
    ['Cl17', 10, 60000, 1, 0], ['Cp17', 10, 60000, 1, 0], ['Cc17', 10, 60000, 1, 0],
    ['Cg17', 10, 60000, 1, 5], ['Cq17', 10, 14404, 1, 0], ['Cb17', 10, 60000, 1, 100],
);
for my $kind (@kinds) {
    my $name = $kind->[0];
    $c->cmd($home, 'DEL', $spare);
    my @r = $batch->([[$remote], $kind], [[$remote, $pruned], [@$kind, @l_zone]],
        [[$pruned, $remote], [@l_zone, @$kind]], [[$slots, $remote], [@n_zone, @$kind]],
        [[$spare], $kind]);
    my @got = map { $str->($_) =~ /^NOTLOCAL ERR Script attempted to access a non local key/ ? 1 : 0 } @r[0 .. 3];
    # What pruning would remove is still there, and no slot was taken.
    push @got, map { $c->cmd($home, 'ZCARD', $_) } $pruned, $slots;
    is("@got", '1 1 1 1 1 1', "$name on another node's key: NOTLOCAL alone, first, after a local "
        . 'zone that prunes (which did not)') or diag(join ' | ', map { $str->($_) } @r);
    is(ref $r[4], 'ARRAY', "$name on a local undeclared key: decided") or diag($str->($r[4]));
}
my ($v) = $batch->([[$untagged], ['V17', 1, 1, 0, 0]]);
like($str->($v), qr/^NOTLOCAL /, 'a check of a key that cannot have a ledger: still NOTLOCAL');
is($c->cmd($home, 'ZSCORE', $pruned, 'old'), $now_ms - 120000,
    'the sliding_log entry out of its window is the one written before');
is($c->cmd($home, 'ZSCORE', $slots, 'lapsed'), $now_ms - 1000, 'so is the lapsed slot');
# Decision 1 of two zones (two declared keys, one slot): the undeclared keys follow them.
my ($tag) = grep { $c->primary_of_slot($c->keyslot("{$_}")) == $home } map { "t$_" } 0 .. 200;
my $r2 = $c->cmd($home, 'EVAL', $script, 2, "rl:{$tag}:a", "rl:{$tag}:b", 'k3', @local[9, 10], $remote,
    '', @l_zone, 'c', 7, 60000, 1, 0, '', @l_zone, '', 'c', 5, 60000, 1, 0, '', @l_zone);
# each zone's ok and remaining
is(join(' | ', map { my $x = $_; ref $x eq 'ARRAY' ? "@$x[grep { $_ % 3 != 0 } 0 .. $#$x]" : $str->($x) =~ /^NOTLOCAL / ? 'NOTLOCAL' : $str->($x) } @$r2),
    '1 9 1 6 | 1 9 | 1 4 | NOTLOCAL',
    'two declared keys, then three undeclared: each decision on its own key');
# A first access that fails on a key the node holds (other data): the decision's own error, as
# for a declared key.
$c->cmd($home, 'SET', $wrong_s, 'x');
$c->cmd($home, 'ZADD', $wrong_z, 1, 'x');
my @wt = $batch->([[$wrong_z], ['c', 10, 60000, 1, 0]], [[$wrong_s], \@l_zone],
    [[$wrong_s], ['n', 10, 60000, 1, 'm']], [[$wrong_s], ['Gl17', 10, 60000, 1, $token]]);
like($str->($wt[$_]), qr/^WRONGTYPE /, "a local undeclared key of the wrong type ($_): WRONGTYPE, not NOTLOCAL")
    for 0 .. 3;

check_no_alerts(error_log_text(), 'per-node batches');
ok(stop_nginx(), 'nginx quits gracefully');
$c->stop;
done_testing();

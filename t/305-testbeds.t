# The test beds for Redis Cluster, Sentinel and multi-host suites
# (t/lib/RLTest/Cluster.pm, Sentinel.pm, Netns.pm) do what those suites will
# rely on: a cluster with a full slot map and its replicas, slots in the
# MIGRATING state answering ASK and TRYAGAIN on one raw connection, a
# Sentinel failover, and a gateway namespace cut off from Redis and back.
# Everything they start is gone at the end.
use lib 't/lib';
use RLTest;
use RLTest::Cluster;
use RLTest::Sentinel;
use RLTest::Netns;
use RLTest::Proc qw(alive);
use Time::HiRes qw(time sleep);

my $root = servroot();
sub err { ref $_[0] eq 'RLTest::Redis::Error' ? $_[0]->message : '(not an error: ' . ($_[0] // 'nil') . ')' }

# ---------------------------------------------------------------- cluster
my $c = RLTest::Cluster->new(dir => "$root/cluster", primaries => 3, replicas => 1,
    node_timeout => 2000)->start;
diag(sprintf 'cluster of 6 nodes ready in %.2f s', $c->started_in);
my @ports = $c->ports;
is(scalar @ports, 6, 'six nodes');
my @prim = $c->primaries;
is(scalar @prim, 3, 'three primaries');
for my $p (@prim) {
    my @r = $c->replica_of($p);
    is(scalar @r, 1, "primary $p has one replica");
}

my $map = $c->slots_view;
my $covered = 0;
$covered += $_->[1] - $_->[0] + 1 for @$map;
is($covered, 16384, 'CLUSTER SLOTS covers every slot');
ok(!(grep { @$_ != 4 } @$map), 'every range lists its primary and its replica');

# keyslot() against the server's answer, through redis-cli as a user would.
my @keys = ('123456789', 'foo', '{}foo', 'foo{}{bar}', 'foo{{bar}}zap', 'foo{bar}{zap}',
    '{user1000}.following', 'rl:api:consumer-42', '{rl}:api:x', 'rl:api:{x}}', "a}b{c}d");
my $cli_port = $prim[0];
for my $k (@keys) {
    my $want = `redis-cli -p $cli_port cluster keyslot \Q$k\E`;
    chomp $want;
    is($c->keyslot($k), $want, "keyslot('$k') is redis-cli's $want");
}
is($c->keyslot('foo'), 12182, 'keyslot(foo) is the vector of the design note');

# primary_of_slot: the owner serves the key, any other primary sends MOVED there.
my $slot = $c->keyslot('foo');
my $owner = $c->primary_of_slot($slot);
my ($other) = grep { $_ != $owner } @prim;
is($c->cmd($owner, 'SET', 'foo', 'bar'), 'OK', 'the slot owner takes the key');
is(err($c->cmd($other, 'GET', 'foo')), "MOVED $slot 127.0.0.1:$owner", 'another primary: MOVED to it');

# ---------------------------------------------------------------- migrating slot
# {u1}:a migrated, {u1}:b not: the source answers ASK for a, TRYAGAIN for
# both in one script; the target needs ASKING on the same connection.
my $s = $c->keyslot('{u1}');
my $from = $c->primary_of_slot($s);
my ($to) = grep { $_ != $from } @prim;
$c->cmd($from, 'SET', '{u1}:a', 1);
$c->cmd($from, 'SET', '{u1}:b', 2);
$c->migrate_slot_begin($s, $from, $to);
is($c->migrate_keys($s, $from, $to, '{u1}:a'), 1, 'one key migrated');
my $two = "return {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}";

my $src = $c->client($from);
$src->send_cmd('GET', '{u1}:b');
$src->send_cmd('GET', '{u1}:a');
$src->send_cmd('EVAL', $two, 2, '{u1}:a', '{u1}:b');
$src->send_cmd('EVAL', $two, 2, '{u1}:new1', '{u1}:new2');
is($src->read_reply, '2', 'source: a key still there is served');
is(err($src->read_reply), "ASK $s 127.0.0.1:$to", 'source: a migrated key is ASK');
like(err($src->read_reply), qr/^TRYAGAIN /, 'source: a script over migrated and present keys is TRYAGAIN');
is(err($src->read_reply), "ASK $s 127.0.0.1:$to", 'source: a script over new keys is ASK');

my $dst = $c->client($to);
is(err($dst->cmd('GET', '{u1}:a')), "MOVED $s 127.0.0.1:$from", 'target without ASKING: MOVED back');
# ASKING and the command written at once, as a pipelining client sends them.
$dst->send_cmd('ASKING');
$dst->send_cmd('GET', '{u1}:a');
$dst->send_cmd('ASKING');
$dst->send_cmd('EVAL', $two, 2, '{u1}:new1', '{u1}:new2');
is($dst->read_reply, 'OK', 'ASKING is +OK');
is($dst->read_reply, '1', 'target after ASKING: the migrated key is served');
is($dst->read_reply, 'OK', 'ASKING again');
like(err($dst->read_reply), qr/^TRYAGAIN /,
    'target after ASKING: a script over two new keys is TRYAGAIN until the slot is moved');

is($c->migrate_keys($s, $from, $to), 1, 'the rest of the slot migrated');
$c->migrate_slot_end($s, $to);
is($c->primary_of_slot($s), $to, 'the slot belongs to the target');
is(err($c->cmd($from, 'GET', '{u1}:b')), "MOVED $s 127.0.0.1:$to", 'the source answers MOVED');
is($c->cmd($to, 'EVAL', $two, 2, '{u1}:a', '{u1}:b')->[1], '2', 'the script runs on the target');

# ---------------------------------------------------------------- reshard, failover, restart
my $owned = sub {
    my ($port) = @_;
    my $n = 0;
    $n += $_->[1] - $_->[0] + 1 for grep { $_->[2] == $port } @{ $c->slots_view };
    return $n;
};
my @before = map { $owned->($_) } @prim[0, 1];
my $took = $c->reshard($prim[0], $prim[1], 20);
diag(sprintf 'reshard of 20 slots: %.2f s', $took);
is_deeply([map { $owned->($_) } @prim[0, 1]], [$before[0] - 20, $before[1] + 20],
    'reshard moved 20 slots');

my $old = $prim[2];
my $rep = $c->replica_of($old);
my $fo = $c->failover($rep);
diag(sprintf 'CLUSTER FAILOVER: replica %d primary after %.3f s', $rep, $fo);
ok((grep { $_ == $rep } $c->primaries), 'the replica is a primary');
is(scalar $c->replica_of($rep), $old, 'the old primary is its replica');

my $victim = $c->replica_of($prim[0]);
$c->kill_node($victim);
ok(!alive($c->pid_of($victim) // 0), 'kill_node: the node is gone');
$c->restart_node($victim);
my $back = $c->wait_ready(20);
diag(sprintf 'a killed replica restarted and listed again after %.2f s', $back);
is(scalar $c->replica_of($prim[0]), $victim, 'the restarted node is a replica of its primary again');

$c->flushall;
is($c->cmd($c->primary_of_slot($c->keyslot('foo')), 'EXISTS', 'foo'), 0, 'flushall');
my @cluster_pids = map { $c->pid_of($_) } $c->ports;
$c->stop;
ok(!(grep { alive($_) } @cluster_pids), 'every cluster node stopped');

# ---------------------------------------------------------------- TLS cluster
# Nodes keep a plain loopback port for the harness; TLS clients are told
# the tls ports, in CLUSTER SLOTS and in MOVED.
SKIP: {
    skip 'no openssl', 2 unless system('openssl version >/dev/null 2>&1') == 0;
    my $tls = RLTest::Cluster::tls_certs("$root/certs");
    my $tc = RLTest::Cluster->new(dir => "$root/tls-cluster", primaries => 3, replicas => 0,
        tls => $tls)->start;
    diag(sprintf 'TLS cluster of 3 primaries ready in %.2f s', $tc->started_in);
    my $owner = $tc->primary_of_slot(12182);
    my ($other) = grep { $_ != $owner } $tc->primaries;
    my @cli = ('redis-cli', '--tls', '--cacert', $tls->{ca}, '-p', $tc->tls_port($other));
    my $moved = `@cli get foo` =~ s/\s+\z//r;
    is($moved, 'MOVED 12182 127.0.0.1:' . $tc->tls_port($owner), 'over TLS: MOVED names a tls port');
    is(err($tc->cmd($other, 'GET', 'foo')), "MOVED 12182 127.0.0.1:$owner",
        'over the plain port: MOVED names a plain port');
    $tc->stop;
}

# ---------------------------------------------------------------- sentinel
my $sen = RLTest::Sentinel->new(dir => "$root/sentinel", name => 'rltest')->start;
diag(sprintf 'sentinel group ready in %.2f s', $sen->started_in);
my ($p0, $r0) = $sen->data_ports;
is($sen->primary_port, $p0, 'the sentinels name the primary');
is($sen->cmd($r0, 'ROLE')->[0], 'slave', 'the other server is its replica');
my $killed = $sen->kill_primary;
is($killed, $p0, 'kill_primary kills the primary');
my $secs = $sen->wait_failover($killed);
diag(sprintf 'sentinel failover: new primary %d after %.2f s', $sen->primary_port, $secs);
is($sen->primary_port, $r0, 'the replica was promoted');
$sen->restart($killed);
is($sen->cmd($killed, 'ROLE')->[0], 'master',
    'restarted with its old command line, the old primary is a (stale) master');
my @sen_pids = map { $sen->pid_of($_) } $sen->sentinel_ports, $sen->data_ports;
$sen->stop;
ok(!(grep { alive($_) } @sen_pids), 'every sentinel and server stopped');

# ---------------------------------------------------------------- network namespaces
SKIP: {
    my ($ok, $why) = RLTest::Netns->available;
    skip "netns bed: $why", 18 unless $ok;
    my $net = RLTest::Netns->new(gateways => 2, dir => "$root/netns")->setup;
    my $r = $net->start_redis(port => 6380);
    is($r->cmd('PING'), 'PONG', 'Redis in its namespace, reached from the test');
    my $ping = sub {
        my ($g) = @_;
        my ($rc, $out) = $net->run_in($net->gw_ns($g), 'timeout', '0.5', 'redis-cli',
            '-h', $net->redis_addr, '-p', 6380, 'ping');
        return $rc ? "rc $rc" : ($out =~ s/\s+$//r);
    };
    is($ping->(1), 'PONG', 'gateway 1 reaches Redis');
    $net->cut(1, 6380);
    is($ping->(1), 'rc 124', 'cut: gateway 1 gets no answer');
    is($ping->(2), 'PONG', 'cut: gateway 2 still does');
    $net->restore(1);
    is($ping->(1), 'PONG', 'restored: gateway 1 reaches Redis again');

    # The module in two gateway namespaces, reached from the test.
    my $addr = $net->redis_addr;
    for my $g (1, 2) {
        start_nginx(name => "gw$g", $net->nginx_options($g),
            http_config => "    ratelimit_redis $addr:6380 timeout=300ms;\n"
                . "    ratelimit_zone api key=\$arg_k limit=100 window=10s;\n",
            config => '        location /t { ratelimit api; ratelimit_fail closed; '
                . 'add_header X-RL $ratelimit_status always; }');
    }
    my $get = sub {
        my ($g) = @_;
        my $res = http_get('/t?k=a', -port => nginx("gw$g")->addr);
        return "$res->{status} " . (header($res, 'X-RL') // '-');
    };
    is($get->(1), '200 PASSED', 'nginx in gateway 1 decides through Redis');
    is($get->(2), '200 PASSED', 'nginx in gateway 2 too');
    is($r->cmd('ZCARD', 'rl:api:a'), 2, 'both counted in the one Redis');
    $net->cut(1, 6380);
    my $t0 = time;
    is($get->(1), '503 FAILED_CLOSED', 'gateway 1 cut: its decision times out');
    my $waited = time - $t0;
    ok($waited >= 0.25 && $waited < 2 * $RLTest::Nginx::SLOW, sprintf 'after the timeout (%.2f s)', $waited);
    is($get->(2), '200 PASSED', 'gateway 2 keeps deciding');
    $net->restore(1);
    is($get->(1), '200 PASSED', 'gateway 1 restored');
    for my $g (1, 2) {
        ok(stop_nginx("gw$g"), "gw$g quits gracefully");
        check_no_alerts(error_log_text("gw$g"), "gw$g");
    }
    my @names = $net->namespaces;
    my $rpid = $r->pid;
    $net->teardown;
    my $list = `ip netns list`;
    ok(!(grep { $list =~ /^\Q$_\E\b/m } @names), 'teardown removed the namespaces');
    ok(!alive($rpid), 'teardown stopped the Redis inside');
}

done_testing;

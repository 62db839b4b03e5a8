# Redis Cluster over TLS (cluster=on ssl=on): a 3-primary cluster whose nodes
# speak only TLS to clients, started by this file with a throw-away CA.  The
# nodes are announced by IP: each is verified against the IP it is reached
# at, or against one ssl_name for all.  Exact limits for keys on every
# primary, MOVED followed to TLS ports, and a wrong name refused.
use lib 't/lib';
use RLTest;
use RLTest::Cluster;
use Time::HiRes qw(time);

my $certs = RLTest::Cluster::tls_certs(servroot() . '/certs');
my $cluster = RLTest::Cluster->new(dir => servroot() . '/cluster', primaries => 3, replicas => 0,
    tls => $certs)->start;
diag(sprintf 'TLS cluster of 3 primaries started in %.1f s', $cluster->started_in);
my @primaries = $cluster->primaries;
my $seed = '127.0.0.1:' . $cluster->tls_port($primaries[0]);
my $N = 300;
my $LIMIT = 100;

sub gateway {
    my ($name, $tls) = @_;
    # 1,800 clients at once: one worker may accept most of them, past the default 1,024
    # connections, and nginx would close some to make room.
    return start_nginx(name => $name, workers => 2, events => 'worker_connections 4096;',
        http_config => <<"EOF", config => <<'EOF');
    ratelimit_redis $seed cluster=on ssl=on ssl_trusted_certificate=$certs->{ca} $tls timeout=2s;
    ratelimit_zone api key=\$arg_k limit=$LIMIT window=1h;
EOF
    location /t { ratelimit api; ratelimit_fail closed; add_header X-RL $ratelimit_status always; }
EOF
}

# Keys on each primary.
my (%seen, @keys);
for (my $i = 0; @keys < 6; $i++) {
    my $p = $cluster->primary_of_slot($cluster->keyslot("rl:api:t$i"));
    next if ($seen{$p} // 0) >= 2;
    $seen{$p}++;
    push @keys, "t$i";
}
is(scalar keys %seen, 3, 'keys on all three primaries');

for my $case (['ip', ''], ['name', 'ssl_name=redis.test']) {
    my ($name, $tls) = @$case;
    my $gw = gateway($name, $tls);
    my @specs = map { my $k = $_; map { { port => $gw->port, request => "GET /t?k=$name$k" } } 1 .. $N } @keys;
    my $res = http_parallel(\@specs, timeout => 60);
    my %ok;
    for my $i (0 .. $#$res) {
        $ok{ $keys[int($i / $N)] }{ ($res->[$i]{status} // 'error') . ' ' . (header($res->[$i], 'X-RL') // '-') }++;
    }
    SKIP: {
        # 1,800 decisions at once over TLS take valgrind longer than their 2 s.
        skip 'under valgrind the decisions time out', @keys + 1 if $ENV{TEST_NGINX_VALGRIND};
        for my $k (@keys) {
            is($ok{$k}{'200 PASSED'} // 0, $LIMIT, "$name: key $k exactly $LIMIT of $N over TLS")
                or diag(explain $ok{$k});
        }
        unlike($gw->error_log_text, qr/ratelimit: redis "|\[(crit|alert|emerg)\]/, "$name: no Redis failure logged");
    }
    ok($gw->stop, "$name: gateway quits gracefully");
}

# A name no node's certificate has: every decision refused within timeout.
my $gw = gateway('wrong', 'ssl_name=other.test');
my $t0 = time;
my $r = http_get('/t?k=x', -port => $gw->port);
my $took = time - $t0;
is(header($r, 'X-RL'), 'FAILED_CLOSED', 'wrong ssl_name: ratelimit_fail');
cmp_ok($took, '<', 2.5 * $RLTest::Nginx::SLOW, sprintf '... within timeout (%.2f s)', $took);
like($gw->error_log_text, qr/ratelimit: redis "127\.0\.0\.1:\d+" TLS certificate does not match "other\.test" \(ssl_name\)/,
    '... and the log says why');
ok($gw->stop, 'gateway quits gracefully');
$cluster->stop;
done_testing;

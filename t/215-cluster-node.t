# A Redis Cluster node named without cluster=on: decisions whose keys live on
# another node get MOVED, follow ratelimit_fail, and the worker says once
# what is wrong, instead of the operator seeing nothing but ratelimit_fail.
use lib 't/lib';
use RLTest;
use RLTest::Cluster;

sub rl { header($_[0], 'X-RL') // '(none)' }

my $cluster = RLTest::Cluster->new(dir => servroot() . '/cluster', primaries => 3, replicas => 0)->start;
my ($port) = $cluster->primaries;
$ENV{TEST_NGINX_CLUSTER_PORT} = $port;

# timeout=2s, as t/320's: the default 200 ms is what a loaded CI machine (prove -j2) can take to
# answer, and a decision of this node's own that times out fails open like a MOVED one.
start_nginx(http_config => <<'EOF', config => <<'EOF');
    ratelimit_redis 127.0.0.1:$TEST_NGINX_CLUSTER_PORT timeout=2s;
    ratelimit_zone api key=$arg_k limit=100 window=10s;
EOF
    add_header X-RL $ratelimit_status always;
    location /t { ratelimit api; }
    location /u { ratelimit api; ratelimit_fail closed; }
EOF

# rl:api:<k>: which node owns the key decides whether this node can answer.
my (%here, %moved);
for my $k (map { "k$_" } 1 .. 30) {
    my $mine = $cluster->primary_of_slot($cluster->keyslot("rl:api:$k")) == $port;
    my $st = rl(http_get("/t?k=$k"));
    ($mine ? $here{$st} : $moved{$st})++;
}
is(join(',', sort keys %here), 'PASSED', 'keys this node owns are decided');
is(join(',', sort keys %moved), 'FAILED_OPEN', 'the others follow ratelimit_fail open');
my ($other) = grep { $cluster->primary_of_slot($cluster->keyslot("rl:api:$_")) != $port }
    map { "k$_" } 1 .. 30;
is(rl(http_get("/u?k=$other")), 'FAILED_CLOSED', 'or closed');

ok(stop_nginx(), 'nginx quits gracefully');
my $log = error_log_text();
my @said = $log =~ /ratelimit: redis "127\.0\.0\.1:$port" is a Redis Cluster node: set cluster=on in "ratelimit_redis"/g;
is(scalar @said, 1, 'said once per worker') or diag($log);
like($log, qr/\[error\].*is a Redis Cluster node/, 'at error level');
like($log, qr/redis replied "MOVED \d+ /, 'each failure is logged as usual');
check_no_alerts($log, 'cluster node');
$cluster->stop;
done_testing();

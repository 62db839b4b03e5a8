# A gateway cut off from Redis while it holds slots (issue 23): two gateway
# hosts (network namespaces, RLTest::Netns) of two workers share one Redis on
# a host of its own and a backend on the test's host that holds requests and
# logs its own view (RLTest::SlowBackend).  Gateway 1 holds the key's 5 slots
# with long requests, then loses Redis (its packets dropped): it can no longer
# renew, so its slots lapse within lease_time (2 s) and gateway 2 goes on,
# admitting the whole limit again.  Gateway 1's requests still run meanwhile:
# the backend's own log measures that over-admission.  Restored, gateway 1's
# renewals find their slots gone and count them as lapsed.  A decision given up
# on during a cut is not delivered to Redis once the network heals.
use lib 't/lib';
use RLTest;
use RLTest::Netns;
use RLTest::SlowBackend qw(max_overlap);
use Time::HiRes qw(time sleep);

my ($ok, $why) = RLTest::Netns->available;
plan skip_all => "network namespaces: $why" unless $ok;

my $net = RLTest::Netns->new(gateways => 2, dir => servroot() . '/netns')->setup;
my $redis = $net->start_redis(port => 6380);
my $addr = $net->redis_addr;
my $backend = RLTest::SlowBackend->start(log => servroot() . '/backend.log', addr => $net->host_addr);
my $up = $net->host_addr . ':' . $backend->port;
for my $g (1, 2) {
    start_nginx(name => "gw$g", $net->nginx_options($g), workers => 2,
        http_config => "    ratelimit_redis $addr:6380 timeout=300ms fail_backoff=200ms;\n"
            . "    ratelimit_zone conc key=\$arg_k limit=5 algorithm=concurrency lease_time=2s;\n"
            . "    ratelimit_zone rate key=\$arg_k limit=5 window=1m;\n"
            . "    ratelimit_metrics_zone 64k;\n",
        config => "        add_header X-RL \$ratelimit_status always;\n"
            . "        location /c { ratelimit conc; proxy_pass http://$up; }\n"
            . "        location /r { ratelimit rate; ratelimit_fail closed; proxy_pass http://$up; }\n"
            . "        location = /admin { ratelimit_admin conc; }\n"
            . "        location = /metrics { ratelimit_metrics; }\n");
}
sub gw { nginx("gw$_[0]")->addr }
sub in_flight {
    my $b = http_request(port => gw(2), request => "GET /admin?key=$_[0]")->{body} // '';
    return $b =~ /"in_flight":(\d+)/ ? $1 : -1;
}

# A cold worker's first decision connects and loads the script first: under
# valgrind that outlasts timeout=300ms. Every worker of both gateways decides
# once before the test (two rounds, as a timed-out first one is no warm-up).
for my $round (1, 2) {
    http_parallel([map { { port => gw(1 + $_ % 2), request => "GET /c?k=warm$_&hold=0" } } 1 .. 16]);
}

my @held = map { http_start(port => gw(1), request => "GET /c?k=kn&hold=12&n=$_") } 1 .. 5;
ok(wait_until(3, sub { in_flight('kn') == 5 }), 'gateway 1 holds the 5 slots');
is(http_request(port => gw(2), request => 'GET /c?k=kn&hold=0')->{status}, 429, 'the key is full for gateway 2');

$net->cut(1, 6380);
my $t0 = time;
my $gone = wait_until(4, sub { in_flight('kn') == 0 }, 0.02);
my $lapse = time - $t0;
ok($gone, sprintf('cut: gateway 1\'s slots lapsed %.2f s after it lost Redis', $lapse));
# A poll is an admin request through a loaded machine: half a second of room.
cmp_ok($lapse, '<=', 2.5, 'cut: within lease_time (2 s) and a poll');
my $res = http_parallel([map { { port => gw(2), request => "GET /c?k=kn&hold=1&m=$_" } } 1 .. 6]);
is(join(' ', sort map { $_->{status} // 'none' } @$res), '200 200 200 200 200 429',
    'cut: gateway 2 goes on, admitting the whole limit again');

$net->restore(1);
# Renewals, not releases, find the slots gone: counted while the requests
# still run (held 12 s, restored 4 to 7 s in), before they end.
my $lapsed_now = sub {
    metric('/metrics', 'ratelimit_concurrency_slots_total{zone="conc",event="lapsed"}', -port => gw(1)) // 0 };
my $t1 = time;
wait_until(5, sub { $lapsed_now->() >= 5 });
is($lapsed_now->(), 5, sprintf('restored: gateway 1\'s renewals found its 5 slots gone: lapsed '
    . '(%.2f s after the restore)', time - $t1));
http_finish($_, 15) for @held;
# The backend logs a request when it ends: read once all have.
my $over = max_overlap($backend->intervals(qr/k=kn&/));
note("cut: the backend saw $over requests of the key at once");
is($over, 10, 'cut: over-admission while the cut gateway\'s 5 requests ran on: 10 at once, '
    . 'bounded by what it held');
ok(wait_until(3, sub { in_flight('kn') == 0 }), 'nothing held afterwards');

# --- A decision given up on is never run later.  Gateway 2 loses Redis while
# a decision is on its way: after timeout it follows ratelimit_fail (closed,
# 503).  The command is still in the kernel's send buffer, and TCP would
# deliver it once the network heals (retransmitted 0.2, 0.6, 1.4 s ... after
# the write, for minutes): Redis would count a request that was refused.  The
# module resets a connection it gives up on, which drops it.
$net->cut(2, 6380);
my $stale = http_request(port => gw(2), request => 'GET /r?k=stale&hold=0');
is($stale->{status}, 503, 'stale: a decision cut off on its way follows ratelimit_fail (closed)');
$net->restore(2);
sleep 2;
is($redis->cmd('ZCARD', 'rl:rate:stale'), 0,
    'stale: once the network healed, Redis never ran it: the refused request is not counted');
my $fresh = http_request(port => gw(2), request => 'GET /r?k=stale&hold=0');
is(($fresh->{status} // 0) . ' ' . (header($fresh, 'RateLimit-Remaining') // '-'), '200 4',
    'stale: the next request is the key\'s first');

ok(stop_nginx("gw$_"), "gw$_ quits gracefully") for 1, 2;
check_no_alerts(error_log_text("gw$_"), "gw$_") for 1, 2;
$backend->stop;
done_testing();

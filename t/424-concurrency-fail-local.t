# ratelimit_fail local with a concurrency zone (issue 23): while Redis cannot
# decide, each worker enforces its share of the in-flight limit from its own
# requests in flight, all-or-nothing with the location's rate zones (decided
# by the local limiter): a request without a slot is not charged a rate unit,
# and a slot comes back when its request ends.  One worker (its share is the
# whole limit), Redis not listening.
use lib 't/lib';
use RLTest;
use RLTest::SlowBackend;
use Time::HiRes qw(sleep);

my $backend = RLTest::SlowBackend->start(log => servroot() . '/backend.log');
my $BPORT = $backend->port;
start_nginx(workers => 1, http_config => <<"EOF", config => <<'EOF');
    ratelimit_redis 127.0.0.1:\$TEST_NGINX_DEAD_PORT timeout=100ms;
    ratelimit_zone conc key=\$arg_k limit=2 algorithm=concurrency;
    ratelimit_zone rate key=\$arg_k limit=4 window=1m;
    upstream backend { server 127.0.0.1:$BPORT; }
EOF
    ratelimit_fail local;
    add_header X-RL $ratelimit_status always;
    location /c { ratelimit conc; ratelimit rate; proxy_pass http://backend; }
EOF

sub rl { my $r = shift; ($r->{status} // 'none') . ' ' . (header($r, 'X-RL') // '-') }

my @slow = map { http_start(port => server_port(), request => "GET /c?k=a&hold=1.5&n=$_") } 1, 2;
sleep 0.5;
is(rl(http_get('/c?k=a&hold=0')), '429 REJECTED_LOCAL', 'local: 2 in flight, the 3rd rejected');
is(rl(http_get('/c?k=a&hold=0')), '429 REJECTED_LOCAL', '... and the 4th');
my $r = http_get('/c?k=b&hold=0');
is(rl($r), '200 PASSED_LOCAL', 'another key has its own slots');
is(header($r, 'RateLimit-Remaining'), '1', '... its headers: the worker\'s share, less this one');
is(join(' ', map { rl(http_finish($_, 5)) } @slow), '200 PASSED_LOCAL 200 PASSED_LOCAL', 'the two slow ones answered');
# Their slots are back; the two rejected were not charged: 2 rate units left of 4.
is(join(', ', map { rl(http_get('/c?k=a&hold=0')) } 1 .. 3),
    '200 PASSED_LOCAL, 200 PASSED_LOCAL, 429 REJECTED_LOCAL',
    'slots back at the end; 2 rate units left: the rejections were not charged');
ok(stop_nginx(), 'nginx quits gracefully');

# The breaker open (fail_threshold=1): a request is decided at once, with no call written; the
# slot it takes locally still comes back when it ends, and when its client goes away.
start_nginx(workers => 1, http_config => <<"EOF", config => <<'EOF');
    ratelimit_redis 127.0.0.1:\$TEST_NGINX_DEAD_PORT timeout=100ms fail_threshold=1 fail_backoff=60s;
    ratelimit_zone conc key=\$arg_k limit=2 algorithm=concurrency;
    upstream backend { server 127.0.0.1:$BPORT; }
EOF
    ratelimit_fail local;
    add_header X-RL $ratelimit_status always;
    location /c { ratelimit conc; proxy_pass http://backend; }
EOF
is(rl(http_get('/c?k=z&hold=0')), '200 PASSED_LOCAL', 'breaker: the first failure opens it');
my @held = map { http_start(port => server_port(), request => "GET /c?k=a&hold=3&n=$_") } 1, 2;
sleep 0.5;
is(rl(http_get('/c?k=a&hold=0')), '429 REJECTED_LOCAL', 'breaker open: 2 in flight, the 3rd rejected');
close $held[0]{sock};
ok(wait_until(5, sub { rl(http_get('/c?k=a&hold=0')) eq '200 PASSED_LOCAL' }, 0.1),
    'breaker open: the slot of a client that went away comes back');
is(rl(http_finish($held[1], 5)), '200 PASSED_LOCAL', 'the other one answered');
is(join(', ', map { rl(http_get('/c?k=a&hold=0')) } 1 .. 2), '200 PASSED_LOCAL, 200 PASSED_LOCAL',
    'breaker open: every slot back');
like(error_log_text(), qr/ratelimit: redis .*request decided by this worker alone by ratelimit_fail/,
    'the failure is logged');
ok(stop_nginx(), 'nginx quits gracefully');

# Without lease_time=, a long timeout lengthens the default instead of failing nginx -t.
my ($rc, $out) = nginx_t(http_config => "    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT timeout=2s;\n"
    . "    ratelimit_zone c key=\$arg_k limit=2 algorithm=concurrency;\n", config => '');
is($rc, 0, 'timeout=2s and the default lease_time: nginx -t passes') or diag($out);
check_no_alerts(error_log_text(), 'fail local');
$backend->stop;
done_testing();

# The breaker's background probe against a Redis that is down (its port
# closed) and then restarted: while down, requests cost no connect attempt
# (only the probes connect, 25 ms, 50 ms, ... apart); once Redis answers
# again, decisions go back to it within a probe interval, not a whole
# fail_backoff later.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(time sleep);

sub rl { header($_[0], 'X-RL') // '(none)' }

start_nginx(http_config => <<'EOF', config => <<'EOF');
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=300ms fail_threshold=3 fail_backoff=5s;
    ratelimit_zone api key=$arg_k limit=1000 window=10s;
    ratelimit_metrics_zone 64k;
EOF
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
    location = /metrics { ratelimit_metrics; }
EOF

sub connects { metric('/metrics', 'ratelimit_redis_connects_total') }

is(rl(http_get('/t?k=a')), 'PASSED', 'Redis answers');
redis()->stop;
my @st = map { rl(http_get('/t?k=a')) } 1 .. 5;
is("@st", join(' ', ('FAILED_OPEN') x 5), 'Redis down: requests follow ratelimit_fail');

# Breaker open now. 200 requests over about 1.5 s: the probes connect
# (25+50+...+800 ms: about 7), the requests not at all.
my $before = connects();
my $t0 = time;
my %by;
while (time - $t0 < 1.5) {
    $by{$_}++ for map { rl(http_get('/t?k=a')) } 1 .. 10;
}
my $made = connects() - $before;
my $n = 0;
$n += $_ for values %by;
cmp_ok($n, '>=', 50, "$n requests while Redis was down");
is_deeply(\%by, { FAILED_OPEN => $n }, 'every one by ratelimit_fail (FAILED_OPEN)')
    or diag(explain \%by);
cmp_ok($made, '>=', 1, "$made connect attempts meanwhile: the probes ran");
cmp_ok($made, '<=', 10, "and none per request");

redis()->start;
my $up = time;
wait_until(6, sub { rl(http_get('/t?k=b')) eq 'PASSED' }, 0.01);
my $took = time - $up;
is(rl(http_get('/t?k=b')), 'PASSED', 'Redis decides again');
cmp_ok($took, '<', 1, "${took}s after Redis answered PING again (fail_backoff=5s)");
Test::More::diag(sprintf 'recovery after the restart: %.0f ms', $took * 1000);

ok(stop_nginx(), 'nginx quits gracefully');
my $log = error_log_text();
like($log, qr/failed 3 times in a row, not asked until it answers a probe/, 'the breaker opened');
like($log, qr/ratelimit: redis "[^"]+" answers again/, 'and closed');
check_no_alerts($log, 'probe');
done_testing();

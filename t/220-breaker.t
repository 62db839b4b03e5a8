# The circuit breaker: after fail_threshold consecutive failures the worker
# stops asking Redis and applies ratelimit_fail at once; a background probe
# (PING on a connection of its own, 25 ms after the opening, then twice as
# long each time up to fail_backoff) closes it as soon as Redis answers again,
# not a whole fail_backoff later. State changes are logged once each.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(time sleep);

sub rl { header($_[0], 'X-RL') // '(none)' }
sub timed { my $t = time; my $r = http_get($_[0]); return ($r, time - $t) }

start_nginx(http_config => <<'EOF', config => <<'EOF');
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=300ms fail_threshold=3 fail_backoff=5s;
    ratelimit_zone api key=$arg_k limit=100 window=10s;
EOF
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
EOF

is(rl(http_get('/t?k=a')), 'PASSED', 'Redis answers');
my $pid = redis()->pid;
kill 'STOP', $pid;
my @slow;
for (1 .. 3) {
    my ($r, $took) = timed('/t?k=a');
    is(rl($r), 'FAILED_OPEN', "silent Redis, request $_: fail open");
    push @slow, $took;
}
cmp_ok($_, '>=', 0.25, "each of the first three waited for the timeout ($_ s)") for @slow;
cmp_ok($_, '<', 2, "and no longer than about the timeout ($_ s)") for @slow;

my ($fast, $max) = (0, 0);
for (1 .. 20) {
    my ($r, $took) = timed('/t?k=a');
    $fast++ if rl($r) eq 'FAILED_OPEN' && $took < 0.2;
    $max = $took if $took > $max;
}
is($fast, 20, "breaker open: 20 requests answered at once (slowest ${max}s)");

# The probes out while Redis was stopped timed out, each doubling the delay;
# the one out (or the next, at most ~0.4 s away by now) sees it answer.
kill 'CONT', $pid;
my $t0 = time;
wait_until(6, sub { rl(http_get('/t?k=b')) eq 'PASSED' }, 0.02);
my $took = time - $t0;
is(rl(http_get('/t?k=b')), 'PASSED', 'Redis is asked again and answers');
cmp_ok($took, '<', 1, "decided by Redis ${took}s after it answered again, well within fail_backoff (5 s)");

ok(stop_nginx(), 'nginx quits gracefully');
my $log = error_log_text();
my $opened = () = $log =~ /failed 3 times in a row, not asked until it answers a probe \(every 5000ms at most\)/g;
is($opened, 1, 'the opening is logged once');
my $again = () = $log =~ /ratelimit: redis "[^"]+" answers again/g;
is($again, 1, 'so is the recovery');
check_no_alerts($log, 'breaker');
done_testing();

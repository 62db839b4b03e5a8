# A silent, slow or restarting Redis: the decision still comes within
# `timeout`, the worker keeps serving others meanwhile, the log is not
# flooded, and the module recovers by itself.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(time sleep);
use IO::Select;
use IO::Socket::INET;
use Socket;
use POSIX ();

my $http = <<'EOF';
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=300ms pool_size=2;
    ratelimit_zone api key=$arg_k limit=1000 window=10s clock=nginx;
EOF
my $config = <<'EOF';
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
    location /c { ratelimit api; ratelimit_fail closed; add_header X-RL $ratelimit_status always; }
    location /u { }
EOF

my $redis = redis();
sub rl { header($_[0], 'X-RL') // ($_[0]{error} ? "error: $_[0]{error}" : '(none)') }
sub ratelimit_errors { scalar(() = $_[0] =~ /\[error\][^\n]*ratelimit:/g) }

start_nginx(http_config => $http, config => $config);
is(rl(http_get('/t?k=a')), 'PASSED', 'warm-up decision passes');

# --- Redis stopped: fail open / closed within the timeout
kill 'STOP', $redis->pid;
my $r = http_get('/t?k=a');
is($r->{status}, 200, 'stopped Redis, fail open: 200');
is(rl($r), 'FAILED_OPEN', 'stopped Redis, fail open: FAILED_OPEN');
cmp_ok($r->{elapsed}, '>=', 0.25, 'the module waited for the timeout');
cmp_ok($r->{elapsed}, '<', 2.0, 'decided within timeout=300ms (+ margin)');
$r = http_get('/c?k=a');
is($r->{status}, 503, 'stopped Redis, fail closed: 503');
is(rl($r), 'FAILED_CLOSED', 'stopped Redis, fail closed: FAILED_CLOSED');
cmp_ok($r->{elapsed}, '<', 2.0, 'fail closed within timeout (+ margin)');
kill 'CONT', $redis->pid;
ok(wait_until(5, sub { rl(http_get('/t?k=a')) eq 'PASSED' }, 0.1),
    'after Redis resumes, decisions pass again');
like(error_log_text(), qr/\[error\][^\n]*ratelimit:[^\n]*tim/i, 'the error log says it timed out');

# --- While Redis is silent the same (only) worker serves everyone else
stop_nginx();
start_nginx(workers => 1, http_config => $http =~ s/timeout=300ms/timeout=3s/r,
    config => $config);
is(rl(http_get('/t?k=b')), 'PASSED', 'warm-up');
kill 'STOP', $redis->pid;
my $pending = http_start(port => server_port(), request => 'GET /t?k=b');
sleep 0.1;
my $t0 = time;
my $ok = 0;
for (1 .. 50) { $ok++ if http_get('/u')->{status} == 200 }
my $spent = time - $t0;
is($ok, 50, 'other requests are served while a decision is pending');
cmp_ok($spent, '<', 2.0, '50 unlimited requests took < 2 s with Redis stopped');
ok(!IO::Select->new($pending->{sock})->can_read(0), 'the limited request is still waiting');
kill 'CONT', $redis->pid;
$r = http_finish($pending, 10);
is($r->{status}, 200, 'the pending request completes once Redis answers');
is(rl($r), 'PASSED', 'and it is a real decision, not a timeout');
cmp_ok($r->{elapsed}, '<', 3.0, 'answered before its timeout');

# --- DEBUG SLEEP from another client: Redis busy rather than stopped
stop_nginx();
start_nginx(http_config => $http, config => $config);
is(rl(http_get('/t?k=c')), 'PASSED', 'warm-up');
my $kid = fork // die;
if ($kid == 0) {
    eval { redis_client()->cmd('DEBUG', 'SLEEP', '1.5') };
    POSIX::_exit(0);
}
sleep 0.2;
$r = http_get('/t?k=c');
is(rl($r), 'FAILED_OPEN', 'busy Redis (DEBUG SLEEP): fail open');
cmp_ok($r->{elapsed}, '<', 1.2, 'decided before Redis woke up');
waitpid $kid, 0;
ok(wait_until(5, sub { rl(http_get('/t?k=c')) eq 'PASSED' }, 0.1), 'recovers after the sleep');

# --- A flood while Redis is stopped: every request decided, log not flooded
my $before = length error_log_text();
kill 'STOP', $redis->pid;
my $res = http_parallel([map { { port => server_port(), request => "GET /t?k=f$_" } } 1 .. 40],
    timeout => 15);
kill 'CONT', $redis->pid;
is(scalar(grep { $_->{status} && $_->{status} == 200 && rl($_) eq 'FAILED_OPEN' } @$res), 40,
    '40 concurrent requests all failed open');
my @slow = grep { !defined $_->{elapsed} || $_->{elapsed} > 2.5 } @$res;
is(scalar @slow, 0, 'each within timeout (+ margin)');
my $flood_log = substr(error_log_text(), $before);
my $lines = ratelimit_errors($flood_log);
cmp_ok($lines, '>=', 1, 'the failure is logged');
cmp_ok($lines, '<=', 10, "not once per request ($lines error lines for 40 requests)")
    or diag($flood_log);
ok(wait_until(5, sub { rl(http_get('/t?k=a')) eq 'PASSED' }, 0.1), 'recovers after the flood');

# --- Redis restarted: connections cut, script cache gone
$redis->restart;
my @seen;
ok(wait_until(5, sub { push @seen, rl(http_get('/t?k=r')); $seen[-1] eq 'PASSED' }, 0.1),
    'after a Redis restart decisions pass again');
cmp_ok(scalar(grep { $_ ne 'PASSED' } @seen), '<=', 1,
    'at most one request failed over the restart (' . join(',', @seen) . ')');

# --- Redis gone and back
$redis->stop;
$r = http_get('/t?k=d');
is(rl($r), 'FAILED_OPEN', 'Redis stopped: fail open');
cmp_ok($r->{elapsed}, '<', 2.0, 'refused connections are decided quickly');
$redis->start;
ok(wait_until(5, sub { rl(http_get('/t?k=d')) eq 'PASSED' }, 0.2), 'reconnects by itself');

ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'slow redis');

# --- A Redis address that never completes the TCP handshake: a listener
# with a full accept queue (backlog 0, one connection parked) drops SYNs.
socket(my $hole, PF_INET, SOCK_STREAM, 0) or die "socket: $!";
bind($hole, pack_sockaddr_in(0, inet_aton('127.0.0.1'))) or die "bind: $!";
listen($hole, 0) or die "listen: $!";
my ($hole_port) = unpack_sockaddr_in(getsockname($hole));
my $parked = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $hole_port, Timeout => 2)
    or die "cannot park a connection: $!";
for my $case (['timeout=3s connect_timeout=200ms', 0.15, 1.5, 'connect_timeout'],
              ['timeout=300ms connect_timeout=5s', 0.25, 1.5, 'timeout (the whole budget)']) {
    my ($params, $min, $max, $what) = @$case;
    start_nginx(http_config => "    ratelimit_redis 127.0.0.1:$hole_port $params;\n"
        . "    ratelimit_zone api key=\$arg_k limit=10 window=10s clock=nginx;\n",
        config => $config);
    $r = http_get('/t?k=h');
    is(rl($r), 'FAILED_OPEN', "unanswered connect, $params: fail open");
    cmp_ok($r->{elapsed}, '>=', $min, "$params: waited for the $what");
    cmp_ok($r->{elapsed}, '<', $max, "$params: decided by the $what");
    ok(stop_nginx(), 'nginx quits gracefully');
    my $log = error_log_text();
    like($log, qr/\[error\][^\n]*ratelimit:[^\n]*tim/i, "$params: the log says it timed out");
    check_no_alerts($log, "unanswered connect, $params");
}
close $parked;
close $hole;

done_testing();

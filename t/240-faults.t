# The fault cases not covered elsewhere: Redis absent at start, Redis killed
# under sustained traffic and restarted empty, SCRIPT FLUSH / FLUSHALL under
# traffic, worker_shutdown_timeout with decisions stuck on a silent Redis,
# and worker_connections exhausted.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(time sleep);

my $redis = redis();
sub rl { header($_[0], 'X-RL') // ($_[0]{error} ? "error: $_[0]{error}" : '(none)') }
sub burst {
    my ($n, $key) = @_;
    my $res = http_parallel([map { { port => server_port(), request => "GET /t?k=$key" } } 1 .. $n]);
    my %by;
    $by{ rl($_) }++ for @$res;
    return \%by;
}
my %conf = (http_config => <<'EOF', config => <<'EOF');
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=500ms fail_backoff=300ms;
    ratelimit_zone api key=$arg_k limit=20 window=30s;
EOF
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
EOF

# 1. Redis not running when nginx starts; started later: no reload needed.
$redis->stop;
start_nginx(%conf);
is(rl(http_get('/t?k=a')), 'FAILED_OPEN', 'no Redis at start: fail open');
$redis->start;
ok(wait_until(5, sub { rl(http_get('/t?k=a')) eq 'PASSED' }, 0.1), 'Redis started later: limiting resumes');
my $by = burst(40, 'exact1');
is($by->{PASSED}, 20, 'and is exact: 20 of 40 admitted');

# 2. Redis killed under sustained traffic, restarted with an empty script cache.
my @h = map { http_start(port => server_port(), request => "GET /t?k=s$_") } 1 .. 30;
kill 'KILL', $redis->pid;
my @res = map { http_finish($_, 10) } @h;
is(scalar(grep { rl($_) =~ /^(PASSED|FAILED_OPEN)$/ } @res), 30,
    'decisions in flight when Redis dies: real answers or fail open, nothing else');
$redis->stop;
$redis->start;
ok(wait_until(5, sub { rl(http_get('/t?k=b')) eq 'PASSED' }, 0.1), 'restarted Redis (no script cached) decides again');
$by = burst(40, 'exact2');
is($by->{PASSED}, 20, 'exactly 20 of 40 admitted after the restart');

# 5. SCRIPT FLUSH and FLUSHALL while requests keep coming.
my %seen;
for my $i (1 .. 60) {
    redis_cmd('SCRIPT', 'FLUSH') if $i % 10 == 0;
    redis_cmd('FLUSHALL') if $i % 15 == 0;
    $seen{ rl(http_get("/t?k=f$i")) }++;
}
is_deeply(\%seen, { PASSED => 60 }, 'SCRIPT FLUSH / FLUSHALL under traffic: every decision still made');
ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'absent, killed, flushed');

# 7. worker_shutdown_timeout bounds a quit whose decisions wait on a silent Redis.
start_nginx(main_config => 'worker_shutdown_timeout 1s;', http_config => <<'EOF', config => $conf{config});
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=20s;
    ratelimit_zone api key=$arg_k limit=20 window=30s;
EOF
is(rl(http_get('/t?k=w')), 'PASSED', 'warm-up');
kill 'STOP', $redis->pid;
@h = map { http_start(port => server_port(), request => "GET /t?k=q$_") } 1 .. 10;
sleep 0.3;
my $master = nginx()->pid;
my $t0 = time;
kill 'QUIT', $master;
ok(wait_until(10, sub { !RLTest::Proc::alive($master) }, 0.05), 'nginx exits');
my $took = time - $t0;
cmp_ok($took, '<', 6, sprintf('within worker_shutdown_timeout plus a margin (%.1fs, decisions would wait 20s)', $took));
kill 'CONT', $redis->pid;
http_finish($_, 1) for @h;
ok(stop_nginx(), 'nothing left to stop');
my $log = error_log_text();
unlike($log, qr/exited on signal/, 'no worker crashed');
check_no_alerts($log, 'worker_shutdown_timeout');

# 8. worker_connections exhausted: Redis connections cannot be opened.
start_nginx(events => 'worker_connections 16;', %conf);
my @idle = map { RLTest::HTTP::connect_to(server_port()) } 1 .. 14;
my $r = http_get('/t?k=c');
# nginx frees idle client connections for new ones ("reusing connections"), so the request is
# still answered, with a decision or by the fail policy.
like(rl($r), qr/^(PASSED|FAILED_OPEN)$/, 'a request when connections run out is answered ('
    . rl($r) . ')');
close $_ for grep { defined } @idle;
ok(wait_until(5, sub { rl(http_get('/t?k=c')) eq 'PASSED' }, 0.1), 'connections free again: decisions pass');
ok(stop_nginx(), 'nginx quits gracefully');
$log = error_log_text();
like($log, qr/worker_connections are not enough/, 'nginx says why');
unlike($log, qr/exited on signal/, 'no worker crashed');
done_testing();

# Things that happen to the Redis connections from the outside: Redis
# closes idle ones, Redis dies with decisions in flight, a reload points
# nginx at another address; and nginx in single-process mode.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(time sleep);

my $redis = redis();
sub rl { header($_[0], 'X-RL') // ($_[0]{error} ? "error: $_[0]{error}" : '(none)') }
sub conf {
    my ($addr, %o) = @_;
    return (http_config => "    ratelimit_redis $addr timeout=3s pool_size=2;\n"
            . "    ratelimit_zone api key=\$arg_k limit=1000 window=10s clock=nginx;\n"
            . "    ratelimit_zone one key=\$arg_k limit=1 window=10s clock=nginx;\n",
        config => "    location /t { ratelimit api; add_header X-RL \$ratelimit_status always; }\n"
            . "    location /u { ratelimit one; add_header X-RL \$ratelimit_status always; }\n",
        %o);
}
my $addr = '127.0.0.1:$TEST_NGINX_REDIS_PORT';

# --- Redis closes the pooled connections while they are idle
start_nginx(workers => 1, conf($addr));
is(scalar(grep { rl(http_get("/t?k=w$_")) eq 'PASSED' } 1 .. 5), 5, 'warm-up');
my $killed = redis_cmd('CLIENT', 'KILL', 'TYPE', 'normal', 'SKIPME', 'yes');
cmp_ok($killed, '>=', 1, "CLIENT KILL closed $killed nginx connection(s)");
sleep 0.2;
my @seen = map { rl(http_get("/t?k=a$_")) } 1 .. 5;
is("@seen", 'PASSED PASSED PASSED PASSED PASSED',
    'a connection Redis closed while idle is not used for a decision');

# --- Redis's own idle timeout does the same
redis_cmd('CONFIG', 'SET', 'timeout', 1);
is(rl(http_get('/t?k=b')), 'PASSED', 'decision before the idle timeout');
ok(wait_until(5, sub { !$redis->foreign_clients }, 0.2), 'Redis dropped the idle connections');
@seen = map { rl(http_get("/t?k=b$_")) } 1 .. 3;
is("@seen", 'PASSED PASSED PASSED', 'decisions after Redis timed the connections out');
redis_cmd('CONFIG', 'SET', 'timeout', 0);

# --- Redis dies with decisions in flight on its connections
kill 'STOP', $redis->pid;
my @h = map { http_start(port => server_port(), request => "GET /t?k=d$_") } 1 .. 10;
sleep 0.2;
kill 'KILL', $redis->pid;
kill 'CONT', $redis->pid;
my @res = map { http_finish($_, 10) } @h;
is(scalar(grep { rl($_) eq 'FAILED_OPEN' } @res), 10, 'decisions cut off by the crash fail open');
my ($slowest) = sort { $b <=> $a } map { $_->{elapsed} // 99 } @res;
cmp_ok($slowest, '<', 4.5, sprintf('within the timeout (slowest %.2fs, timeout=3s)', $slowest));
$redis->stop;
$redis->start;
# A failure on a connection starts the module's reconnect back-off (1 s),
# during which decisions fail at once rather than each trying to connect.
my $back = time;
@seen = ();
ok(wait_until(5, sub { push @seen, rl(http_get('/t?k=e')); $seen[-1] eq 'PASSED' }, 0.1),
    'decisions pass once Redis is back');
my $gap = time - $back;
cmp_ok($gap, '<', 2.5, sprintf('within %.1fs of Redis returning (%d failed meanwhile)',
    $gap, scalar grep { $_ ne 'PASSED' } @seen));
ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'redis events');

# --- A reload that changes the Redis address
start_nginx(workers => 2, conf('127.0.0.1:$TEST_NGINX_DEAD_PORT'));
is(rl(http_get('/t?k=f')), 'FAILED_OPEN', 'old address: nothing listens');
my @old = nginx()->worker_pids;
reload_nginx(conf($addr, workers => 2));
ok(wait_until(10, sub { !grep { RLTest::Proc::alive($_) } @old }), 'old workers exit');
is(rl(http_get('/t?k=f')), 'PASSED', 'the new workers use the new address');
ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'address change');

# --- Single-process mode.  (A HUP in this mode is not tested: plain nginx
# without the module stops answering after it, too.)
start_nginx(conf($addr, main_config => 'master_process off;'));
@seen = map { rl(http_get('/u?k=s')) } 1 .. 2;
is("@seen", 'PASSED REJECTED', 'master_process off: limiting works');
ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'single process');

done_testing();

# Reload (HUP) and graceful quit with decisions in flight: every pending
# request is answered, no crash, no "open socket left", and the new workers
# connect to Redis by themselves.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(time sleep);

my $redis = redis();
sub rl { header($_[0], 'X-RL') // ($_[0]{error} ? "error: $_[0]{error}" : '(none)') }
sub pending { map { http_start(port => server_port(), request => "GET /t?k=$_[0]$_") } 1 .. $_[1] }

my $http = <<'EOF';
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=2s pool_size=2;
    ratelimit_zone api key=$arg_k limit=1000 window=10s clock=nginx;
EOF
my $config = <<'EOF';
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
EOF

start_nginx(workers => 2, http_config => $http, config => $config);
is(rl(http_get('/t?k=w')), 'PASSED', 'warm-up');

# --- HUP while Redis holds the decisions; Redis answers after the reload
kill 'STOP', $redis->pid;
my @h = pending('a', 10);
sleep 0.2;
my @old = nginx()->worker_pids;
ok(scalar(reload_nginx()), 'reload: new workers started');
kill 'CONT', $redis->pid;
my @res = map { http_finish($_, 10) } @h;
is(scalar(grep { rl($_) eq 'PASSED' } @res), 10, 'requests in flight over a reload get real decisions');
ok(wait_until(10, sub { !grep { RLTest::Proc::alive($_) } @old }), 'old workers exit');
is(rl(http_get('/t?k=n')), 'PASSED', 'new workers decide (they connected by themselves)');

# --- HUP while Redis stays silent past the timeout: old workers time out
kill 'STOP', $redis->pid;
@h = pending('b', 10);
sleep 0.2;
@old = nginx()->worker_pids;
reload_nginx();
@res = map { http_finish($_, 10) } @h;
kill 'CONT', $redis->pid;
is(scalar(grep { rl($_) eq 'FAILED_OPEN' } @res), 10, 'timed-out decisions over a reload fail open');
ok(wait_until(10, sub { !grep { RLTest::Proc::alive($_) } @old }), 'old workers exit');
ok(wait_until(5, sub { rl(http_get('/t?k=n')) eq 'PASSED' }, 0.1), 'new workers decide');

# --- Many reloads under a steady stream of requests
my ($answered, $passed) = (0, 0);
for my $i (1 .. 5) {
    my @burst = pending("c$i", 20);
    reload_nginx();
    for (map { http_finish($_, 10) } @burst) {
        $answered++ if $_->{status};
        $passed++ if rl($_) eq 'PASSED';
    }
}
is($answered, 100, 'every request over five reloads is answered');
is($passed, 100, 'every one with a real decision');

# --- A new config on reload (another zone) takes effect
@old = nginx()->worker_pids;
reload_nginx(workers => 2, http_config => $http . "    ratelimit_zone one key=\$arg_k limit=1 window=10s clock=nginx;\n",
    config => "    location /t { ratelimit one; add_header X-RL \$ratelimit_status always; }\n");
# Until the old workers have left, one of them may still take a connection.
ok(wait_until(10, sub { !grep { RLTest::Proc::alive($_) } @old }), 'old workers exit');
my @s = map { http_get('/t?k=z')->{status} } 1 .. 2;
is("@s", '200 429', 'the reloaded configuration is in force');

# --- Graceful quit with decisions in flight
kill 'STOP', $redis->pid;
@h = pending('q', 10);
sleep 0.2;
my $master = nginx()->pid;
kill 'QUIT', $master;
sleep 0.3;
kill 'CONT', $redis->pid;
@res = map { http_finish($_, 10) } @h;
is(scalar(grep { ($_->{status} // 0) == 200 } @res), 10, 'requests in flight at QUIT are answered');
ok(wait_until(10, sub { !RLTest::Proc::alive($master) }), 'master exits');
ok(stop_nginx(), 'nothing left to stop');
check_no_alerts(error_log_text(), 'reloads and quit');

# --- Graceful quit while Redis stays silent: the timeout ends the wait
start_nginx(workers => 2, http_config => $http, config => $config);
is(rl(http_get('/t?k=w')), 'PASSED', 'warm-up');
kill 'STOP', $redis->pid;
@h = pending('t', 10);
sleep 0.2;
$master = nginx()->pid;
my $t0 = time;
kill 'QUIT', $master;
@res = map { http_finish($_, 10) } @h;
ok(wait_until(10, sub { !RLTest::Proc::alive($master) }), 'master exits');
my $took = time - $t0;
kill 'CONT', $redis->pid;
is(scalar(grep { rl($_) eq 'FAILED_OPEN' } @res), 10, 'pending decisions fail open at quit');
cmp_ok($took, '<', 5, "quit took $took s (timeout=2s)");
stop_nginx();
check_no_alerts(error_log_text(), 'quit with Redis silent');
done_testing();

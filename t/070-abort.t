# Clients that disconnect while their decision is pending: no crash, no
# alert, no leaked connection; the worker goes on serving.  Redis is
# SIGSTOPped so that the decisions are certainly pending.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(time sleep);

my $redis = redis();
sub rl { header($_[0], 'X-RL') // ($_[0]{error} ? "error: $_[0]{error}" : '(none)') }

start_nginx(workers => 1, http_config => <<'EOF', config => <<'EOF');
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=1s pool_size=2;
    ratelimit_zone api key=$arg_k limit=1000 window=10s clock=nginx;
    log_format rl '$status $ratelimit_status $request_uri';
EOF
    access_log logs/access.log rl;
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
    location /u { }
EOF

is(rl(http_get('/t?k=w')), 'PASSED', 'warm-up');
my ($worker) = nginx()->worker_pids;
ok($worker, "worker $worker");

sub abort_requests {
    my ($n, $tag) = @_;
    my @h = map { http_start(port => server_port(), request => "GET /t?k=$tag$_") } 1 .. $n;
    sleep 0.2;
    close $_->{sock} for @h;
}

# 1: the reply arrives after the client left
kill 'STOP', $redis->pid;
abort_requests(5, 'a');
sleep 0.2;
kill 'CONT', $redis->pid;
sleep 0.3;
is(rl(http_get('/t?k=x')), 'PASSED', 'reply after abort: worker still decides');

# 2: the timeout fires after the client left
kill 'STOP', $redis->pid;
abort_requests(5, 'b');
sleep 1.5;    # past timeout=1s
kill 'CONT', $redis->pid;
ok(wait_until(5, sub { rl(http_get('/t?k=x')) eq 'PASSED' }, 0.1),
    'timeout after abort: worker recovers');

# 3: some clients leave, others stay, all on the same pipelined connections
kill 'STOP', $redis->pid;
my @stay  = map { http_start(port => server_port(), request => "GET /t?k=s$_") } 1 .. 10;
my @leave = map { http_start(port => server_port(), request => "GET /t?k=l$_") } 1 .. 10;
sleep 0.2;
close $_->{sock} for @leave;
sleep 0.1;
kill 'CONT', $redis->pid;
my @res = map { http_finish($_, 10) } @stay;
is(scalar(grep { ($_->{status} // 0) == 200 } @res), 10, 'clients that stayed are answered');
is(scalar(grep { rl($_) eq 'PASSED' } @res), 10, 'with real decisions');

# 4: a burst of clients that leave at once, Redis running
for my $round (1 .. 3) {
    my @h = map { http_start(port => server_port(), request => "GET /t?k=r$round$_") } 1 .. 50;
    close $_->{sock} for @h;
}
sleep 0.5;
my $ok = grep { http_get('/t?k=y')->{status} == 200 } 1 .. 20;
is($ok, 20, 'after 150 aborted requests the worker serves normally');

my ($after) = nginx()->worker_pids;
is($after, $worker, 'the worker never crashed (same pid)');

ok(stop_nginx(), 'nginx quits gracefully');
my $log = error_log_text();
check_no_alerts($log, 'abort');
like(access_log_text(), qr/^499 PENDING /m, 'aborted requests are logged as 499 with $ratelimit_status PENDING');
done_testing();

# Per-worker connection pool: many concurrent decisions share at most
# pool_size connections per worker, several in flight on one connection
# (pipelining), those of one event-loop iteration in one script call
# (batching), and idle connections close after keepalive_timeout.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(sleep);

my $redis = redis();
sub rl { header($_[0], 'X-RL') // ($_[0]{error} ? "error: $_[0]{error}" : '(none)') }
sub connections_received {
    (redis_cmd('INFO', 'stats') =~ /^total_connections_received:(\d+)/m)[0];
}
sub burst {
    my ($n, $key) = @_;
    my $res = http_parallel([map { { port => server_port(), request => "GET /t?k=$key" } } 1 .. $n]);
    return scalar grep { rl($_) eq 'PASSED' } @$res;
}
sub conf {
    my ($params) = @_;
    my $http = <<"EOF";
    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT $params;
    ratelimit_zone api key=\$arg_k limit=100000 window=10s clock=nginx;
EOF
    my $config = <<'EOF';
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
EOF
    return (http_config => $http, config => $config);
}

# Bytes received by Redis's server-side sockets but not yet read by Redis.
sub redis_rx_queue {
    my ($port) = @_;
    my $hex = sprintf '%04X', $port;
    my $total = 0;
    for my $file ('/proc/net/tcp', '/proc/net/tcp6') {
        open my $fh, '<', $file or next;
        while (<$fh>) {
            my @f = split ' ';
            next unless @f > 4 && $f[1] =~ /:$hex$/ && $f[3] eq '01';
            my (undef, $rx) = split /:/, $f[4];
            $total += hex $rx;
        }
    }
    return $total;
}

# The harness's own connection exists before RESETSTAT, so from then on the
# counter only sees nginx.
for my $case ([1, 2, 200], [1, 1, 300], [2, 1, 300]) {
    my ($workers, $pool, $n) = @$case;
    my $tag = "workers=$workers pool_size=$pool";
    start_nginx(workers => $workers, conf("pool_size=$pool timeout=5s"));
    redis_cmd('CONFIG', 'RESETSTAT');
    is(burst($n, "w$workers$pool"), $n, "$tag: $n concurrent requests all decided");
    my $opened = connections_received();
    cmp_ok($opened, '<=', $workers * $pool, "$tag: nginx opened $opened Redis connection(s)");
    my @c = $redis->foreign_clients;
    cmp_ok(scalar @c, '<=', $workers * $pool, "$tag: " . scalar(@c) . ' connection(s) kept');
    ok(stop_nginx(), "$tag: nginx quits gracefully");
    check_no_alerts(error_log_text(), $tag);
}

# Pipelining: with one connection and Redis stopped, the decisions pile up
# in that connection's socket buffer instead of waiting in nginx one by one.
start_nginx(workers => 1, conf('pool_size=1 timeout=5s'));
is(rl(http_get('/t?k=p')), 'PASSED', 'warm-up');
kill 'STOP', $redis->pid;
my @h = map { http_start(port => server_port(), request => "GET /t?k=p$_") } 1 .. 30;
sleep 0.5;
my $queued = redis_rx_queue($redis->port);
kill 'CONT', $redis->pid;
my @res = map { http_finish($_, 10) } @h;
is(scalar(grep { rl($_) eq 'PASSED' } @res), 30, '30 decisions over one connection');
# One EVALSHA of this config is ~170 bytes.
cmp_ok($queued, '>=', 10 * 150, "they were sent without waiting for each reply ($queued bytes queued)");
ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'pipelining');

# Batching: decisions queued on one connection while it cannot write go out as
# script calls of up to 64 decisions.  A new connection holds everything
# behind its AUTH until Redis answers it (here, stopped): then 300 decisions
# leave together, in 5 calls.
start_nginx(workers => 1, conf('pool_size=1 timeout=5s password=unused'));
redis_cmd('CONFIG', 'RESETSTAT');
kill 'STOP', $redis->pid;
@h = map { http_start(port => server_port(), request => "GET /t?k=b$_") } 1 .. 300;
sleep 0.5;
kill 'CONT', $redis->pid;
@res = map { http_finish($_, 10) } @h;
is(scalar(grep { rl($_) eq 'PASSED' } @res), 300, '300 decisions queued behind AUTH');
my ($calls) = redis_cmd('INFO', 'commandstats') =~ /^cmdstat_evalsha:calls=(\d+)/m;
is($calls, 5, 'in 5 script calls of at most 64 decisions');
ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'batching');

# keepalive_timeout closes idle connections; the next decision reconnects.
start_nginx(workers => 1, conf('pool_size=2 keepalive_timeout=1s'));
is(burst(20, 'k'), 20, 'burst');
ok(scalar($redis->foreign_clients), 'connections open after the burst');
ok(wait_until(5, sub { !$redis->foreign_clients }, 0.2), 'idle connections closed after keepalive_timeout');
is(rl(http_get('/t?k=k')), 'PASSED', 'the next decision reconnects');
ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'keepalive_timeout');

# Issue 19: a keepalive shorter than 300 ms was the reply deadline (nginx keeps an armed timer
# within 300 ms of a new one), so 0 and 1ms kept the connection between decisions 100 ms apart.
# 0 is nginx's "no keepalive": closed as soon as idle. A call leaves the connection's timer where
# it is: a reply deadline (200 ms) still armed when the connection goes idle fires during a
# longer keepalive and must set its rest, not close it early (1s, decisions 400 ms apart).
for my $case (['0', 5, 0.1], ['1ms', 5, 0.1], ['50ms', 5, 0.1], ['10s', 1, 0.1], ['1s', 1, 0.4]) {
    my ($timeout, $want, $gap) = @$case;
    start_nginx(workers => 1, conf("keepalive_timeout=$timeout"));
    my $before = connections_received();
    my @st;
    for (1 .. 5) {
        push @st, rl(http_get("/t?k=ka$timeout"));
        sleep $gap;
    }
    is("@st", join(' ', ('PASSED') x 5), "keepalive_timeout=$timeout: five decisions");
    is(connections_received() - $before, $want,
        "keepalive_timeout=$timeout: $want connection(s) for five decisions ${\ ($gap * 1000)} ms apart");
    ok(stop_nginx(), "keepalive_timeout=$timeout: nginx quits gracefully");
    check_no_alerts(error_log_text(), "keepalive_timeout=$timeout");
}

done_testing();

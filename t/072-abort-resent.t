# Clients that disconnect while their decision is on its way a second time. A script call
# refused for one of its keys (NOPERM) is sent again decision by decision, behind a call
# written after it, so the decisions in flight are no longer in the order of their numbers;
# each one of a request that went away must still be found and dropped, or its reply, when
# it comes, is handed to a request nginx has freed.
#
# The order is made certain: Redis is SIGSTOPped while the worker's one connection is set up,
# so that 65 decisions wait for it and go out as two calls in one write (64 decisions at most
# per call), the first with the refused key. CLIENT PAUSE WRITE holds the second call (and all
# behind it) while Redis answers the first with NOPERM at once (its ACL check comes before the
# pause): the 64 decisions sent again are in flight behind the second call when their clients
# go away, and their replies come after, once the pause is lifted.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(sleep);

my $redis = redis();
redis_cmd('ACL', 'SETUSER', 'lim', 'on', '>pw', '~rl:*', '+@all', 'allchannels');
start_nginx(workers => 1, http_config => <<'EOF', config => <<'EOF');
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT user=lim password=pw timeout=10s pool_size=1;
    ratelimit_zone api key=$arg_k limit=1000 window=1m;
    ratelimit_zone outside key=other:$arg_k limit=1000 window=1m exact_key=on;
    log_format rl '$status $ratelimit_status $request_uri';
EOF
    access_log logs/access.log rl;
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
    location /o { ratelimit outside; }
EOF
my ($worker) = nginx()->worker_pids;
ok($worker, "worker $worker");
# Under valgrind the worker takes ten times as long to take the requests in.
my $SLOW = RLTest::Nginx::valgrind() ? 10 : 1;

redis_cmd('CLIENT', 'PAUSE', 60_000, 'WRITE');
kill 'STOP', $redis->pid;
# The refused key first: it is queued first, so it is in the first call.
my @h = (http_start(port => server_port(), request => 'GET /o?k=x'));
sleep 0.2 * $SLOW;
push @h, map { http_start(port => server_port(), request => "GET /t?k=t$_") } 1 .. 64;
sleep 0.3 * $SLOW;
kill 'CONT', $redis->pid;
# Set up, both calls written, the first refused, its 64 decisions written again.
ok(wait_until(5 * $SLOW, sub { (redis_cmd('INFO', 'errorstats') // '') =~ /errorstat_NOPERM:count=(\d+)/ && $1 >= 1 }, 0.05),
    'Redis refused the first call (NOPERM)');
sleep 0.3 * $SLOW;
close $_->{sock} for @h;
ok(wait_until(5 * $SLOW, sub { (() = access_log_text() =~ /^499 /mg) == 65 }, 0.05),
    'the 65 requests ended when their clients went away');
redis_cmd('CLIENT', 'UNPAUSE');
# Redis answers the second call, then the 64 sent again: each read and dropped.
sleep 0.5 * $SLOW;
is(header(http_get('/t?k=after'), 'X-RL'), 'PASSED', 'the worker decides after the late replies');
my $errors = redis_cmd('INFO', 'errorstats') // '';
my ($noperm) = $errors =~ /errorstat_NOPERM:count=(\d+)/;
is($noperm, 2, 'Redis refused the first call, then the refused decision alone');
my ($after) = nginx()->worker_pids;
is($after, $worker, 'the worker never crashed (same pid)');

ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'abort resent');
redis_cmd('ACL', 'DELUSER', 'lim');
done_testing();

# ratelimit_fail local: while Redis cannot decide, each worker enforces its
# share of every zone (limit / ratelimit_fail_local_share) from memory, so an
# outage neither opens the floodgates nor rejects everyone.
use lib 't/lib';
use RLTest;

sub rl { header($_[0], 'X-RL') // '(none)' }

start_nginx(http_config => <<'EOF', config => <<'EOF');
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=300ms fail_backoff=500ms;
    ratelimit_zone api  key=$arg_k limit=6 window=10s;
    ratelimit_zone wide key=$remote_addr limit=1000 window=10s;
EOF
    ratelimit_fail local;
    location /t {
        ratelimit api;
        ratelimit_fail_local_share 2;
        add_header X-RL "$ratelimit_status $ratelimit_limit $ratelimit_remaining" always;
    }
    location /u {
        ratelimit wide;
        ratelimit api cost=2;
        add_header X-RL "$ratelimit_status $ratelimit_zone $ratelimit_remaining" always;
    }
EOF

is(rl(http_get('/t?k=a')), 'PASSED 6 5', 'Redis up: decided by Redis');
stop_redis();

my @st = map { my $r = http_get('/t?k=b'); [$r->{status}, rl($r), header($r, 'Retry-After')] } 1 .. 5;
is(join(',', map { $_->[0] } @st), '200,200,200,429,429', 'Redis down: the worker admits its share, 6 / 2');
is($st[0][1], 'PASSED_LOCAL 3 2', 'PASSED_LOCAL, with the share as the limit');
is($st[3][1], 'REJECTED_LOCAL 3 0', 'then REJECTED_LOCAL');
like($st[3][2] // '', qr/^\d+$/, 'with a Retry-After');
is(rl(http_get('/t?k=c')), 'PASSED_LOCAL 3 2', 'another key has its own share');

# Default share: worker_processes (1 here), and zones stay all or nothing.
my @u = map { rl(http_get('/u?k=d')) } 1 .. 4;
is("@u[0..2]", 'PASSED_LOCAL api 4 PASSED_LOCAL api 2 PASSED_LOCAL api 0',
    'cost 2 of 6 locally, the tightest zone reported');
is($u[3], 'REJECTED_LOCAL api 0', 'rejected when api is spent');

start_redis();
wait_until(5, sub { rl(http_get('/t?k=e')) =~ /^PASSED 6/ }, 0.1);
is(rl(http_get('/t?k=e')) =~ s/ \d+$//r, 'PASSED 6', 'Redis back: decided by Redis again');

ok(stop_nginx(), 'nginx quits gracefully');
my $log = error_log_text();
like($log, qr/request decided by this worker alone by ratelimit_fail/, 'the outage is logged');
check_no_alerts($log, 'fail local', crit => 1);
done_testing();

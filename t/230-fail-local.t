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

my @st = map { my $r = http_get('/t?k=b');
    [$r->{status}, rl($r), header($r, 'Retry-After'), header($r, 'RateLimit-Reset')] } 1 .. 5;
is(join(',', map { $_->[0] } @st), '200,200,200,429,429', 'Redis down: the worker admits its share, 6 / 2');
is($st[0][1], 'PASSED_LOCAL 3 2', 'PASSED_LOCAL, with the share as the limit');
is($st[3][1], 'REJECTED_LOCAL 3 0', 'then REJECTED_LOCAL');
like($st[3][2] // '', qr/^\d+$/, 'with a Retry-After');
# Issue 19: the last admission said Remaining 0 with Reset 0, then the 429 said Retry-After 9.
cmp_ok($st[2][3] // 0, '>=', 1, 'the admission that leaves 0 has a Reset: when a unit frees');
cmp_ok(abs(($st[2][3] // 0) - ($st[3][2] // 0)), '<=', 1, 'and it agrees with the Retry-After that follows')
    or diag("Reset $st[2][3], then Retry-After $st[3][2]");
is(rl(http_get('/t?k=c')), 'PASSED_LOCAL 3 2', 'another key has its own share');
# Every figure within the window, as Redis's are: the counter alone weighed a key's units into
# the next window (a 60 s zone answered Reset 106, then Retry-After 66).
my @figures = map { 0 + ($_->[2] // $_->[3] // 0) } @st;
cmp_ok((sort { $b <=> $a } @figures)[0], '<=', 10, "no Reset nor Retry-After beyond the 10 s window (@figures)");

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

# A flood of new keys while Redis is down never resets a counted one (it used to clear every
# counter once the table was full: a bypass any client could trigger). With room for 112 keys,
# new keys beyond it are refused (503) while the counted ones keep their counts.
stop_redis();
start_nginx(http_config => <<'EOF', config => <<'EOF');
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=300ms fail_threshold=1 fail_backoff=1h;
    ratelimit_zone hour key=$arg_k limit=5 window=1h;
    ratelimit_fail local;
    ratelimit_fail_local_size 16k;
EOF
    location /t {
        ratelimit hour;
        add_header X-RL "$ratelimit_status" always;
    }
EOF
my @v = map { http_get('/t?k=victim')->{status} } 1 .. 6;
is("@v", '200 200 200 200 200 429', 'the key spends its 5 per hour locally');
my %flood;
$flood{ http_get("/t?k=flood-$_")->{status} }++ for 1 .. 300;
is($flood{200}, 111, 'new keys are counted while there is room (112 keys, one taken)');
is($flood{503}, 189, 'then refused: no live counter is forgotten to make room');
my $r = http_get('/t?k=victim');
is($r->{status}, 429, 'the spent key is still at its limit after the flood');
is(rl($r), 'REJECTED_LOCAL', 'rejected by its local counter');
ok(stop_nginx(), 'nginx quits gracefully');
like(error_log_text(), qr/request rejected by ratelimit_fail local: no room for a new key in ratelimit_fail_local_size/,
    'the refusal is logged');
check_no_alerts(error_log_text(), 'flood', crit => 1);
done_testing();

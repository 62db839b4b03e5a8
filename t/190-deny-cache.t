# The local deny cache: once Redis has rejected a key, the worker answers that
# key itself until the Retry-After has passed, without a Redis call, and
# admits it again no earlier than Redis would.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(time sleep);

# Every count below follows a decision Redis made, so EVALSHA has a line.
sub evalsha_calls { redis_calls('evalsha', called => 1) }
sub rl { header($_[0], 'X-RL') // '(none)' }

my $http = <<'EOF';
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api  key=$arg_k limit=2 window=2s;
    ratelimit_zone pace key=$arg_k limit=1 window=2s algorithm=gcra;
    ratelimit_zone wide key=$remote_addr limit=1000 window=1m;
EOF
my $config = <<'EOF';
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
    location /u { ratelimit pace; add_header X-RL $ratelimit_status always; }
    location /two { ratelimit wide; ratelimit api; add_header X-RL $ratelimit_status always; }
    location /cheap { ratelimit api cost=0; add_header X-RL $ratelimit_status always; }
    location /pair { ratelimit api cost=2; add_header X-RL $ratelimit_status always; }
    location /off {
        ratelimit api;
        ratelimit_deny_cache off;
        add_header X-RL $ratelimit_status always;
    }
EOF

for my $path ('/t', '/u') {
    start_nginx(http_config => $http, config => $config);
    my $key = "k" . substr($path, 1);
    my $t0 = time;
    my $admit = $path eq '/t' ? 2 : 1;
    is(http_get("$path?k=$key")->{status}, 200, "$path: admitted") for 1 .. $admit;
    my $before = evalsha_calls();
    my $r = http_get("$path?k=$key");
    is($r->{status}, 429, "$path: rejected by Redis");
    is(rl($r), 'REJECTED', "$path: status REJECTED");
    is(evalsha_calls(), $before + 1, "$path: that rejection was one script call");

    # Hammer: answered from memory, no Redis call, until it is admitted again.
    my ($cached, $other, $admitted_at) = (0, 0);
    while (time < $t0 + 5) {
        $r = http_get("$path?k=$key");
        if ($r->{status} == 200) { $admitted_at = time; last }
        if (rl($r) eq 'REJECTED_CACHED') {
            $cached++;
            like(header($r, 'Retry-After') // '', qr/^[12]$/, "$path: cached 429 has a Retry-After")
                if $cached == 1;
        } else {
            $other++;
        }
        sleep 0.02;
    }
    cmp_ok($cached, '>=', 20, "$path: $cached rejections answered from memory");
    cmp_ok(evalsha_calls() - $before, '<=', 2 + $other,
        "$path: hammering asked Redis only for the first rejection and the re-admission");
    ok($admitted_at, "$path: admitted again");
    cmp_ok($admitted_at - $t0, '>=', 1.95, "$path: not before the window let it in")
        if $admitted_at;

    # Another key still asks Redis.
    $before = evalsha_calls();
    is(rl(http_get("$path?k=other")), 'PASSED', "$path: another key is unaffected");
    is(evalsha_calls(), $before + 1, "$path: and asked Redis");
    ok(stop_nginx(), "$path: nginx quits gracefully");
    check_no_alerts(error_log_text(), $path);
}

start_nginx(http_config => $http, config => $config);
is(http_get("/t?k=c")->{status}, 200, 'fill') for 1 .. 2;
is(rl(http_get('/t?k=c')), 'REJECTED', 'rejected by Redis');
is(rl(http_get('/t?k=c')), 'REJECTED_CACHED', 'then from memory');
my $before = evalsha_calls();
my $r = http_get('/cheap?k=c');
is(rl($r), 'PASSED', 'cost=0 on the same key is not answered from memory');
is(header($r, 'RateLimit-Remaining'), 0, 'and reports what Redis says');
is(rl(http_get('/two?k=c')), 'REJECTED_CACHED', 'a location with one more zone: cached too');
is(rl(http_get('/off?k=c')), 'REJECTED', 'ratelimit_deny_cache off asks Redis');
is(rl(http_get('/off?k=c')), 'REJECTED', 'every time');
is(evalsha_calls() - $before, 3, 'three script calls: cost=0 and the two uncached');

# A rejection with units left (2 asked, 1 left): memory repeats what Redis said.
is(http_get('/t?k=r')->{status}, 200, 'one unit of two used');
$r = http_get('/pair?k=r');
is(rl($r), 'REJECTED', 'two units against one left: rejected by Redis');
is(header($r, 'RateLimit-Remaining'), 1, 'Redis says 1 left');
$r = http_get('/pair?k=r');
is(rl($r), 'REJECTED_CACHED', 'then from memory');
is(header($r, 'RateLimit-Remaining'), 1, 'which says 1 left too');
ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'mixed');

done_testing();

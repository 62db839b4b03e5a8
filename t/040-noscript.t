# One decision = one EVALSHA; when Redis has lost the script (SCRIPT FLUSH,
# restart) the module falls back to EVAL and the request never notices.
use lib 't/lib';
use RLTest;
use RLTest::Script qw(script_text);
use Digest::SHA qw(sha1_hex);

my $http = <<'EOF';
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=3 window=10s clock=nginx;
    ratelimit_zone big key=$arg_k limit=10 window=10s clock=nginx;
EOF
my $config = <<'EOF';
    ratelimit_fail closed;
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
    location /u { ratelimit big; add_header X-RL $ratelimit_status always; }
EOF

sub rl { header($_[0], 'X-RL') // '(none)' }
sub cmdstat { redis_calls(@_) }

# The script the module must have loaded is the one assembled from lua/;
# Redis names a cached script by the SHA-1 of its exact text.
my $sha = sha1_hex(script_text());

start_nginx(http_config => $http, config => $config);

# Redis starts every test with an empty script cache: the first decision
# already goes through the fallback.
my $r = http_get('/t?k=a');
is($r->{status}, 200, 'first request (script not cached yet) passes');
is(rl($r), 'PASSED', 'PASSED, not FAILED_CLOSED');
is(redis_cmd('SCRIPT', 'EXISTS', $sha)->[0], 1, 'Redis now caches the script assembled from lua/');

redis_cmd('SCRIPT', 'FLUSH');
$r = http_get('/t?k=a');
is(rl($r), 'PASSED', 'after SCRIPT FLUSH the next decision still passes');
is(redis_cmd('ZCARD', 'rl:api:a'), 2, 'and is counted once');

redis_cmd('SCRIPT', 'FLUSH');
$r = http_get('/t?k=a');
is(rl($r), 'PASSED', 'third decision after another flush');
$r = http_get('/t?k=a');
is($r->{status}, 429, 'the fourth is over the limit');
is(redis_cmd('ZCARD', 'rl:api:a'), 3, 'three recorded, the rejection not');

cmp_ok(cmdstat('evalsha', called => 1), '>=', 4, 'decisions are sent as EVALSHA');
cmp_ok(cmdstat('eval') + cmdstat('script|load'), '>=', 3,
    'each NOSCRIPT was followed by EVAL (or SCRIPT LOAD)');
my $evals = cmdstat('eval');
http_get('/t?k=z') for 1 .. 3;
is(cmdstat('eval'), $evals, 'with the script cached, no further EVAL is sent');

# Many decisions in flight when the script disappears: every one of them
# gets NOSCRIPT and must be retried, in order, without a failure.
redis_cmd('SCRIPT', 'FLUSH');
my $res = http_parallel([map { { port => server_port(), request => 'GET /u?k=p' } } 1 .. 30]);
my %by;
$by{ $_->{status} // 'error' }++ for @$res;
is($by{200}, 10, '30 concurrent requests after a flush: 10 admitted') or diag(explain \%by);
is($by{429}, 20, '20 rejected');
ok(!$by{503} && !$by{error}, 'none failed');
is(redis_cmd('ZCARD', 'rl:big:p'), 10, 'exactly 10 recorded');

ok(stop_nginx(), 'nginx quits gracefully');
my $log = error_log_text();
check_no_alerts($log, 'noscript');
unlike($log, qr/\[error\][^\n]*ratelimit:[^\n]*NOSCRIPT/, 'NOSCRIPT is not reported as an error');
done_testing();

# The readings suites bound (RLTest::Measure): each returns the figure it was
# asked for, and dies, failing its suite, when it cannot read it.  The old
# per-suite helpers answered -1 (221), 0 (040, 190) or undef (150) instead,
# so their `<=` bounds held whatever happened.  Against a real redis-server
# and nginx (their real formats), then against texts they might become.
use lib 't/lib';
use RLTest;
use RLTest::Measure qw(cmdstat_calls metric_value);
use POSIX ();

sub dies_like {
    my ($code, $re, $what) = @_;
    my $v = eval { $code->() };
    like($@, $re, "$what: dies") or diag('returned ' . ($v // 'undef'));
}

# --- commandstats, from Redis itself
redis_cmd('CONFIG', 'RESETSTAT');
redis_cmd('SET', 'k', 'v') for 1 .. 3;
is(redis_calls('set', called => 1), 3, 'calls of a command Redis ran');
is(redis_calls('evalsha'), 0, 'a command not run since RESETSTAT: 0');
dies_like(sub { redis_calls('evalsha', called => 1) }, qr/no line for evalsha/,
    'a command that must have run, without a line');
my $info = redis_cmd('INFO', 'commandstats');
dies_like(sub { cmdstat_calls(redis_cmd('INFO', 'stats'), 'set') },
    qr/not an INFO commandstats reply/, 'another INFO section');
(my $renamed = $info) =~ s/calls=/count=/g;
dies_like(sub { cmdstat_calls($renamed, 'set') }, qr/unreadable line/, 'a field renamed');
dies_like(sub { cmdstat_calls(undef, 'set') }, qr/no text/, 'no reply');
dies_like(sub { cmdstat_calls(bless({}, 'RLTest::Redis::Error'), 'set') }, qr/no text/,
    'an error reply');

# --- a metrics sample, from the module's page
start_nginx(http_config => <<'EOF', config => <<'EOF');
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=5 window=10s;
    ratelimit_metrics_zone 64k;
EOF
    location /t { ratelimit api; }
    location = /metrics { ratelimit_metrics; }
    location = /plain { return 200 "ratelimit_redis_connects_total 7\n"; }
EOF
is(http_get('/t?k=a')->{status}, 200, 'a decision');
is(metric('/metrics', 'ratelimit_decisions_total{zone="api",status="PASSED"}'), 1,
    'a sample by name and labels');
cmp_ok(metric('/metrics', 'ratelimit_redis_connects_total'), '>=', 1, 'a sample by name');
dies_like(sub { metric('/metrics', 'ratelimit_redis_connect_total') }, qr/no sample/,
    'a sample the page does not have');
dies_like(sub { metric('/metrics', 'ratelimit_decisions_total') }, qr/samples .*not one/,
    'a name with several samples');
dies_like(sub { metric('/missing', 'ratelimit_redis_connects_total') }, qr/answered 404/,
    'a page that is not there');
is(metric('/plain', 'ratelimit_redis_connects_total'), 7, 'any exposition text');
dies_like(sub { metric_value("ratelimit_x{a=\"b\"} 1\nbroken line here\n", 'ratelimit_x') },
    qr/unreadable line/, 'a line that is not a sample');
dies_like(sub { metric_value("ratelimit_x NaN\n", 'ratelimit_x') }, qr/not a number/,
    'a value that is not a number');

# --- /proc/<pid>/status
my ($worker) = nginx()->worker_pids;
cmp_ok(proc_kb($worker, 'VmRSS'), '>', 0, "the worker's VmRSS");
dies_like(sub { proc_kb($worker, 'VmNoSuchField') }, qr/no "VmNoSuchField/, 'a field not there');
my $gone = fork // die;
POSIX::_exit(0) unless $gone;
waitpid $gone, 0;
dies_like(sub { proc_kb($gone, 'VmRSS') }, qr/cannot read/, 'a process that is gone');
ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'measure');
done_testing();

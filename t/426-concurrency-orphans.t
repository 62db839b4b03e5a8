# Concurrency orphans after an outage (issue 27, finding 6): a request whose
# slot decision timed out leaves an orphan, a member Redis may still grant
# when it reads the decision late; the worker releases it until Redis says it
# removed it, or for one lease_time.  Before the fix a "not there" answer was
# not trusted: every orphan was released again every 100 ms for its whole
# life, a storm on a Redis that had just come back (measured: 2,213 requests
# made 99,462 releases).  Now each "not there" doubles the wait before the
# next release (100, 200, 400 ms, ...): at most 7 releases per orphan in the
# default 5 s instead of 50.
#
# One worker, Redis SIGSTOPped, 20 requests at once (each waits out its
# 200 ms timeout and fails open: 20 orphans), Redis resumed; once the breaker
# lets decisions through, Redis's releases (one ZREMRANGEBYSCORE each: the
# pruning every concurrency decision starts with) are counted over 3 quiet
# seconds.  The old module sends about 30 per orphan there.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(sleep time);

sub rl { header($_[0], 'X-RL') // '(none)' }

workers(1);
start_nginx(http_config => <<'EOF', config => <<'EOF');
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=200ms;
    ratelimit_zone conc key=$arg_k limit=4 algorithm=concurrency lease_time=5s;
    ratelimit_zone probe key=$arg_k limit=1000 window=1m algorithm=gcra burst=1000;
EOF
    add_header X-RL $ratelimit_status always;
    location /c { ratelimit conc; ratelimit_fail open; }
    location /p { ratelimit probe; ratelimit_fail open; }
    location = /admin/conc { ratelimit_admin conc; }
EOF
nginx()->write_html({ c => "ok\n" });

sub in_flight {
    my $r = http_get("/admin/conc?key=$_[0]");
    return ($r->{body} // '') =~ /"in_flight":(\d+)/ ? $1 : -1;
}

# A cold worker's first decision connects and loads the script first (under
# valgrind longer than the timeout).
ok(wait_until(20, sub { rl(http_get('/c?k=warm')) eq 'PASSED' }), 'warm: Redis decides');

my $pid = redis()->pid;
redis_cmd('CONFIG', 'RESETSTAT');
kill 'STOP', $pid;
my @res = @{ http_parallel([map { { port => server_port(), request => "GET /c?k=storm" } } 1 .. 20]) };
my $orphans = grep { rl($_) eq 'FAILED_OPEN' } @res;
kill 'CONT', $pid;
is($orphans, 20, 'Redis stopped: 20 decisions timed out and failed open (20 orphans)');

# The breaker the timeouts opened lets decisions through again after its probe
# (a gcra zone: its decisions prune nothing, so every ZREMRANGEBYSCORE counted
# is one of the 20 late decisions, if Redis ran them, or a release).
my $t0 = time;
ok(wait_until(10, sub { rl(http_get('/p?k=after')) eq 'PASSED' }), 'Redis back: it decides again');
sleep 3.5 - (time - $t0);
my $calls = redis_calls("zremrangebyscore", called => 1);
my $late = redis_calls("zadd");
note("$calls ZREMRANGEBYSCORE in the 3.5 s after SIGCONT for $orphans orphans, $late of whose slots Redis granted late");
cmp_ok($calls - $orphans, '<=', 8 * $orphans, 'a "not there" is trusted: at most 8 releases per orphan in 3.5 s (35 without the back-off)');

# Nothing of the outage is held afterwards: the key takes its 4 slots.
is(in_flight('storm'), 0, 'no orphan holds a slot');
ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'orphans');
done_testing();

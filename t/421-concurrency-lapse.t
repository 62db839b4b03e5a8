# Concurrency slots are leases (issue 23): renewed while their requests run,
# lapsing when their holder dies.  Two gateways of two workers, one Redis, a
# backend that holds requests (RLTest::SlowBackend).
# - A request 10x the lease time (lease_time=1s, a 10 s streamed response)
#   keeps its slot the whole time (the key is full: a second request is 429
#   every second of it) and releases it at the end; renewals are counted, none
#   lapsed.
# - Renewal cost, measured: 5 long requests of one worker, 4 quiet seconds:
#   renewals per slot per second, script calls per renewal (batched per sweep)
#   and Redis CPU per renewal (INFO commandstats).
# - A reload while a request runs: its old worker keeps the slot renewed past
#   lease_time until the request ends, then releases it.
# - Redis restarted empty while 5 slots are held: up to 5 more are admitted beside
#   the running ones just after it; the running ones' renewals find their slots
#   gone (counted lapsed) and write them back, so within lease_time the key
#   counts them again and refuses new requests while they run.
# - A gateway whose workers are SIGKILLed while holding 5 slots: the other
#   gateway goes on, and the slots lapse within lease_time (2 s) of the kill.
use lib 't/lib';
use RLTest;
use RLTest::SlowBackend;
use Time::HiRes qw(time sleep);

my $backend = RLTest::SlowBackend->start(log => servroot() . '/backend.log');
my $BPORT = $backend->port;
my $http = <<"EOF";
    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT;
    ratelimit_zone conc key=\$arg_k limit=5 algorithm=concurrency lease_time=2s;
    ratelimit_zone long key=\$arg_k limit=1 algorithm=concurrency lease_time=1s;
    ratelimit_metrics_zone 64k;
    upstream backend { server 127.0.0.1:$BPORT; }
EOF
my $config = <<'EOF';
    add_header X-RL $ratelimit_status always;
    location /c { ratelimit conc; proxy_pass http://backend; }
    location /long { ratelimit long; proxy_pass http://backend; proxy_buffering off; }
    location = /admin/conc { ratelimit_admin conc; }
    location = /admin/long { ratelimit_admin long; }
    location = /metrics { ratelimit_metrics; }
EOF
my @gw = map { start_nginx(name => "gw$_", workers => 2, http_config => $http, config => $config) } 1, 2;

sub admin { http_request(port => $gw[$_[2] // 1]->port, request => "GET /admin/$_[0]?key=$_[1]")->{body} // '' }
# What Redis holds, asked again when the admin call itself got no answer (a 502 when its decision
# outlasts the 200 ms timeout on a loaded machine: seen once at one of the nine seconds below),
# which says nothing of the slot.
sub in_flight {
    for (1 .. 3) { return $1 if admin(@_) =~ /"in_flight":(\d+)/ }
    return -1;
}
sub slots { metric('/metrics', qq{ratelimit_concurrency_slots_total{zone="$_[0]",event="$_[1]"}}, -port => $gw[$_[2]]->port) }
sub evalsha {
    my $info = redis_cmd('INFO', 'commandstats');
    return $info =~ /cmdstat_evalsha:calls=(\d+),usec=(\d+)/ ? ($1, $2) : (0, 0);
}

# A cold worker's first decision connects and loads the script first: under
# valgrind that outlasts the default timeout (200 ms), and the long request
# below would never be admitted. Every worker of both gateways decides once
# before the test (two rounds, as a timed-out first one is no warm-up).
for my $round (1, 2) {
    http_parallel([map { { port => $gw[$_ % 2]->port, request => "GET /c?k=warm$_&hold=0" } } 1 .. 16]);
}

# --- A request 10x the lease time.
my $h = http_start(port => $gw[0]->port, request => 'GET /long?k=kl&hold=10&stream=1');
my ($held, $denied) = (0, 0);
for my $s (1 .. 9) {
    sleep 1;
    $held++ if in_flight('long', 'kl') == 1;
    my $r = http_request(port => $gw[$s % 2]->port, request => 'GET /long?k=kl&hold=0');
    $denied++ if ($r->{status} // 0) == 429;
}
is($held, 9, 'long request: its slot held at every second of 10 (lease_time 1 s)');
is($denied, 9, 'long request: the key stays full: a second request is 429 every second');
my $r = http_finish($h, 5);
is($r->{status}, 200, 'long request: answered');
is(scalar(() = ($r->{body} // '') =~ /tick/g), 10, 'long request: streamed 10 s to the end');
ok(wait_until(2, sub { in_flight('long', 'kl') == 0 }), 'long request: its slot released at the end');
my $renewed = slots('long', 'renewed', 0);
cmp_ok($renewed, '>=', 15, "long request: renewed every third of a lease ($renewed renewals in 10 s)");
is(slots('long', 'lapsed', 0), 0, 'long request: never lapsed');

# --- Renewal cost: 5 slots of one worker (one keep-alive-less client, one
#     gateway of one worker would do; here whichever workers take them).
my @long = map { http_start(port => $gw[0]->port, request => "GET /c?k=kr&hold=6&n=$_") } 1 .. 5;
ok(wait_until(2, sub { in_flight('conc', 'kr') == 5 }), 'cost: 5 slots held');
sleep 0.5;
redis_cmd('CONFIG', 'RESETSTAT');
my $before = slots('conc', 'renewed', 0);
my $QUIET = 4;
sleep $QUIET;
my ($calls, $usec) = evalsha();
my $n = slots('conc', 'renewed', 0) - $before;
cmp_ok($n, '>', 0, 'cost: renewals were made');
cmp_ok($calls, '<=', $n, "cost: $calls script calls carried $n renewals");
note(sprintf 'renewal cost: %.2f renewals per slot per second (lease_time 2 s), %.2f renewals per '
    . 'script call, %.1f us of Redis CPU per renewal', $n / 5 / $QUIET, $n / ($calls || 1), $usec / ($n || 1));
http_finish($_, 5) for @long;
ok(wait_until(2, sub { in_flight('conc', 'kr') == 0 }), 'cost: released at the end');

# --- Reload and graceful shutdown: a request in flight keeps its slot (renewed
#     by its old worker, lease_time 1 s) until it ends, then releases it.
$h = http_start(port => $gw[1]->port, request => 'GET /long?k=kre&hold=4&stream=1');
ok(wait_until(1, sub { in_flight('long', 'kre') == 1 }), 'reload: the slot is held');
$gw[1]->reload;
my $kept = 0;
for (1 .. 3) { sleep 1; $kept++ if in_flight('long', 'kre', 0) == 1 }
is($kept, 3, 'reload: the old worker keeps it 3 s past the reload, longer than lease_time');
is(http_finish($h, 5)->{status}, 200, 'reload: the request ends normally');
ok(wait_until(2, sub { in_flight('long', 'kre', 0) == 0 }), 'reload: released at its end');

# --- Redis restarted empty while 5 slots are held: they are gone; new requests
#     are admitted beside the 5 still running (the backend's log measures it),
#     and the running requests' renewals count their slots lapsed.
my $lapsed0 = slots('conc', 'lapsed', 0) + slots('conc', 'lapsed', 1);
my @run = map { http_start(port => $gw[0]->port, request => "GET /c?k=kx&hold=3&n=$_") } 1 .. 5;
ok(wait_until(2, sub { in_flight('conc', 'kx') == 5 }), 'restart: 5 slots held');
my $t_restart = time;
redis()->restart;
# Twice the limit is sent: the bound below can fail only if more are sent than it allows.
# Only Redis's admissions count: a decision that outlasts its timeout right after the restart
# (the script is loaded again; under valgrind that can take longer) is admitted by
# ratelimit_fail's policy, which no limit bounds.
my $res = http_parallel([map { { port => $gw[1]->port, request => "GET /c?k=kx&hold=1&m=$_" } } 1 .. 10]);
my @passed = grep { (header($res->[$_ - 1], 'X-RL') // '') eq 'PASSED' } 1 .. 10;
my $failed = grep { (header($_, 'X-RL') // '') =~ /^FAILED/ } @$res;
note(sprintf 'restart: %d more admitted by Redis right after it (the slots were lost with Redis), %d followed ratelimit_fail',
    scalar @passed, $failed);
cmp_ok(scalar @passed, '<=', 5, 'restart: at most the limit admitted beside the lost slots');
# The running requests' renewals (every lease_time / 3) write their slots back: within a
# lease_time the key counts them again, and refuses new requests while they run.
ok(wait_until(2.5, sub { in_flight('conc', 'kx') == 5 }),
    sprintf('restart: the 5 running requests count again %.1f s after it (renewals wrote them back)', time - $t_restart));
is(http_request(port => $gw[1]->port, request => 'GET /c?k=kx&hold=0')->{status}, 429,
    'restart: a new request is refused while they run');
http_finish($_, 5) for @run;
my $by_redis = join '|', @passed;
my $both = RLTest::SlowBackend::max_overlap(
    $backend->intervals(qr/k=kx&hold=(?:3&n=\d+|1&m=(?:$by_redis)(?!\d))/));
note("restart: the backend saw $both requests of the key at once");
cmp_ok($both, '<=', 10, 'restart: over-admission bounded by what Redis lost (5), only just after it');
cmp_ok(slots('conc', 'lapsed', 0) + slots('conc', 'lapsed', 1) - $lapsed0, '>=', 1,
    'restart: the running requests\' renewals found their slots gone (lapsed)');
ok(wait_until(2, sub { in_flight('conc', 'kx') == 0 }), 'restart: nothing held afterwards');

# --- SIGKILL a gateway's workers while they hold 5 slots.
my @victims = map { http_start(port => $gw[0]->port, request => "GET /c?k=kk&hold=30&n=$_") } 1 .. 5;
ok(wait_until(3, sub { in_flight('conc', 'kk') == 5 }), 'kill: 5 slots held through gw1');
is(http_request(port => $gw[1]->port, request => 'GET /c?k=kk&hold=0')->{status}, 429,
    'kill: the key is full for gw2');
my @pids = $gw[0]->worker_pids;
kill 'KILL', @pids;
my $t_kill = time;
my $gone = wait_until(4, sub { in_flight('conc', 'kk') == 0 }, 0.02);
my $lapse = time - $t_kill;
ok($gone, sprintf('kill: the dead workers\' slots lapsed %.2f s after the kill', $lapse));
cmp_ok($lapse, '<=', 2.2, 'kill: within lease_time (2 s) and a poll');
my @ok = grep { ($_->{status} // 0) == 200 }
    @{ http_parallel([map { { port => $gw[1]->port, request => "GET /c?k=kk&hold=0.2&n=$_" } } 1 .. 5]) };
is(scalar @ok, 5, 'kill: gw2 admits the whole limit again');
close $_->{sock} for grep { $_->{sock} } @victims;

ok(stop_nginx("gw$_"), "gw$_ quits gracefully") for 1, 2;
# gw1's master logs the workers it lost to SIGKILL; anything else is an alert.
my $log1 = join "\n", grep { !/exited on signal 9/ } split /\n/, error_log_text('gw1');
check_no_alerts($log1, 'gw1 (but for the workers killed)');
check_no_alerts(error_log_text('gw2'), 'gw2');
$backend->stop;
done_testing();

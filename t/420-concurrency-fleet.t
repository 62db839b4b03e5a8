# Concurrency limits across the fleet (issue 23): two gateways of two workers
# share one Redis and a backend that holds each request 1 s and logs, from its
# own side, when each request began and ended (RLTest::SlowBackend).  A zone of
# limit=5 in-flight requests per key:
# - 60 requests at once for one key, half through each gateway: exactly 5 reach
#   the backend (its own log never shows more than 5 at once), the other 55 are
#   429 with Retry-After: 1 and RateLimit headers of a concurrency limit;
# - 12 clients retrying for 4 s: as requests finish, new ones are admitted, the
#   backend never sees more than 5 at once, and mostly sees 5;
# - afterwards the key holds 0 slots (Redis and ratelimit_admin), every slot
#   taken was released (metrics), none lapsed.
use lib 't/lib';
use RLTest;
use RLTest::SlowBackend qw(max_overlap);
use Time::HiRes qw(time sleep);
use POSIX ();

my $backend = RLTest::SlowBackend->start(log => servroot() . '/backend.log');
my $BPORT = $backend->port;
my $http = <<"EOF";
    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT timeout=1s;
    ratelimit_zone conc key=\$arg_k limit=5 algorithm=concurrency;
    ratelimit_metrics_zone 64k;
    upstream backend { server 127.0.0.1:$BPORT; }
EOF
my $config = <<'EOF';
    add_header X-RL $ratelimit_status always;
    location /c { ratelimit conc; proxy_pass http://backend; }
    location = /admin { ratelimit_admin conc; }
    location = /metrics { ratelimit_metrics; }
EOF
my @gw = map { start_nginx(name => "gw$_", workers => 2, http_config => $http, config => $config) } 1, 2;
is(scalar(map { $_->worker_pids } @gw), 4, 'two gateways of two workers');

sub admin { http_request(port => $gw[$_[1] // 0]->port, request => "GET /admin?key=$_[0]")->{body} // '' }
sub in_flight { admin(@_) =~ /"in_flight":(\d+)/ ? $1 : -1 }
sub slots_total {
    my ($event) = @_;
    my $sum = 0;
    $sum += metric('/metrics', qq{ratelimit_concurrency_slots_total{zone="conc",event="$event"}},
        -port => $_->port) for @gw;
    return $sum;
}

# Warm-up: every worker connects and loads the script first (under valgrind
# that alone can outlast the timeout, and the first decisions fail open).
http_parallel([map { { port => $gw[$_ % 2]->port, request => "GET /c?k=warm$_&hold=0" } } 1 .. 16]);
my $taken0 = slots_total('taken');

# --- 60 at once.
my @specs = map { { port => $gw[$_ % 2]->port, request => "GET /c?k=k60&n=$_" } } 1 .. 60;
my $res = http_parallel(\@specs, timeout => 20);
my %by;
$by{$_->{status} // 'none'}++ for @$res;
is($by{200} // 0, 5, '60 at once: exactly 5 admitted');
is($by{429} // 0, 55, '60 at once: the other 55 rejected with 429');
my @ok = grep { ($_->{status} // 0) == 200 } @$res;
my ($rej) = grep { ($_->{status} // 0) == 429 } @$res;
cmp_ok($_->{elapsed}, '>=', 0.95, 'an admitted request took the backend\'s second') for $ok[0];
is(header($rej, 'Retry-After'), '1', 'a rejection says Retry-After: 1');
is(header($rej, 'RateLimit-Limit'), '5', 'RateLimit-Limit: the in-flight limit');
is(header($rej, 'RateLimit-Remaining'), '0', 'RateLimit-Remaining: 0 while 5 are in flight');
like(header($ok[-1], 'RateLimit-Remaining') // '', qr/^[0-4]$/, 'an admitted request: 5 - in flight');
my @k60 = $backend->intervals(qr/k=k60&/);
is(scalar @k60, 5, 'the backend saw 5 requests of the key');
is(max_overlap(@k60), 5, 'the backend\'s own log: 5 at once');
ok(wait_until(3, sub { in_flight('k60') == 0 }), 'after they end: 0 in flight (admin GET)');

# --- Continuous: 12 clients retry for 4 s, on both gateways.
my $SECS = 4;
my ($t0, @kids) = (time);
for my $c (1 .. 12) {
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        my ($ok, $i) = (0, 0);
        while (time < $t0 + $SECS) {
            my $r = http_request(port => $gw[$c % 2]->port, request => "GET /c?k=kc&c=$c&i=" . $i++);
            if (($r->{status} // 0) == 200) { $ok++ } else { sleep 0.02 }
        }
        POSIX::_exit($ok > 250 ? 250 : $ok);
    }
    push @kids, $pid;
}
my $admitted = 0;
for (@kids) { waitpid $_, 0; $admitted += $? >> 8 }
my @kc = $backend->intervals(qr/k=kc&/);
is(scalar @kc, $admitted, "continuous: the backend saw every admitted request ($admitted)");
is(max_overlap(@kc), 5, 'continuous: never more than 5 at once, and 5 at times');
# The busy share: how much of the time 5 were in flight, from the backend's log.
my @ev = sort { $a->[0] <=> $b->[0] || $a->[1] <=> $b->[1] } map { ([$_->[0], 1], [$_->[1], -1]) } @kc;
my ($n, $at, $full) = (0, $ev[0][0], 0);
for (@ev) { $full += $_->[0] - $at if $n == 5; $n += $_->[1]; $at = $_->[0] }
my $span = $ev[-1][0] - $ev[0][0];
cmp_ok($admitted, '>=', 3 * $SECS, "continuous: new requests admitted as others finish ($admitted in ${SECS} s)");
note(sprintf 'continuous: 5 in flight %.0f %% of %.1f s', 100 * $full / $span, $span);
cmp_ok($full / $span, '>', 0.5, 'continuous: 5 in flight most of the time');

# --- Nothing held afterwards.
ok(wait_until(3, sub { in_flight('kc') == 0 && in_flight('kc', 1) == 0 }), 'continuous: 0 in flight afterwards');
is(redis_cmd('ZCARD', 'rl:conc:kc'), 0, 'Redis holds no slot of the key');
is(redis_cmd('EXISTS', 'rl:conc:k60'), 0, '... nor of the first key');
my $taken = slots_total('taken');
is($taken - $taken0, 5 + $admitted, 'metrics: a slot taken per admitted request');
ok(wait_until(3, sub { slots_total('released') == $taken }), 'metrics: every slot released');
is(slots_total('lapsed'), 0, 'metrics: none lapsed');

ok(stop_nginx("gw$_"), "gw$_ quits gracefully") for 1, 2;
check_no_alerts(error_log_text("gw$_"), "gw$_") for 1, 2;
$backend->stop;
done_testing();

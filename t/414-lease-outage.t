# Reservations through an outage (issue 27, finding 8): while Redis is down or
# silent, a worker spends what it already holds (Redis counted those units),
# then follows ratelimit_fail; once Redis answers again, what it still holds is
# checked against the key's life first.  Before the fix a killed Redis made the
# next requests fail at once, none of the held units spent: losing the
# tracking connection dropped every reservation.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(sleep time);

sub rl { header($_[0], 'X-RL') // '(none)' }

start_nginx(http_config => <<'EOF', config => <<'EOF');
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=300ms;
    ratelimit_zone api key=$arg_k limit=1000 window=1m lease=20 lease_time=10s;
EOF
    add_header X-RL $ratelimit_status always;
    location /open { ratelimit api; ratelimit_fail open; }
    location /closed { ratelimit api; ratelimit_fail closed; }
    location /local { ratelimit api; ratelimit_fail local; }
EOF
nginx()->write_html({ map { $_ => "ok\n" } qw(open closed local) });

my %fails = (open => 'FAILED_OPEN', closed => 'FAILED_CLOSED', local => 'PASSED_LOCAL');
# A reservation lives 100 ms only while Redis does not track its key for the
# worker (as after Redis came back: the tracker reconnects within a second).
sub hold {
    my ($p, $k) = @_;
    my @st = map { rl(http_get("/$p?k=$k")) } 1 .. 2;
    is("@st", 'PASSED PASSED_LEASE', "$p/$k: 19 units held");
}
# Until then: a grant starts the worker's tracker, at most once a second (one within a second
# of the last start puts it off to that second's end, t/192). Under valgrind a cold worker's
# first decisions may take their whole timeout and grant nothing, so each try asks for a grant
# of a key of its own, until Redis lists the tracking connection; then its reply has a moment
# to reach the worker.
my $probes = 0;
sub tracked {
    wait_until(20, sub { rl(http_get('/closed?k=probe')) =~ /^PASSED/ });
    my $first = $probes;
    ok(wait_until(20, sub { http_get('/closed?k=probe' . ++$probes); redis()->tracking_clients }, 0.3),
        'the tracker connected again');
    note(sprintf 'tracker listed by Redis after %d grants of new keys', $probes - $first);
    sleep 0.3;
}
sub tally {
    my %n;
    $n{$_}++ for @_;
    return join ' ', map { "$_ x $n{$_}" } sort keys %n;
}

# Redis killed: every held unit is spent, then the location's policy.
tracked();
for my $p (sort keys %fails) {
    hold($p, "killed-$p");
}
stop_redis();
for my $p (sort keys %fails) {
    my @st = map { rl(http_get("/$p?k=killed-$p")) } 1 .. 25;
    is(tally(@st), tally(('PASSED_LEASE') x 19, ($fails{$p}) x 6),
        "Redis killed, fail $p: the 19 held units spent, then ratelimit_fail");
}
redis()->start;

# Redis silent (SIGSTOP): the same, each decision waiting out its timeout.
tracked();
for my $p (sort keys %fails) {
    hold($p, "stopped-$p");
}
kill 'STOP', redis()->pid;
my $t0 = time;
my %st;
for my $p (sort keys %fails) {
    $st{$p} = [map { rl(http_get("/$p?k=stopped-$p")) } 1 .. 22];
}
my $took = time - $t0;
kill 'CONT', redis()->pid;
for my $p (sort keys %fails) {
    is(tally(@{ $st{$p} }), tally(('PASSED_LEASE') x 19, ($fails{$p}) x 3),
        "Redis stopped, fail $p: the 19 held units spent, then ratelimit_fail");
}
note(sprintf '66 requests while Redis was stopped took %.2f s (9 waited out the 300 ms timeout)', $took);
note("Redis stopped, fail $_: @{ $st{$_} }") for sort keys %st;

# Redis back with its data: what is still held is checked, found of the key's
# life, and spent again; Redis back empty (a restart without persistence): the
# check finds the reservation gone, and Redis decides.  First the breaker the
# timeouts opened lets decisions through again.
tracked();
hold('closed', 'back');
wait_until(3, sub { rl(http_get('/closed?k=back')) eq 'PASSED_LEASE' });
my $pid = redis()->pid;
kill 'STOP', $pid;
sleep 0.1;
kill 'CONT', $pid;
is(rl(http_get('/closed?k=back')), 'PASSED_LEASE', 'Redis back with its data: the reservation is spent again');
redis()->restart;
# The tracker reconnects within a second, then every reservation is checked.
my $first_after = wait_until(5, sub { my $s = rl(http_get('/closed?k=back')); $s eq 'PASSED' && $s });
is($first_after, 'PASSED', 'Redis back empty: the old reservation is dropped, Redis decides');
is(redis_cmd('ZCARD', 'rl:api:back') >= 1 ? 'counted' : 'not', 'counted', 'Redis back empty: and counts again');

ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'lease outage');
done_testing();

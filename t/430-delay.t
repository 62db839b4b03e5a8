# Delay instead of reject, across the fleet (issue 33): `ratelimit ZONE
# delay=TIME`.  Two gateways of one worker share one Redis and a backend that
# logs, from its own side, when each request reached it (RLTest::SlowBackend,
# hold=0).  Every zone keeps the gateway's clock (clock=nginx), so that the
# instant a delayed request was recorded at is $ratelimit_time +
# $ratelimit_delay in the access log, to the ms; the audit (RLTest::Audit)
# checks every zone's admissions at those instants against its algorithm's
# promise, and the backend's own times against the figures of the issue.
# - gcra 10/s burst=1 delay=5s, 20 at once from both gateways: 20 x 200, never
#   more than 11 in any second, the last >= 1.7 s after the first;
# - sliding log 5 per 2 s delay=3s, 8 at once: 8 x 200, 3 of them >= 1.9 s
#   later; 5 per 10 s delay=1s: 5 x 200 and 3 x 429 within 0.5 s;
# - an unlimited location answers within 50 ms while 20 requests wait (not
#   under valgrind, whose slowness is the measure there);
# - a client that goes away while waiting (HTTP/1.1 close, HTTP/2 RST_STREAM)
#   gives its place back: the next request takes it (200 after the same wait)
#   where it would be refused;
# - a zone with lease= and delay=: admitted from reservations, then delayed by
#   Redis once they run out, never over the limit;
# - a reset while a request waits: its give-back finds another life of the
#   key and writes nothing, the new life is never over its limit;
# - a reload, Redis going away and a graceful shutdown while requests wait:
#   they go on at their turn;
# - every algorithm that delays (log, packed log, counter, gcra, quota) under
#   a burst far over its limit from both gateways: audited at the instants
#   Redis recorded, and at the admission instants (each between its recorded
#   instant and its arrival at the backend): no window over;
# - the waiting bound: 40 HTTP/2 streams read in one event by a worker of 24
#   connections: 24 may wait, 16 are rejected at once, twice.
use lib 't/lib';
use RLTest;
use RLTest::Audit qw(check summary to_ms);
use RLTest::H2;
use RLTest::Proc qw(free_port);
use RLTest::SlowBackend;
use RLTest::Script qw(counter_value);
use Time::HiRes qw(time sleep);

my $VALGRIND = RLTest::Nginx::valgrind();
my $backend = RLTest::SlowBackend->start(log => servroot() . '/backend.log');
my $BPORT = $backend->port;
my $H2 = free_port();
# "http2 on;" from 1.25.1; Debian's 1.22 knows only "listen ... http2".
my ($version) = `@{[RLTest::Nginx::binary()]} -v 2>&1` =~ m{nginx/(\d+\.\d+\.\d+)};
my $new_h2 = sprintf('%03d%03d%03d', split /\./, $version // '0.0.0') ge '001025001';
my ($h2_listen, $h2_on) = $new_h2 ? ("127.0.0.1:$H2", 'http2 on;') : ("127.0.0.1:$H2 http2", '');
my $http = <<"EOF";
    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT timeout=2s;
    ratelimit_zone g   key=\$arg_k limit=10 window=1s algorithm=gcra burst=1 clock=nginx;
    ratelimit_zone l   key=\$arg_k limit=5 window=2s clock=nginx;
    ratelimit_zone l10 key=\$arg_k limit=5 window=10s clock=nginx;
    ratelimit_zone one key=\$arg_k limit=1 window=3s clock=nginx;
    ratelimit_zone c   key=\$arg_k limit=2 window=2s algorithm=sliding_counter clock=nginx;
    ratelimit_zone p   key=\$arg_k limit=4 window=1s algorithm=sliding_log_packed clock=nginx;
    ratelimit_zone cb  key=\$arg_k limit=8 window=1s algorithm=sliding_counter clock=nginx;
    ratelimit_zone gb  key=\$arg_k limit=8 window=1s algorithm=gcra burst=3 clock=nginx;
    ratelimit_zone q   key=\$arg_k limit=30 period=hour clock=nginx;
    ratelimit_zone lz  key=\$arg_k limit=20 window=1s lease=auto lease_time=200ms clock=nginx;
    ratelimit_metrics_zone 64k;
    log_format delay '\$ratelimit_time \$ratelimit_delay \$ratelimit_status \$status \$uri \$arg_k \$args';
    upstream backend { server 127.0.0.1:$BPORT; }
EOF
# gw1 also serves HTTP/2, on a port of its own.
my $h2_server = <<"EOF";
    server {
        listen $h2_listen;
        $h2_on
        location /one { ratelimit one delay=5s; proxy_pass http://backend; }
    }
EOF
my $config = <<'EOF';
    access_log logs/delay.log delay;
    add_header X-RL $ratelimit_status always;
    add_header X-Delay $ratelimit_delay always;
    location /g   { ratelimit g delay=5s;   proxy_pass http://backend; }
    location /l   { ratelimit l delay=3s;   proxy_pass http://backend; }
    location /l10 { ratelimit l10 delay=1s; proxy_pass http://backend; }
    location /one { ratelimit one delay=5s; proxy_pass http://backend; }
    location /c   { ratelimit c delay=5s;   proxy_pass http://backend; }
    location /p   { ratelimit p delay=2s;   proxy_pass http://backend; }
    location /cb  { ratelimit cb delay=2s;  proxy_pass http://backend; }
    location /gb  { ratelimit gb delay=1s;  proxy_pass http://backend; }
    location /q   { ratelimit q delay=1s;   proxy_pass http://backend; }
    location /lz  { ratelimit lz delay=2s;  proxy_pass http://backend; }
    location /free { proxy_pass http://backend; }
    location = /admin_c { ratelimit_admin c; }
    location = /metrics { ratelimit_metrics; }
EOF
sub conf_of {
    my ($g) = @_;
    return (name => "gw$g", workers => 1, http_config => $http . ($g == 1 ? $h2_server : ''),
        config => $config);
}
my @gw = map { start_nginx(conf_of($_)) } 1, 2;

sub req { { port => $gw[$_[1] // 0]->port, request => "GET $_[0]" } }
sub statuses { my %by; $by{ $_->{status} // ($_->{error} ? 'error' : 'none') }++ for @_; \%by }
sub begins { map { $_->[0] } $backend->intervals($_[0]) }
sub metric_sum { my $s = 0; $s += metric('/metrics', $_[0], -port => $_->port) for @gw; $s }

# Warm-up: each worker connects and loads the script.
http_parallel([map { req("/free?w=$_&hold=0", $_ % 2) } 1 .. 4]);
http_parallel([map { req("/l10?k=warm$_&hold=0", $_ % 2) } 1 .. 4]);

# --- gcra 10 per second, burst=1, delay=5s: 20 at once from both gateways.
{
    my $res = http_parallel([map { req("/g?k=g20&n=$_&hold=0", $_ % 2) } 1 .. 20], timeout => 20);
    is_deeply(statuses(@$res), { 200 => 20 }, 'gcra delay=5s: 20 at once, 20 x 200');
    my @t = sort { $a <=> $b } begins(qr/k=g20&/);
    is(scalar @t, 20, 'gcra: the backend saw the 20');
    my $most = 0;
    for my $i (0 .. $#t) {
        my $n = grep { $_ >= $t[$i] && $_ < $t[$i] + 1 } @t;
        $most = $n if $n > $most;
    }
    SKIP: {
        # A worker late for its timers lets the requests whose turns passed go on together.
        skip 'valgrind: a slowed worker lets waiting requests go on late and together', 1 if $VALGRIND;
        cmp_ok($most, '<=', 11, "gcra: never more than 11 in any second at the backend ($most)");
    }
    cmp_ok($t[-1] - $t[0], '>=', 1.7, sprintf 'gcra: the last %.2f s after the first', $t[-1] - $t[0]);
    my @delayed = grep { (header($_, 'X-RL') // '') eq 'DELAYED' } @$res;
    cmp_ok(scalar @delayed, '>=', 18, 'gcra: the others were DELAYED ($ratelimit_status)');
    like(header($delayed[0], 'X-Delay') // '', qr/^[1-9]\d*$/, '$ratelimit_delay: the wait in ms');
}

# --- sliding log 5 per 2 s, delay=3s: 8 at once.
{
    my $res = http_parallel([map { req("/l?k=l8&n=$_&hold=0", $_ % 2) } 1 .. 8], timeout => 20);
    is_deeply(statuses(@$res), { 200 => 8 }, 'sliding log delay=3s: 8 at once, 8 x 200');
    my @late = grep { $_->{elapsed} >= 1.9 } @$res;
    is(scalar @late, 3, 'sliding log: 3 of them >= 1.9 s later');
}
{
    my $res = http_parallel([map { req("/l10?k=l10&n=$_&hold=0", $_ % 2) } 1 .. 8], timeout => 20);
    is_deeply(statuses(@$res), { 200 => 5, 429 => 3 }, '5 per 10 s, delay=1s: 5 x 200, 3 x 429');
    my ($slowest) = sort { $b <=> $a } map { $_->{elapsed} } @$res;
    SKIP: {
        skip 'valgrind: its slowness, not a wait, sets the times', 1 if $VALGRIND;
        cmp_ok($slowest, '<', 0.5, sprintf 'all answered within 0.5 s (%.3f s)', $slowest);
    }
    my ($rej) = grep { $_->{status} == 429 } @$res;
    like(header($rej, 'Retry-After') // '', qr/^(9|10)$/, 'a rejection beyond delay= says its honest Retry-After');
}

# --- An unlimited location answers while 20 requests wait on the same worker.
{
    my @held = map { http_start(%{ req("/g?k=gfree&n=$_&hold=0", 0) }) } 1 .. 20;
    sleep 0.3;
    my $free = http_request(%{ req('/free?x=1&hold=0', 0) });
    is($free->{status}, 200, 'an unlimited location answers while 20 wait');
    SKIP: {
        skip 'valgrind: its slowness, not a wait, sets the times', 1 if $VALGRIND;
        cmp_ok($free->{elapsed}, '<', 0.05, sprintf '... within 50 ms (%.3f s)', $free->{elapsed});
    }
    cmp_ok(metric('/metrics', 'ratelimit_requests_waiting', -port => $gw[0]->port), '>=', 10,
        'ratelimit_requests_waiting counts them');
    my @done = map { http_finish($_, 20) } @held;
    is_deeply(statuses(@done), { 200 => 20 }, 'the 20 then go on');
}

# --- A client gone while waiting gives its place back.
{
    is(http_request(%{ req('/one?k=gone&n=1&hold=0', 0) })->{status}, 200, 'limit 1 per 3 s: the first at once');
    my $h = http_start(%{ req('/one?k=gone&n=2&hold=0', 0) });
    sleep 0.3;
    close $h->{sock};
    ok(wait_until(5, sub { metric('/metrics', 'ratelimit_requests_waiting', -port => $gw[0]->port) == 0 }),
        'the one that left waits no more');
    my $third = http_request(%{ req('/one?k=gone&n=3&hold=0', 1) }, timeout => 10);
    is($third->{status}, 200, 'the next request takes its place, from the other gateway');
    cmp_ok($third->{elapsed}, '<', 3.2, sprintf 'after the same wait (%.2f s), not the one behind it', $third->{elapsed});
    is(scalar(begins(qr/k=gone&n=2&/)), 0, 'the one that left never reached the backend');
}
SKIP: {
    my $h2 = RLTest::H2->connect(port => $H2);
    skip "no HTTP/2 connection: $RLTest::H2::error", 5 unless $h2;
    is(http_request(%{ req('/one?k=h2gone&n=1&hold=0', 0) })->{status}, 200, 'HTTP/2: the first at once (HTTP/1.1)');
    my $s = $h2->get('/one?k=h2gone&n=2&hold=0');
    $h2->pump(0.3);
    ok(!defined $h2->status($s), 'an HTTP/2 stream waits for its turn');
    $h2->reset($s);
    $h2->pump(0.1);
    ok(wait_until(5, sub { metric('/metrics', 'ratelimit_requests_waiting', -port => $gw[0]->port) == 0 }),
        'reset (RST_STREAM): it waits no more');
    my $third = http_request(%{ req('/one?k=h2gone&n=3&hold=0', 1) }, timeout => 10);
    is($third->{status}, 200, 'the next request takes its place');
    cmp_ok($third->{elapsed}, '<', 3.2, sprintf 'after the same wait (%.2f s)', $third->{elapsed});
    $h2->close;
}

# --- lease= and delay=: reservations first, then Redis's delays.
{
    my $res = http_parallel([map { req("/lz?k=lz&n=$_&hold=0", $_ % 2) } 1 .. 30], timeout => 20);
    is_deeply(statuses(@$res), { 200 => 30 }, 'lease= and delay=2s, 30 at once at 20 per second: 30 x 200');
    my %rl;
    $rl{ header($_, 'X-RL') // '-' }++ for @$res;
    my $seen = join ' ', map { "$_=$rl{$_}" } sort keys %rl;
    cmp_ok($rl{DELAYED} // 0, '>=', 5, "the last waited for their turn ($seen)");
}

# --- A reset while a request waits: its give-back meets another life.
{
    my @first = map { http_request(%{ req("/c?k=reset&n=$_&hold=0", 0) }) } 1, 2;
    is_deeply(statuses(@first), { 200 => 2 }, 'counter 2 per 2 s: two at once');
    my $h = http_start(%{ req('/c?k=reset&n=3&hold=0', 0) });
    sleep 0.2;
    is(http_request(%{ req('/admin_c?key=reset', 1) }, request => 'DELETE /admin_c?key=reset')->{status}, 200,
        'the key reset from the other gateway while one waits');
    my @second = map { http_request(%{ req("/c?k=reset&n=1$_&hold=0", 1) }) } 1, 2;
    is(join(' ', map { header($_, 'X-RL') // '-' } @second), 'PASSED PASSED', 'the new life admits two at once');
    my $cv = counter_value('rl:c:reset');
    close $h->{sock};
    ok(wait_until(5, sub { metric('/metrics', 'ratelimit_requests_waiting', -port => $gw[0]->port) == 0 }),
        'the waiting client left');
    sleep 0.2;
    is(counter_value('rl:c:reset'), $cv, 'its give-back wrote nothing into the new life');
    my $next = http_request(%{ req('/c?k=reset&n=20&hold=0', 1) }, timeout => 10);
    isnt(header($next, 'X-RL') // '', 'PASSED', 'the new life is full: the next one is not admitted at once');
}

# --- A reload and Redis going away while requests wait: they go on.
{
    my @held = map { http_start(%{ req("/g?k=reload&n=$_&hold=0", 0) }) } 1 .. 8;
    sleep 0.2;
    ok(reload_nginx(conf_of(1)), 'gw1 reloaded');
    my @done = map { http_finish($_, 20) } @held;
    is_deeply(statuses(@done), { 200 => 8 }, 'waiting requests finish across a reload');

    my @held2 = map { http_start(%{ req("/g?k=down&n=$_&hold=0", 1) }) } 1 .. 8;
    sleep 0.2;
    stop_redis();
    my @done2 = map { http_finish($_, 20) } @held2;
    is_deeply(statuses(@done2), { 200 => 8 }, 'waiting requests go on while Redis is away');
    start_redis();
    ok(wait_until(10, sub { (http_request(%{ req('/l10?k=back&hold=0', 1) })->{status} // 0) == 200 }),
        'Redis back');
}

# --- Every algorithm that delays, hammered from both gateways, audited.
my %AUDIT = (
    l  => ['sliding_log', limit => 5, window => 2000],
    p  => ['sliding_log_packed', limit => 4, window => 1000],
    cb => ['sliding_counter', limit => 8, window => 1000],
    gb => ['gcra', limit => 8, window => 1000, burst => 3],
    q  => ['quota', limit => 30, period => 'hour'],
);
{
    my @specs;
    for my $round (1 .. 3) {
        for my $z (sort keys %AUDIT) {
            push @specs, map { req("/$z?k=audit&r=$round&n=$_&hold=0", $_ % 2) } 1 .. 12;
        }
    }
    my $res = http_parallel(\@specs, timeout => 30);
    my $by = statuses(@$res);
    cmp_ok($by->{200} // 0, '>', 0, 'audit burst: admitted ' . ($by->{200} // 0) . ', rejected ' . ($by->{429} // 0));
    ok(!$by->{error} && !$by->{none}, 'audit burst: every request answered');
}
# When each audited request reached the backend, by its arguments.
my %arrived = map { (my $a = $_->[2]) =~ s/^[^?]*\?//; ($a => int($_->[0] * 1000)) } $backend->intervals(qr/k=audit&/);
my (%adm, %at, $delayed_logged);
for my $g (1, 2) {
    for my $line (split /\n/, nginx("gw$g")->read_file('logs/delay.log')) {
        my ($time, $delay, $rl, $status, $uri, $key, $args) = split / /, $line;
        next unless $status eq '200' && $key eq 'audit';
        (my $zone = $uri) =~ s{^/}{};
        my $t = to_ms($time) // die "no \$ratelimit_time: $line";
        $delayed_logged++ if $rl eq 'DELAYED';
        $t += $delay;
        # The gateway's clock is read once for $ratelimit_time and once for the script's now.
        push @{ $adm{$zone} }, [$t, $t + 1, 1];
        my $in = $arrived{$args} // die "audit: $args never reached the backend";
        push @{ $at{$zone} }, [$t, $in > $t ? $in : $t + 1, 1];
    }
}
cmp_ok($delayed_logged // 0, '>', 0, "audit: some were delayed ($delayed_logged)");
for my $z (sort keys %AUDIT) {
    my ($alg, %o) = @{ $AUDIT{$z} };
    my $r = check($alg, $adm{$z} // [], %o);
    ok($r->{ok}, "audit $alg with delay=: " . summary($r)) or diag(explain($r->{examples}));
    SKIP: {
        skip 'valgrind: a slowed worker lets waiting requests go on late and together', 1 if $VALGRIND;
        $r = check($alg, $at{$z} // [], %o);
        ok($r->{ok}, "audit $alg by admission instants: " . summary($r)) or diag(explain($r->{examples}));
    }
}

# --- The waiting bound: a worker lets at most worker_connections requests wait, counting the
# decisions on their way with a wait allowed. 40 HTTP/2 streams in one write, which nginx reads
# and runs in one event, to a worker of 24 connections (gcra 10/s, burst=1, delay=10s): the
# first 24 may wait (one admitted now, the rest delayed), the others ask with a wait of 0 and
# are rejected; without the bound all 40 would wait. A second burst once they are done finds
# the places free again.
SKIP: {
    my $port = free_port();
    my ($listen, $on) = $new_h2 ? ("127.0.0.1:$port", 'http2 on;') : ("127.0.0.1:$port http2", '');
    start_nginx(name => 'gw3', workers => 1, events => 'worker_connections 24;',
        http_config => <<"EOF", config => 'location = /metrics { ratelimit_metrics; }');
    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT timeout=2s;
    ratelimit_zone g key=\$arg_k limit=10 window=1s algorithm=gcra burst=1 clock=nginx;
    ratelimit_metrics_zone 64k;
    server {
        listen $listen;
        $on
        root \$TEST_NGINX_HTML_DIR;
        location /t { ratelimit g delay=10s; add_header X-RL \$ratelimit_status always; }
    }
EOF
    my $warm = RLTest::H2->connect(port => $port);
    skip "no HTTP/2 connection: $RLTest::H2::error", 10 unless $warm;
    my $w = $warm->get('/t?k=bound-warm');
    $warm->wait_until(5, sub { $warm->ended($w) });
    is($warm->status($w), 200, 'worker_connections 24: the worker has its Redis connection');
    $warm->close;
    my $first;
    for my $round (1, 2) {
        my $h2 = RLTest::H2->connect(port => $port);
        $h2->cork;
        my @s = map { $h2->get("/t?k=bound$round&n=$_") } 1 .. 40;
        $h2->uncork;
        $h2->wait_until(20, sub { 40 == grep { $h2->ended($_) } @s });
        my %by;
        $by{ $h2->status($_) // 'none' }++ for @s;
        $h2->close;
        cmp_ok($by{200} // 0, '<=', 24, "burst $round: at most 24 of 40 streams admitted or waiting ("
            . join(' ', map { "$_ x $by{$_}" } sort keys %by) . ')');
        cmp_ok($by{200} // 0, '>=', 2, "burst $round: some waited for their turn");
        is(($by{200} // 0) + ($by{429} // 0), 40, "burst $round: the others were rejected at once");
        # A place the first burst left counted (a waiting count not given back) would show as
        # fewer places for the second.
        if ($round == 1) { $first = $by{200} // 0 }
        else { cmp_ok($by{200} // 0, '>=', $first, "burst 2: as many places as burst 1 ($first)") }
    }
    is(metric('/metrics', 'ratelimit_requests_waiting', -port => nginx('gw3')->port), 0,
        'none waiting at the end');
    ok(stop_nginx('gw3'), 'gw3 stops');
}

# --- Metrics.
my $delayed = metric_sum('ratelimit_delayed_requests_total');
cmp_ok($delayed, '>=', 40, "ratelimit_delayed_requests_total ($delayed)");
cmp_ok(metric_sum('ratelimit_delay_seconds_total'), '>', 1, 'ratelimit_delay_seconds_total');
is(metric_sum('ratelimit_requests_waiting'), 0, 'none waiting at the end');

# --- A graceful shutdown while requests wait: they finish first.
{
    my @held = map { http_start(%{ req("/g?k=quit&n=$_&hold=0", 1) }) } 1 .. 6;
    sleep 0.2;
    ok(stop_nginx('gw2'), 'gw2 quits gracefully while requests wait');
    my @done = map { http_finish($_, 10) } @held;
    is_deeply(statuses(@done), { 200 => 6 }, '... and they went on first');
}

ok(stop_nginx('gw1'), 'gw1 quits gracefully');
check_no_alerts(error_log_text("gw$_"), "gw$_") for 1, 2;
$backend->stop;
done_testing();

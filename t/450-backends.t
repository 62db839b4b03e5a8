# Several Redis backends chosen per zone (issue 34): `ratelimit_redis ...
# name=NAME` beside the unnamed one, `ratelimit_zone ... redis=NAME`.  The
# test's own Redis is the unnamed (default) backend, a second redis-server the
# "regional" one, and a 3-primary Redis Cluster the "global" one.
#
# - zone q (default, 3 per minute) and zone r (regional, 100 per minute) in one
#   location: 10 requests -> 3 x 200 then 7 x 429, r's key counts exactly 3 a
#   second later (the units of the rejected ones given back), no key of a zone
#   on the other backend; the other way round (r rejects, q's units given back)
# - the deny cache on both backends, and a rejection by one remembered for the
#   location; a DEL on the regional Redis heard by its tracking
# - ratelimit_admin on a regional zone reads and deletes the key on the regional Redis
# - metrics: the named backend's series carry backend="regional", the
#   unnamed one's are today's
# - the regional Redis SIGSTOPped: q alone stays exact and answers at once; a
#   location with both follows ratelimit_fail for r only (open: q decides and
#   counts; closed: 503 and q's units given back, a unit counted for at most the timeout plus a give-back's round trip (watched every 2 ms); local: r decided by the
#   worker, q by Redis); the log names the backend; a zone with settle= on the
#   default backend is settled when r fails open or is decided locally
# - a reload renames the backend (regional -> eu): the keys stay where they were
# - the default a single server and name=global a Cluster: keys land on the
#   right node, give-backs reach the Cluster
# - leases on both backends, two workers hammering: the access log audited
#   (never over any limit), reservations used in both, and each key counts
#   exactly what was admitted once nginx has quit (unspent units given back)
# - a reset on the regional Redis (DEL) while two gateways run, the key
#   re-created by the second, the reset heard at the key's next request or
#   first at another key's: no over-admission, exact counts afterwards
# (nginx -t errors: t/005-config-errors.t.)
use lib 't/lib';
use RLTest;
use RLTest::Redis;
use RLTest::Cluster;
use RLTest::Audit qw(check parse_log log_format summary);
use RLTest::Measure qw(cmdstat_calls);
use Time::HiRes qw(sleep time);

my $regional = RLTest::Redis->new(dir => servroot() . '/redis-regional')->start;
$ENV{TEST_NGINX_REGIONAL_PORT} = $regional->port;
sub rcmd { $regional->cmd(@_) }
sub dcmd { redis_cmd(@_) }
sub rl { header($_[0], 'X-RL') // ($_[0]{error} ? "error: $_[0]{error}" : '(none)') }
sub statuses { join ' ', map { $_->{status} // '-' } @_ }
sub keys_of { my $r = shift; ref $r eq 'ARRAY' ? join(' ', sort @$r) : "$r" }
sub evalsha_on { cmdstat_calls($_[0]->('INFO', 'commandstats'), 'evalsha') }
sub tally { my %n; $n{$_}++ for @_; join ', ', map { "$_ x $n{$_}" } sort keys %n }
# Under valgrind a worker's own slowness, not a timeout, sets the times: their bounds grow.
my $SLOW = RLTest::Nginx::valgrind() ? 10 : 1;

# ---------------------------------------------------------------------------
# One gateway, one worker: accounting, deny cache, metrics, the outage, a rename.

my $backends = <<'EOF';
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=500ms;
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REGIONAL_PORT name=regional timeout=300ms;
EOF
my $zones = <<'EOF';
    ratelimit_metrics_zone 64k;
    ratelimit_zone q   key=$arg_k limit=3 window=1m;
    ratelimit_zone r   key=$arg_k limit=100 window=1m redis=regional;
    ratelimit_zone rs  key=$arg_k limit=2 window=1m redis=regional;
    ratelimit_zone dq  key=$arg_k limit=2 window=1m;
    ratelimit_zone dr  key=$arg_k limit=2 window=1m redis=regional;
    ratelimit_zone dq2 key=$arg_k limit=100 window=1m;
    ratelimit_zone sq  key=$arg_a limit=100 window=1m;
    ratelimit_zone sr  key=$arg_b limit=100 window=1m redis=regional;
    ratelimit_zone qs  key=$arg_k limit=100 window=1m;
EOF
my $config = <<'EOF';
    add_header X-RL $ratelimit_status always;
    location = /both   { ratelimit q; ratelimit r; }
    location = /q      { ratelimit q; }
    location = /r      { ratelimit r; }
    location = /qrs    { ratelimit q; ratelimit rs; }
    location = /closed { ratelimit q; ratelimit r; ratelimit_fail closed; }
    location = /local  { ratelimit q; ratelimit r; ratelimit_fail local; }
    location = /bothset  { ratelimit qs cost=10 settle=$arg_used; ratelimit r; }
    location = /localset { ratelimit qs cost=10 settle=$arg_used; ratelimit r; ratelimit_fail local; }
    location = /dq     { ratelimit dq; }
    location = /dr     { ratelimit dr; }
    location = /dboth  { ratelimit dq2; ratelimit dr; }
    location = /split  { ratelimit sq; ratelimit sr; }
    location = /metrics { ratelimit_metrics; }
    location = /admin/r { ratelimit_admin r; }
EOF
nginx()->write_html({ map { $_ => "ok\n" } qw(both q r qrs closed local dq dr dboth split rq sq lq lr lboth Lq Lr Lboth rr qr) });
start_nginx(http_config => $backends . $zones, config => $config);

# --- Each zone's keys on its own backend; a location admitted only if both admit.
{
    my @res = map { http_get('/both?k=a') } 1 .. 10;
    is(statuses(@res), join(' ', (200) x 3, (429) x 7), 'q (default, 3/min) and r (regional, 100/min): 3 x 200 then 7 x 429')
        or diag(join ' ', map { rl($_) } @res);
    sleep 1;
    is(rcmd('ZCARD', 'rl:r:a'), 3, "a second later r's key on the regional Redis counts exactly the 3 admitted");
    is(dcmd('ZCARD', 'rl:q:a'), 3, "q's key on the default Redis counts the 3 admitted");
    is(keys_of(rcmd('KEYS', 'rl:q:*')), '', 'no key of q on the regional Redis');
    is(keys_of(dcmd('KEYS', 'rl:r:*')), '', 'no key of r on the default Redis');
    is(keys_of(dcmd('EXISTS', 'rl:r:a')), '0', 'rl:r:a is not on the default Redis');

    # The other way round: the regional zone rejects, q's units are given back.
    @res = map { http_get('/qrs?k=b') } 1 .. 5;
    is(statuses(@res), '200 200 429 429 429', 'rs (regional, 2/min) rejects the third: 2 x 200 then 429');
    sleep 1;
    is(dcmd('ZCARD', 'rl:q:b'), 2, "q on the default Redis counts only the 2 admitted: the rejected ones' units given back");
    is(rcmd('ZCARD', 'rl:rs:b'), 2, 'rs on the regional Redis counts 2');
    is(keys_of(dcmd('KEYS', 'rl:rs:*')), '', 'no key of rs on the default Redis');
}

# --- A request whose keys are all on one backend (the other zone's key empty) asks that one
# alone, and places nothing there to give back: no other backend can refuse it.
{
    is(rl(http_get('/split?b=one')), 'PASSED', 'sr alone (sq\'s key empty): admitted');
    is(rcmd('ZCARD', 'rl:sr:one'), 1, '... counted on the regional Redis');
    is(rcmd('EXISTS', 'rl:sr:one|lease{rl:sr:one}'), 0, '... with no place recorded to undo (no ledger)');
    is(keys_of(dcmd('KEYS', 'rl:sq:*')), '', '... and nothing asked of the default Redis');
    is(rl(http_get('/split?a=two&b=two')), 'PASSED', 'sq and sr both: admitted');
    is(rcmd('EXISTS', 'rl:sr:two|lease{rl:sr:two}'), 1, '... the regional unit placed to be undone if the default Redis refuses');
}

# --- ratelimit_admin on a zone of the regional backend reads and resets its key there.
{
    my $r = http_request(port => server_port(), request => 'GET /admin/r?key=a');
    like($r->{body} // '', qr/^\{"zone":"r","key":"a","limit":100,"remaining":97,/, 'ratelimit_admin r: reads the regional key (3 of 100 used)');
    $r = http_request(port => server_port(), request => 'DELETE /admin/r?key=a');
    like($r->{body} // '', qr/"deleted":true/, 'ratelimit_admin r: DELETE removes it');
    is(rcmd('EXISTS', 'rl:r:a'), 0, '... from the regional Redis');
    is(dcmd('ZCARD', 'rl:q:a'), 3, "... and q's key on the default Redis is untouched");
}

# --- The deny cache on both backends.
for my $case (['dq', 'default', \&dcmd], ['dr', 'regional', \&rcmd]) {
    my ($zone, $what, $cmd) = @$case;
    my @res = map { http_get("/$zone?k=x") } 1 .. 3;
    is(join(' ', map { rl($_) } @res), 'PASSED PASSED REJECTED', "$zone ($what): 2 admitted, the third rejected by Redis");
    my $before = evalsha_on($cmd);
    @res = map { http_get("/$zone?k=x") } 1 .. 10;
    is(tally(map { rl($_) } @res), 'REJECTED_CACHED x 10', "$zone ($what): the next 10 answered from the deny cache");
    is(evalsha_on($cmd) - $before, 0, "$zone ($what): without a script call on its Redis");
}
# The regional Redis's tracking: a DEL there is heard, the key decided by Redis again.
rcmd('DEL', 'rl:dr:x');
ok(wait_until(2, sub { rl(http_get('/dr?k=x')) eq 'PASSED' }, 0.05),
    'a DEL on the regional Redis reaches the deny cache (its tracking): admitted again');
{
    my @res = map { http_get('/dboth?k=y') } 1 .. 3;
    is(join(' ', map { rl($_) } @res), 'PASSED PASSED REJECTED', 'dq2 + dr: the regional zone rejects the third');
    # The third's unit on the default Redis goes back in a script call of its own: counted
    # before the calls that follow are (a slow worker, valgrind, sends it later).
    ok(wait_until(5 * $SLOW, sub { dcmd('ZCARD', 'rl:dq2:y') == 2 }, 0.05),
        'dq2 counts only the 2 admitted (the rejected one given back)');
    my ($bd, $br) = (evalsha_on(\&dcmd), evalsha_on(\&rcmd));
    @res = map { http_get('/dboth?k=y') } 1 .. 10;
    is(tally(map { rl($_) } @res), 'REJECTED_CACHED x 10', 'dq2 + dr: then answered from the deny cache');
    is(evalsha_on(\&dcmd) - $bd, 0, 'dq2 + dr: no script call on the default Redis');
    is(evalsha_on(\&rcmd) - $br, 0, 'dq2 + dr: nor on the regional one');
}

# --- Metrics: the named backend's Redis series are labelled with its name.
my %metric_lines;
sub redis_series {
    my ($text, $name) = @_;
    # "name{labels} value" lines of one metric, as { labels => value }.
    my %s;
    for (split /\n/, $text) {
        $s{$1} = $2 if /^\Q$name\E\{([^}]*)\} (\S+)$/;
    }
    return \%s;
}
sub check_metrics {
    my ($backend, $absent) = @_;
    my $r = http_get('/metrics');
    is($r->{status}, 200, 'metrics answer');
    my $calls = redis_series($r->{body}, 'ratelimit_redis_call_duration_seconds_count');
    my $dport = $ENV{TEST_NGINX_REDIS_PORT};
    my @named = grep { /(^|,)backend="\Q$backend\E"(,|$)/ } keys %$calls;
    my @plain = grep { !/backend=/ } keys %$calls;
    is(scalar @named, 1, "one round-trip series labelled backend=\"$backend\"")
        or diag(explain($calls));
    ok(@named && $calls->{ $named[0] } >= 1, "backend=\"$backend\": its round trips counted ($named[0])");
    is(join(' ', sort @plain), "server=\"127.0.0.1:$dport\"", 'the unnamed backend keeps its series, without a backend label')
        or diag(explain($calls));
    ok(@plain && $calls->{ $plain[0] } >= 1, 'the unnamed backend: its round trips counted');
    ok(!grep({ /backend="\Q$absent\E"/ } split /\n/, $r->{body}), "no series labelled backend=\"$absent\"")
        if $absent;
    my $errors = redis_series($r->{body}, 'ratelimit_redis_errors_total');
    ok((grep { /backend="\Q$backend\E"/ } keys %$errors), "errors_total has backend=\"$backend\" series too")
        or diag(explain($errors));
    return $r->{body};
}
check_metrics('regional');

# --- The regional Redis stopped: q alone is exact and quick; both follow ratelimit_fail for r only.
{
    is(rl(http_get('/r?k=warm')), 'PASSED', 'regional answers before the outage');
    my $log_pos = length error_log_text();
    kill 'STOP', $regional->pid;
    my @res = map { http_get('/q?k=s1') } 1 .. 5;
    is(statuses(@res), '200 200 200 429 429', 'regional stopped: q alone is exact (3 x 200, then 429)');
    my ($slowest) = sort { $b <=> $a } map { $_->{elapsed} } @res;
    cmp_ok($slowest, '<', 0.5 * $SLOW, sprintf('regional stopped: q alone answers within its own timeout (slowest %.3f s)', $slowest));

    # How long q counts a unit the regional outage refused (docs/sizing.md's bound: the slower
    # backend's timeout, 300 ms, plus the give-back's round trip), watched from the default
    # Redis every 2 ms while the request runs; first, while the breaker still waits for Redis.
    SKIP: {
        skip 'valgrind: a slowed worker stretches every interval it measures', 2 if $SLOW > 1;
        my $h = http_start(port => nginx()->port, request => 'GET /closed?k=s4');
        my ($first, $last, $t0) = (undef, undef, time);
        while (time - $t0 < 2) {
            my ($n, $now) = (dcmd('ZCARD', 'rl:q:s4'), time);
            ($first, $last) = ($first // $now, $now) if $n;
            last if defined $first && !$n;
            sleep 0.002;
        }
        is(http_finish($h, 3)->{status}, 503, 'fail closed, watched: 503');
        my $ms = defined $first ? 1000 * ($last - $first) : -1;
        ok($ms >= 0 && $ms <= 300 + 100, sprintf("fail closed: q counted the refused unit for %.0f ms (bound: 300 ms timeout + the give-back's round trip)", $ms));
    }

    # fail open (the default): r counts as admitted while q decides, and q counts.
    @res = map { http_get('/both?k=s2') } 1 .. 6;
    is(statuses(@res), '200 200 200 429 429 429', 'both, fail open: admitted while q has room, then q rejects');
    ($slowest) = sort { $b <=> $a } map { $_->{elapsed} } @res;
    cmp_ok($slowest, '<', 1.0 * $SLOW, sprintf('both, fail open: each within the regional timeout (300 ms; slowest %.3f s)', $slowest));
    note('both, fail open: ' . join ' ', map { sprintf '%s(%.3fs)', rl($_), $_->{elapsed} } @res);
    is(dcmd('ZCARD', 'rl:q:s2'), 3, 'both, fail open: q counted the 3 admitted');

    # settle= in a zone of the backend that answered: settled as when both answer.
    for my $how (['bothset', 'FAILED_OPEN'], ['localset', 'PASSED_LOCAL']) {
        my ($loc, $status) = @$how;
        is(rl(http_get("/$loc?k=s6$loc&used=3")), $status, "$loc: admitted $status");
        ok(wait_until(5 * $SLOW, sub { dcmd('ZCARD', "rl:qs:s6$loc") == 3 }, 0.05),
            "$loc: q's key settled to the 3 units used, not the estimate of 10");
    }

    # fail closed: 503, and q's units given back (its count does not grow).
    @res = map { http_get('/closed?k=s3') } 1 .. 4;
    is(statuses(@res), '503 503 503 503', 'both, fail closed: 503 for r');
    ($slowest) = sort { $b <=> $a } map { $_->{elapsed} } @res;
    cmp_ok($slowest, '<', 1.0 * $SLOW, sprintf('both, fail closed: each within the regional timeout (slowest %.3f s)', $slowest));
    note('both, fail closed: ' . join ' ', map { sprintf '%s(%.3fs)', rl($_), $_->{elapsed} } @res);
    sleep 0.5;
    is(dcmd('ZCARD', 'rl:q:s3'), 0, "both, fail closed: q's units given back, its count does not grow");

    # fail local: r decided by this worker alone (its share of r's limit), q still by Redis.
    @res = map { http_get('/local?k=s5') } 1 .. 4;
    is(join(' ', map { rl($_) } @res), 'PASSED_LOCAL PASSED_LOCAL PASSED_LOCAL REJECTED',
        "both, fail local: r decided by the worker, q by Redis (3 admitted, then q's 429)");
    is(dcmd('ZCARD', 'rl:q:s5'), 3, 'both, fail local: q counted the 3 admitted');
    my $log = substr(error_log_text(), $log_pos);
    like($log, qr/ratelimit: (?:redis|backend) "regional"[^\n]*timed out/, 'the error log names the backend that timed out');
    # The module's own lines (not a rejection's "limiting requests"), the connection's and the
    # breaker's included: each says which backend.
    my @unnamed = grep { /\[(error|warn)\][^\n]*ratelimit:/ && !/limiting requests by zone/ && !/"regional"/ }
        split /\n/, $log;
    is(scalar @unnamed, 0, 'every ratelimit error and warning during the outage names "regional"')
        or diag(join "\n", @unnamed[0 .. ($#unnamed < 4 ? $#unnamed : 4)]);

    kill 'CONT', $regional->pid;
    ok(wait_until(10, sub { rl(http_get('/r?k=back')) eq 'PASSED' }, 0.1), 'regional back: decided by Redis again');
    @res = map { http_get('/closed?k=s3') } 1 .. 4;
    is(statuses(@res), '200 200 200 429', "regional back: q still had its 3 units for the key fail closed refused");
}

# --- A reload renames the backend: the keys stay where they were.
{
    my @before = map { http_get('/r?k=ren')->{status} } 1 .. 2;
    my @b2 = map { http_get('/both?k=ren2')->{status} } 1 .. 2;
    my @old = nginx()->worker_pids;
    my $renamed = ($backends =~ s/name=regional/name=eu/r) . ($zones =~ s/redis=regional/redis=eu/gr);
    ok(scalar(reload_nginx(http_config => $renamed, config => $config)), 'reload with the backend renamed regional -> eu');
    ok(wait_until(10, sub { !grep { RLTest::Proc::alive($_) } @old }), 'old workers exit');
    my @after = map { http_get('/r?k=ren')->{status} } 1 .. 2;
    my @a2 = map { http_get('/both?k=ren2')->{status} } 1 .. 2;
    is("@before @after", '200 200 200 200', 'r: 2 before and 2 after the rename admitted');
    is("@b2 @a2", '200 200 200 429', 'both: q counts on across the reload (3 of 4)');
    sleep 0.5;
    is(rcmd('ZCARD', 'rl:r:ren'), 4, 'r counts the 4 on the same Redis under its new name');
    is(rcmd('ZCARD', 'rl:r:ren2'), 3, 'r counts 3 of /both (the rejected one given back)');
    is(dcmd('ZCARD', 'rl:q:ren2'), 3, 'q counts 3');
    is(keys_of(dcmd('KEYS', 'rl:r:*')), '', 'still no key of r on the default Redis');
    check_metrics('eu', 'regional');
    unlike(error_log_text(), qr/\[emerg\]/, 'the reload was accepted');
}
ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'one gateway');

# ---------------------------------------------------------------------------
# The default a single server, name=global a Redis Cluster.
{
    my $cluster = RLTest::Cluster->new(dir => servroot() . '/cluster', primaries => 3, replicas => 0)->start;
    my @primaries = $cluster->primaries;
    $ENV{TEST_NGINX_CLUSTER_PORT} = $primaries[0];
    # Two keys per primary, for each zone on the Cluster.
    my $spread = sub {
        my ($tag) = @_;
        my (%on, @k);
        for my $i (1 .. 500) {
            my $node = $cluster->primary_of_slot($cluster->keyslot("rl:quota:$tag$i"));
            next if ($on{$node} // 0) >= 2;
            $on{$node}++;
            push @k, "$tag$i";
            last if @k == 2 * @primaries;
        }
        return @k;
    };
    my @rq = $spread->('a');
    my @sq = $spread->('b');
    is(scalar @rq, 2 * @primaries, 'keys of the quota zone on every primary');
    my $http = <<'EOF';
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=500ms;
    ratelimit_redis 127.0.0.1:$TEST_NGINX_CLUSTER_PORT name=global cluster=on timeout=2s;
    ratelimit_zone rate  key=$arg_k limit=100 window=1m;
    ratelimit_zone small key=$arg_k limit=2 window=1m;
    ratelimit_zone quota key=$arg_k limit=5 window=1h redis=global;
EOF
    my $conf = <<'EOF';
    add_header X-RL $ratelimit_status always;
    location = /rq { ratelimit rate; ratelimit quota; }
    location = /sq { ratelimit small; ratelimit quota; }
EOF
    start_nginx(http_config => $http, config => $conf);
    for my $k (@rq) {
        my @res = map { http_get("/rq?k=$k") } 1 .. 7;
        is(statuses(@res), '200 200 200 200 200 429 429', "rq $k: the Cluster's quota (5) decides");
    }
    for my $k (@sq) {
        my @res = map { http_get("/sq?k=$k") } 1 .. 4;
        is(statuses(@res), '200 200 429 429', "sq $k: the single server's zone (2) decides");
    }
    sleep 1;
    for my $k (@rq) {
        my $node = $cluster->primary_of_slot($cluster->keyslot("rl:quota:$k"));
        is($cluster->cmd($node, 'ZCARD', "rl:quota:$k"), 5, "rq $k: quota counts 5 on its node ($node)");
        is(dcmd('ZCARD', "rl:rate:$k"), 5, "rq $k: rate counts 5 on the single server (2 given back)");
    }
    for my $k (@sq) {
        my $node = $cluster->primary_of_slot($cluster->keyslot("rl:quota:$k"));
        is($cluster->cmd($node, 'ZCARD', "rl:quota:$k"), 2, "sq $k: quota counts 2 on its node: the Cluster took the give-backs");
        is(dcmd('ZCARD', "rl:small:$k"), 2, "sq $k: small counts 2 on the single server");
    }
    is(keys_of(dcmd('KEYS', 'rl:quota:*')), '', 'no key of the Cluster zone on the single server');
    for my $p (@primaries) {
        is(keys_of($cluster->cmd($p, 'KEYS', 'rl:rate:*')) . keys_of($cluster->cmd($p, 'KEYS', 'rl:small:*')), '',
            "no key of the single server's zones on primary $p");
    }
    ok(stop_nginx(), 'nginx quits gracefully');
    my $log = error_log_text();
    check_no_alerts($log, 'cluster + single');
    unlike($log, qr/\[error\](?![^\n]*limiting requests by zone)/, 'no decision failed');
    $cluster->stop;
}

# ---------------------------------------------------------------------------
# Leases on both backends, two workers hammering; the access log audited.
{
    my $http = $backends . '    log_format audit "' . log_format('$ratelimit_time') . "\";\n" . <<'EOF';
    ratelimit_zone lq key=$arg_k limit=40 window=2s lease=auto;
    ratelimit_zone lr key=$arg_k limit=40 window=2s lease=auto redis=regional;
    ratelimit_zone Lq key=$arg_k limit=100000 window=1h lease=auto;
    ratelimit_zone Lr key=$arg_k limit=100000 window=1h lease=auto redis=regional;
    access_log logs/audit.log audit;
EOF
    my $conf = <<'EOF';
    ratelimit_fail closed;
    ratelimit_log_level info;
    location = /lq    { ratelimit lq; }
    location = /lr    { ratelimit lr; }
    location = /lboth { ratelimit lq; ratelimit lr; }
    location = /Lq    { ratelimit Lq; }
    location = /Lr    { ratelimit Lr; }
    location = /Lboth { ratelimit Lq; ratelimit Lr; }
EOF
    my %zones_of = (lq => ['lq'], lr => ['lr'], lboth => ['lq', 'lr'],
        Lq => ['Lq'], Lr => ['Lr'], Lboth => ['Lq', 'Lr']);
    start_nginx(workers => 2, log_level => 'notice', http_config => $http, config => $conf);
    my @keys = qw(h1 h2 h3);
    my $until = time + 5;
    while (time < $until) {
        my @specs = map { my $k = $_; map { { port => server_port(), request => "GET /$_?k=$k&c=1" } } sort keys %zones_of } (@keys) x 6;
        http_parallel(\@specs, timeout => 10);
    }
    ok(stop_nginx(), 'nginx quits gracefully, giving back what it holds on both backends');
    open my $fh, '<', servroot() . '/logs/audit.log' or die "audit.log: $!";
    my $bad = 0;
    my $records = parse_log(do { local $/; <$fh> }, \$bad);
    is($bad, 0, "every access log line has the audit's shape");
    my (%adm, %status);
    for my $r (@$records) {
        my $zones = $zones_of{ $r->{zone} } or next;
        $status{"$r->{zone} $r->{rl_status}"}++;
        next unless $r->{status} == 200 && $r->{rl_status} =~ /^PASSED(_LEASE)?$/;
        my @iv = ($r->{time}, $r->{rl_status} eq 'PASSED' ? $r->{msec} + 10 : $r->{time});
        push @{ $adm{$_}{ $r->{key} } }, [@iv, $r->{cost}] for @$zones;
    }
    note(join ', ', map { "$_: $status{$_}" } sort keys %status);
    for my $zone (qw(lq lr)) {
        for my $k (@keys) {
            my $res = check('sliding_log', $adm{$zone}{$k} || [], limit => 40, window => 2000);
            ok($res->{ok}, "$zone $k: never over 40 in 2 s (" . summary($res) . ')')
                or diag(join "\n", @{ $res->{examples} || [] });
        }
    }
    ok(($status{'lq PASSED_LEASE'} // 0) > 0, 'the default backend admitted from reservations')
        or diag(explain \%status);
    ok(($status{'lr PASSED_LEASE'} // 0) > 0, 'the regional backend admitted from reservations')
        or diag(explain \%status);
    for my $k (@keys) {
        my $q = @{ $adm{Lq}{$k} || [] };
        my $r = @{ $adm{Lr}{$k} || [] };
        is(dcmd('ZCARD', "rl:Lq:$k"), $q, "Lq $k: the default Redis counts the $q admitted");
        is(rcmd('ZCARD', "rl:Lr:$k"), $r, "Lr $k: the regional Redis counts the $r admitted");
    }
    my $log = error_log_text();
    check_no_alerts($log, 'leases on both');
    unlike($log, qr/\[error\]/, 'no decision failed');
}

# ---------------------------------------------------------------------------
# A reset on the regional Redis while two gateways run: r's key deleted, then
# re-created by the second gateway; nothing of the old life spent into the new.
{
    my $http = $backends . <<'EOF';
    ratelimit_deny_cache off;
    ratelimit_zone rr key=$arg_k limit=40 window=1m lease=10 lease_time=10s redis=regional;
    ratelimit_zone qq key=$arg_k limit=1000 window=1m;
EOF
    my $conf = <<'EOF';
    add_header X-RL $ratelimit_status always;
    location = /rr { ratelimit rr; }
    location = /qr { ratelimit qq; ratelimit rr; }
EOF
    my %gw = map { $_ => start_nginx(name => "gw$_", http_config => $http, config => $conf) } qw(A B);
    my $req = sub { my ($g, $path, $k) = @_; rl(http_get("/$path?k=$k", -port => $gw{$g}->port)) };
    # A worker's first grant starts its tracker, which connects within a second.
    for my $g (sort keys %gw) {
        wait_until(20, sub { (join ' ', map { $req->($g, 'rr', "warm$g") } 1 .. 2) =~ /PASSED_LEASE/ });
    }
    sleep 1.5;
    my %after;
    # Heard at the key's own next request, or first at another key's: then each gateway checks
    # its reservation before the key's next decision starts its new life (the DEL left the
    # ledger; a check must not take it for the key's life).
    for my $case (qw(rr qr rr-other)) {
        my ($path, $other) = $case =~ /^(\w+)(-other)?$/;
        my $k = "reset-$case";
        my @first = map { $req->('A', $path, $k) } 1 .. 2;
        note("$case: A's first two: @first");
        my $before = scalar grep { /^PASSED/ } @first;
        # Traffic on both gateways, the key deleted on the regional Redis in the middle of it,
        # then re-created by B's next request.
        $before += scalar grep { /^PASSED/ } map { $req->($_ % 2 ? 'A' : 'B', $path, $k) } 1 .. 10;
        rcmd('DEL', "rl:rr:$k");
        # Time for Redis's invalidation to reach both gateways' trackers (as t/413): a reset is
        # heard within a round trip, what a gateway spends before that is the documented
        # window; a worker under valgrind takes ten times as long to read it.
        sleep 0.2 * $SLOW;
        if ($other) {
            $req->($_, $path, "$k-elsewhere") for qw(A B);
            sleep 0.1 * $SLOW;
        }
        my @gw = map { $_ % 2 ? 'A' : 'B' } 0 .. 99;
        my @after = map { $req->($_, $path, $k) } @gw;
        my $n = grep { /^PASSED/ } @after;
        ok($n <= 40, "$case: after the reset $n of 100 admitted (limit 40)")
            # Each request's gateway and status, in order, to tell whose unit was over.
            or diag(join ' ', map { "$gw[$_]:$after[$_]" } 0 .. 99);
        ok($n >= 20, "$case: at most the two gateways' reservations unspent ($n)");
        $after{$case} = [$before, $n];
    }
    ok(stop_nginx($_), "gateway $_ quits gracefully, giving back what it holds") for qw(gwA gwB);
    for my $case (sort keys %after) {
        my ($before, $n) = @{ $after{$case} };
        is(rcmd('ZCARD', "rl:rr:reset-$case"), $n,
            "$case: the regional Redis counts exactly the $n admitted since the reset");
    }
    my ($before, $n) = @{ $after{qr} };
    is(dcmd('ZCARD', 'rl:qq:reset-qr'), $before + $n,
        'qr: the default Redis counts every admitted request (' . ($before + $n) . '), the rejected ones given back');
    check_no_alerts(error_log_text($_), "reset $_") for qw(gwA gwB);
}

done_testing();

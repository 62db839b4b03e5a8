# Never over the limit, proved from the access logs (issue 20, reservations):
# two gateways of two workers share one Redis; for every algorithm (sliding
# log, packed log, counter, GCRA, an hourly quota, a balance) a handful of keys
# is hammered far over its limit from both gateways at once while a paced
# client keeps another key at half its limit.  Afterwards RLTest::Audit reads
# both access logs and checks each key against its algorithm's promise (no
# window over the limit, the counter's own estimate, GCRA conformance, the
# period's count, the balance), and the paced keys are admitted >= 99 % of the
# time.  The same with Redis restarted in the middle (fail closed), with a
# worker SIGKILLed while it holds reservations (its units lapse within
# window + lease_time), and across a reload and a graceful shutdown (Redis
# then counts exactly what the logs admitted: unused units were given back).
#
# With `lease=` refused by nginx -t (a module without reservations) the zones
# run in exact mode, one Redis decision per request, and everything must hold
# as well: that is the audit's own validation.  The lease-only assertions
# (units were held when the worker died, before the reload) are skipped then.
#
# Decision times.  Each admission is placed in an interval its decision
# certainly lies in, and the audit flags only admissions certainly inside one
# window: a wider interval can hide an overshoot of at most its width, never
# invent one.  With the keys hammered to their limit the audit is sharp: one
# unit less of limit and every hammered key fails (checked, exact mode).
# - $msec (the log phase) trails the decision.  [start, $msec + SLACK]:
#   start = $msec - $request_time is when the request's first bytes were read,
#   before any decision about it (exact: both are the worker's cached clock,
#   in ms).  SLACK covers the other way: Redis' TIME for a reply the worker
#   reads later in the event loop iteration that set its cached clock, at
#   most that iteration's run so far; 10 ms is generous on a loaded machine
#   (0.5 % of the window).
# - $ratelimit_time (the module's: when the decision was asked for, or made
#   from the worker's memory) ends the guesswork for admissions from a
#   reservation (PASSED_LEASE): [t - S, t + S], S = TEST_RL_AUDIT_SLACK_MS,
#   default 0.  An exact decision (PASSED) is the script's, at the clock it
#   was sent or Redis' TIME a little later: [t, $msec + SLACK].  Every t must
#   lie within its request's life, [start, $msec] (checked).
use lib 't/lib';
use RLTest;
use RLTest::Audit qw(check parse_log admissions_by_key log_format summary to_ms);
use RLTest::Script qw(decide);
use Time::HiRes qw(time sleep);
use POSIX ();

# --- Knobs, each in one place.
# The reservation parameters every zone gets (TEST_RL_LEASE=off: exact mode).
# 300 ms: at most a quarter of the 2 s windows (nginx -t refuses more), and short enough for
# gcra to reserve (lease_time + T <= burst * T: 300 + 40 <= 400 ms).
my $LEASE = $ENV{TEST_RL_LEASE} // 'lease=auto lease_time=300ms';
# The decision-time variable of the log: 'auto' is $ratelimit_time where the
# module has it (nginx -t is asked), else $msec.
my $TIME_VAR = $ENV{TEST_RL_TIME_VAR} // 'auto';
# ms a decision may come after the log's $msec (see above).
my $MSEC_SLACK = 10;
# How long the main phase hammers (s).  TEST_RL_NO_WRK=1 hammers with forked
# Perl clients even where wrk is installed (they are slower, the checks the same).
my $SECS = $ENV{TEST_RL_AUDIT_SECS} || 10;

my $T_START = time;
sub stamp { note(sprintf '[%.1f s] %s', time - $T_START, $_[0]) }

my ($W, $LIMIT) = (2000, 50);        # the rate zones: 50 per 2 s
my $PACE = 2 * $W / $LIMIT / 1000;   # the paced client: one request per key every 80 ms
# Zones: name => [nginx parameters, audit parameters].  Clocks alternate between
# Redis TIME and the gateway's, so that both reservation paths are audited.
my %ZONE = (
    log     => ["limit=$LIMIT window=2s", { algorithm => 'sliding_log', limit => $LIMIT, window => $W }],
    packed  => ["limit=$LIMIT window=2s algorithm=sliding_log_packed clock=nginx",
                { algorithm => 'sliding_log_packed', limit => $LIMIT, window => $W }],
    counter => ["limit=$LIMIT window=2s algorithm=sliding_counter",
                { algorithm => 'sliding_counter', limit => $LIMIT, window => $W }],
    gcra    => ["limit=$LIMIT window=2s algorithm=gcra burst=10 clock=nginx",
                { algorithm => 'gcra', limit => $LIMIT, window => $W, burst => 10 }],
    quota   => ['limit=300 period=hour', { algorithm => 'quota', limit => 300, period => 'hour' }],
    credit  => ['limit=1 algorithm=balance status=402', { algorithm => 'balance' }],
);
my @ZONES = qw(log packed counter gcra quota credit);
# For the reload and shutdown: windows that nothing leaves during the test and
# limits it does not reach, so that Redis' count is every unit ever recorded.
# GCRA's T (3.6 s) exceeds lease_time, so one unit not given back shows.
my %HOLD = (
    logH     => 'limit=100000 window=1h',
    packedH  => 'limit=10000 window=1h algorithm=sliding_log_packed clock=nginx',
    counterH => 'limit=100000 window=1h algorithm=sliding_counter',
    gcraH    => 'limit=1000 window=1h algorithm=gcra burst=1000 clock=nginx',
    quotaH   => 'limit=100000 period=day',
    creditH  => 'limit=1 algorithm=balance',
);
my @HOLD = qw(logH packedH counterH gcraH quotaH creditH);

# =====================================================================
# 1. The audit itself, on hand-made sequences: each must pass or must fail.
# =====================================================================
sub at { [$_[0], $_[0], $_[1] // 1] }             # an admission at an exact ms
sub within { [$_[0], $_[1], $_[2] // 1] }          # somewhere in [lo, hi]
sub verdict_is {
    my ($want, $alg, $adm, $name, %o) = @_;
    my $r = check($alg, $adm, %o);
    Test::More::is($r->{ok} ? 'pass' : 'FAIL', $want, "audit $alg: $name (" . summary($r) . ')')
        or Test::More::diag(explain($r));
    return $r;
}
{
    my %l = (limit => 3, window => 1000);
    verdict_is(pass => 'sliding_log', [map { at($_) } 0, 1, 2, 1000], '3 in a window, the 4th as the 1st leaves', %l);
    verdict_is(FAIL => 'sliding_log', [map { at($_) } 0, 1, 2, 999], '4 within 999 ms', %l);
    verdict_is(FAIL => 'sliding_log', [map { at(5) } 1 .. 4], '4 in the same ms', %l);
    verdict_is(FAIL => 'sliding_log', [at(0, 2), at(999, 2)], 'costs count: 2 + 2', %l);
    verdict_is(pass => 'sliding_log', [at(0, 2), at(1000, 2)], 'costs 2 + 2 a window apart', %l);
    verdict_is(FAIL => 'sliding_log_packed', [at(0), at(400, 3)], 'packed is the same log', %l);
    my $r = verdict_is(pass => 'sliding_log', [within(0, 5), within(1, 6), within(2, 7), within(998, 1003)],
        'intervals that may lie a window apart: not certain', %l);
    Test::More::is($r->{worst}, 3, 'audit sliding_log: the worst certain window holds 3');
    verdict_is(FAIL => 'sliding_log', [within(0, 5), within(1, 6), within(2, 7), within(990, 995)],
        'intervals certainly inside one window', %l);

    my %c = (limit => 10, window => 1000);
    my @b0 = map { at($_) } 0 .. 9;
    verdict_is(pass => 'sliding_counter', [@b0, (at(1500)) x 5], 'prev 10 weighs 5 at mid-window: 5 more', %c);
    verdict_is(FAIL => 'sliding_counter', [@b0, (at(1500)) x 6], '6 more at mid-window', %c);
    verdict_is(pass => 'sliding_counter', [@b0, (at(1999)) x 9], 'weight rounded up: 1 at the last ms', %c);
    verdict_is(FAIL => 'sliding_counter', [@b0, (at(1999)) x 10], '10 at the last ms: ceil(0.01) = 1, 11', %c);
    verdict_is(pass => 'sliding_counter', [@b0, (at(1500)) x 5, (at(1999)) x 4], 'cur grows within the bucket', %c);
    verdict_is(FAIL => 'sliding_counter', [@b0, (at(1500)) x 5, (at(1999)) x 5], 'cur over at its last ms', %c);
    verdict_is(FAIL => 'sliding_counter', [at(1500, 2), @b0, (at(1500)) x 4], 'costs, in any input order', %c);
    verdict_is(pass => 'sliding_counter', [at(1500, 2), @b0, (at(1500)) x 3], 'costs: 5 + 2 + 3', %c);
    verdict_is(pass => 'sliding_counter', [(map { at(990 + $_) } 0 .. 9), (at(1990)) x 9],
        'over a rolling window by design, within its estimate', %c);
    verdict_is(FAIL => 'sliding_log', [(map { at(990 + $_) } 0 .. 9), (at(1990)) x 9],
        'the same sequence breaks the log', limit => 10, window => 1000);
    $r = verdict_is(pass => 'sliding_counter', [@b0, within(995, 1005), (at(1500)) x 5],
        'an interval straddling a bucket edge is left out', %c);
    Test::More::is($r->{straddling}, 1, 'audit sliding_counter: and counted as such');

    my %g = (limit => 10, window => 1000, burst => 2);    # T = 100 ms
    verdict_is(pass => 'gcra', [at(0), at(0), at(200), at(300), at(400)], 'burst 2, then one per T', %g);
    verdict_is(FAIL => 'gcra', [at(0), at(0), at(0)], '3 at once with burst 2', %g);
    verdict_is(pass => 'gcra', [at(0), at(0), at(150)], 'TAT 1.5 T ahead', %g);
    verdict_is(FAIL => 'gcra', [at(0), at(0), at(100), at(150)], 'TAT 2.5 T ahead', %g);
    verdict_is(pass => 'gcra', [at(0, 2)], 'cost 2 = burst', %g);
    verdict_is(FAIL => 'gcra', [at(0, 3)], 'cost 3 > burst', %g);
    verdict_is(pass => 'gcra', [at(0), at(5000), at(5000)], 'an idle TAT falls back to now', %g);
    my %g3 = (limit => 3, window => 1000, burst => 1);     # T = 333.33 ms: exact arithmetic
    verdict_is(FAIL => 'gcra', [at(0), at(333)], 'T = 1000/3: 333 ms is too early', %g3);
    verdict_is(pass => 'gcra', [at(0), at(334)], 'T = 1000/3: 334 ms conforms', %g3);
    verdict_is(pass => 'gcra', [at(0), at(0), at(334)], 'T = 1000/3, burst 2: the 3rd at 334 ms', %g3, burst => 2);
    verdict_is(FAIL => 'gcra', [at(0), at(0), at(333)], 'T = 1000/3, burst 2: the 3rd at 333 ms', %g3, burst => 2);
    verdict_is(FAIL => 'gcra', [within(0, 0), within(0, 0), within(100, 110), within(150, 160)],
        'intervals: 4 units certainly inside 160 ms', %g);
    verdict_is(pass => 'gcra', [within(0, 0), within(0, 0), within(100, 110), within(150, 260)],
        'intervals: not certain', %g);
    # The interval algorithm on exact instants is the virtual scheduling, figure for figure.
    srand(410);
    my $same = 0;
    for my $n (1 .. 200) {
        my ($t, @a) = (0);
        for (1 .. 3 + int rand 12) { $t += int rand 150; push @a, at($t, 1 + int rand 2) }
        my %o = (limit => 10, window => 1000, burst => 1 + int rand 3);
        my ($v, $i) = (check(gcra => \@a, %o), check(gcra => \@a, %o, intervals => 1));
        $same++ if $v->{ok} == $i->{ok} && abs($v->{worst} - $i->{worst}) < 1e-9;
    }
    Test::More::is($same, 200, 'audit gcra: spans and virtual scheduling agree on 200 random sequences');

    my $h = 3_600_000;
    my %q = (limit => 3, period => 'hour');
    verdict_is(pass => 'quota', [map { at(5 * $h + $_) } 0, 10, $h - 1], '3 in an hour', %q);
    verdict_is(FAIL => 'quota', [map { at(5 * $h + $_) } 0, 10, 20, $h - 1], '4 in an hour', %q);
    verdict_is(pass => 'quota', [map { at(5 * $h + $_) } $h - 2, $h - 1, $h, $h + 1, $h + 2], '2 + 3 across the hour', %q);
    verdict_is(FAIL => 'quota', [at(5 * $h, 2), at(5 * $h + 9, 2)], 'costs count', %q);
    my @days = map { at(24 * $h * 10 + 22 * $h + $_) } -2, -1, 0, 1, 2 * $h - 1;
    verdict_is(pass => 'quota', \@days, 'days at UTC+02:00: 2 before 22:00 UTC, 3 after',
        limit => 3, period => 'day', utc_offset_min => 120);
    verdict_is(FAIL => 'quota', \@days, 'the same 5 in one UTC day', limit => 3, period => 'day');

    verdict_is(pass => 'balance', [at(1), at(2, 2)], '3 drawn of 3', credited => 3);
    verdict_is(FAIL => 'balance', [at(1), at(2, 2), at(3)], '4 drawn of 3', credited => 3);

    my $bad = 0;
    my $recs = parse_log("1733060000.123 1733060000.125 0.004 200 PASSED /log a 2 77\n"
        . "- 1733060000.130 0.000 429 REJECTED_CACHED /log a 1 77\ngarbage\n", \$bad);
    Test::More::is(scalar @$recs . " $bad", '2 1', 'parse_log: two records, one bad line counted');
    Test::More::is(join(' ', @{ $recs->[0] }{qw(time msec request_time status zone key cost)}),
        '1733060000123 1733060000125 4 200 log a 2', 'parse_log: ms, zone from the uri, cost');
    Test::More::ok(!defined $recs->[1]{time}, 'parse_log: an unset time is undef');
}

# =====================================================================
# 2. The audit against the script itself: the decisions lua/decide.lua makes
#    (injected clock, 3x overload, costs 1-3) pass, and any one request it
#    rejected, counted as admitted, fails.  Validates the formulas against
#    the real thing, rounding and all.
# =====================================================================
stamp('the audit against the script');
{
    # Two minutes before an hour ends: the quota's sequence (about 4 min) crosses it.
    my $T0 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000 + 3_600_000 - 120_000;
    my %alg = (
        sliding_log        => ['l', 20, 60_000, 0, { limit => 20, window => 60_000 }],
        sliding_log_packed => ['p', 20, 60_000, 0, { limit => 20, window => 60_000 }],
        sliding_counter    => ['c', 20, 60_000, 0, { limit => 20, window => 60_000 }],
        gcra               => ['g', 20, 60_000, 4, { limit => 20, window => 60_000, burst => 4 }],
        quota              => ['q', 20, 14401, 0, { limit => 20, period => 'hour' }],
        balance            => ['b', 1, 1, 0, { credited => 60 }],
    );
    srand(20);
    for my $name (sort keys %alg) {
        my ($letter, $limit, $window, $burst, $audit) = @{ $alg{$name} };
        my $key = "rl:audit:$name";
        redis_cmd('DEL', $key);
        redis_cmd('SET', $key, $audit->{credited}) if $letter eq 'b';
        my ($t, @adm, @rej) = ($T0);
        for (1 .. 240) {
            # A mean gap of a third of the spacing the limit allows (3 s), and
            # costs of 2 on average: 6 times the limit.  No quota decision in
            # the last second of the hour: keys expire on Redis' real clock,
            # and PX is the rest of the period.
            $t += int rand 2000;
            $t += 1000 if $letter eq 'q' && ($t + 1000) % 3_600_000 < 1000;
            my $cost = 1 + int rand 3;
            my $d = decide($t, [$key, $letter, $limit, $window, $cost, $burst]);
            die "script: " . $d->message . "\n" if ref $d ne 'HASH';
            push @{ $d->{allowed} ? \@adm : \@rej }, at($t, $cost);
        }
        my $r = check($name, \@adm, %$audit);
        Test::More::ok($r->{ok}, "script vs audit, $name: the script's admissions pass ("
            . summary($r) . ', ' . @rej . ' rejected)') or Test::More::diag(explain($r->{examples}));
        my $caught = grep { !check($name, [@adm, $_], %$audit)->{ok} } @rej;
        Test::More::is($caught, scalar @rej, "script vs audit, $name: each of its rejections, admitted, fails");
        redis_cmd('DEL', $key);
    }
}

# =====================================================================
# 3. The gateways.
# =====================================================================
stamp('the gateways');
my $dir = servroot();
my ($LEASES, $NO_LEASE) = (0, 'TEST_RL_LEASE=off');
if ($LEASE ne 'off') {
    my ($rc, $out) = nginx_t(http_config => "    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT;\n"
        . "    ratelimit_zone probe key=\$arg_k limit=$LIMIT window=2s $LEASE;\n", config => '');
    $LEASES = $rc == 0;
    # Exact mode stands in only for a module that knows no lease=: any other refusal (a
    # lease_time= the module's checks reject) would silently audit no reservation at all.
    Test::More::ok($LEASES || $out =~ /invalid parameter "lease/, "lease mode, or a module without lease=")
        or Test::More::diag($out);
    $NO_LEASE = 'lease= refused by nginx -t (' . ($out =~ /(invalid parameter "[^"]*")/ ? $1 : $out) . ')';
}
$LEASE = '' unless $LEASES;
if ($TIME_VAR eq 'auto') {
    my ($rc) = nginx_t(http_config => "    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT;\n"
        . "    log_format probe \"\$ratelimit_time\";\n", config => '');
    $TIME_VAR = $rc == 0 ? '$ratelimit_time' : '$msec';
}
my $LEASE_MS = !$LEASES ? 0 : $LEASE =~ /lease_time=(\d+)ms\b/ ? $1 : $LEASE =~ /lease_time=(\d+)s?\b/ ? 1000 * $1 : 1000;
Test::More::diag(($LEASES ? "lease mode: every zone has '$LEASE'" : "$NO_LEASE; the lease-only checks are skipped")
    . "; decision times from $TIME_VAR");

my $http = "    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT timeout=2s;\n"
    . join('', map { "    ratelimit_zone $_ key=\$arg_k $ZONE{$_}[0] $LEASE;\n" } @ZONES)
    . join('', map { "    ratelimit_zone $_ key=\$arg_k $HOLD{$_} $LEASE;\n" } @HOLD)
    . '    log_format audit "' . log_format($TIME_VAR) . "\";\n"
    . "    access_log logs/audit.log audit;\n";
# Rejections are logged at info, below the error log's level: tens of
# thousands of lines would only cost the gateways CPU.
my $config = "    ratelimit_fail closed;\n    ratelimit_log_level info;\n    add_header X-Pid \$pid always;\n"
    . "    add_header X-RL \$ratelimit_status always;\n"
    . join('', map { "    location = /$_ { ratelimit $_ cost=\$arg_c; }\n" } @ZONES, @HOLD)
    . "    location = /admin/log { ratelimit_admin log; }\n";
nginx()->write_html({ map { $_ => "ok\n" } @ZONES, @HOLD });
my @gw = map { start_nginx(name => "gw$_", workers => 2, log_level => 'notice',
    http_config => $http, config => $config) } 1, 2;
is(scalar(map { $_->worker_pids } @gw), 4, 'two gateways of two workers');

# The decision's interval for a log record (see the top).
my $AUDIT_SLACK = $ENV{TEST_RL_AUDIT_SLACK_MS} // 0;
sub interval {
    my ($r) = @_;
    return unless defined $r->{request_time};
    my ($start, $hi) = ($r->{msec} - $r->{request_time}, $r->{msec} + $MSEC_SLACK);
    return ($start, $hi) if $TIME_VAR eq '$msec';
    return unless defined $r->{time};
    return ($r->{time}, $hi) if $r->{rl_status} eq 'PASSED';
    return ($r->{time} - $AUDIT_SLACK, $r->{time} + $AUDIT_SLACK);
}

# Both gateways' records so far (the logs are read on from where the last call stopped).
my (@RECORDS, %read_to);
sub records {
    for my $g (@gw) {
        my $file = $g->prefix . '/logs/audit.log';
        open my $fh, '<', $file or die "$file: $!";
        seek $fh, $read_to{$file} // 0, 0;
        local $/;
        my $text = <$fh> // '';
        $text =~ s/[^\n]*\z//;    # a line being written is read next time
        $read_to{$file} = ($read_to{$file} // 0) + length $text;
        my $bad = 0;
        push @RECORDS, @{ parse_log($text, \$bad) };
        is($bad, 0, "every line of $file has the audit's shape") if $bad;
    }
    return \@RECORDS;
}

# --- Load.  wrk when installed (keep-alive, far more requests), else forked
# Perl clients; each hammers the given paths round robin on one gateway.
my ($WRK) = $ENV{TEST_RL_NO_WRK} ? () : grep { -x } map { "$_/wrk" } split /:/, $ENV{PATH} // '';
my $lua = "$dir/hammer.lua";
{
    open my $fh, '>', $lua or die "$lua: $!";
    print $fh <<'EOF';
local paths, n = {}, 0
function init(args) for i = 1, #args do paths[i] = args[i] end end
function request() n = n + 1; return wrk.format("GET", paths[n % #paths + 1]) end
EOF
}
sub spawn {
    my ($what, $code) = @_;
    my $pid = fork // die "fork: $!";
    if (!$pid) { $code->(); POSIX::_exit(0) }
    RLTest::Proc::register_pid($pid, $what);
    return $pid;
}
sub reap { for (@_) { waitpid $_, 0; RLTest::Proc::unregister_pid($_) } }

sub hammer {
    my ($secs, @paths) = @_;
    return map {
        my $port = $_->port;
        spawn('hammer', $WRK ? sub {
            open STDOUT, '>>', "$dir/wrk.out";
            open STDERR, '>&', \*STDOUT;
            exec $WRK, '-t1', '-c12', "-d${secs}s", '--timeout', '5s', '-s', $lua,
                "http://127.0.0.1:$port", '--', @paths;
        } : sub {
            my ($end, $n) = (time + $secs, 0);
            while (time < $end) {
                http_parallel([map { { port => $port, request => 'GET ' . $paths[$n++ % @paths] } } 1 .. 16],
                    timeout => 10);
            }
        });
    } @gw;
}

# One request per key every $PACE seconds at the earliest after the previous
# round (never catching up in a burst), gateways alternating.  Requests that
# got no answer are written to $file, one line each.
sub paced {
    my ($secs, $file, @paths) = @_;
    return spawn('paced client', sub {
        open my $err, '>', $file or die "$file: $!";
        $err->autoflush(1);
        my ($end, $last, $i) = (time + $secs, 0, 0);
        while (time < $end) {
            my $wait = $last + $PACE - time;
            sleep $wait if $wait > 0;
            $last = time;
            for my $path (@paths) {
                my $port = $gw[$i++ % 2]->port;
                my $t = time;
                my $r = http_request(port => $port, request => "GET $path", timeout => 5);
                printf $err "%.3f +%.3f s port %d GET %s: %s\n", $t, time - $t, $port, $path, $r->{error}
                    if $r->{error};
            }
        }
    });
}

# The keys of a phase: three hammered (costs 1, 1, 2) and a paced one per zone.
sub phase_paths {
    my ($p) = @_;
    my @h = map { my $z = $_; map { "/$z?k=${p}h$_&c=" . ($_ == 3 ? 2 : 1) } 1 .. 3 } @ZONES;
    my @p = map { "/$_?k=${p}p&c=1" } @ZONES;
    return (\@h, \@p);
}

my %credited;    # "zone key" => units credited to a balance
my %unanswered;  # phase => paced requests that got no answer
sub credit {
    my ($zone, $key, $n) = @_;
    redis_cmd('INCRBY', "rl:$zone:$key", $n);
    $credited{"$zone $key"} += $n;
}

sub run_phase {
    my ($p, $secs, $during) = @_;
    my ($h, $paced) = phase_paths($p);
    credit(credit => "${p}$_", 300) for qw(h1 h2 h3 p);
    my $t0 = time;
    my $file = "$dir/paced-$p.errors";
    my @pids = (hammer($secs, @$h), paced($secs, $file, @$paced));
    $during->($t0) if $during;
    reap(@pids);
    my @lost = do { open my $fh, '<', $file or die "$file: $!"; <$fh> };
    note("$p: paced request without an answer: $_") for @lost;
    $unanswered{$p} = scalar @lost;
    return time - $t0;
}

# The first distinct error lines of the gateways' logs, for a diagnosis.
sub first_errors {
    my %seen;
    my @e = grep { !$seen{$_}++ } map { /\[error\] \d+#\d+: (?:\*\d+ )?([^,]*)/ ? $1 : () }
        map { split /\n/, $_->error_log_text } @gw;
    return @e[0 .. ($#e < 2 ? $#e : 2)];
}

# Audit the keys of a phase (all phases with undef): every zone's keys against
# its promise, the paced keys' admission ratio.
my %totals;
sub audit_phase {
    my ($p, $tag, %o) = @_;
    my (%adm, %st, @odd, @astray);
    for my $r (@{ records() }) {
        next unless $ZONE{ $r->{zone} } && (!defined $p || $r->{key} =~ /^\Q$p\E[hp]/);
        my $s = $st{ $r->{zone} }{ $r->{key} } ||= { passed => 0, rejected => 0, failed => 0 };
        if ($r->{status} == 200) {
            $s->{passed}++;
            push @{ $adm{ $r->{zone} }{ $r->{key} } }, $r;
            push @odd, $r if $r->{rl_status} !~ /^PASSED(_LEASE)?$/;
        }
        $s->{rejected}++ if $r->{rl_status} =~ /^REJECTED/;
        $s->{failed}++ if $r->{rl_status} =~ /^FAILED/;
        push @astray, $r if $TIME_VAR ne '$msec' && $r->{rl_status} ne 'SKIPPED' && !(defined $r->{time}
            && $r->{time} >= $r->{msec} - ($r->{request_time} // 0) && $r->{time} <= $r->{msec});
    }
    if ($TIME_VAR ne '$msec') {
        is(scalar @astray, 0, "$tag: every decision's $TIME_VAR lies within its request's life")
            or diag(explain([map { "@$_{qw(time msec request_time status rl_status zone key)}" }
                @astray[0 .. ($#astray < 4 ? $#astray : 4)]]));
    }
    is(scalar @odd, 0, "$tag: every 200 was admitted by the limiter (PASSED or PASSED_LEASE)")
        or diag(explain([map { "@$_{qw(status rl_status zone key)}" } @odd[0 .. ($#odd < 4 ? $#odd : 4)]]));
    for my $z (@ZONES) {
        my %a = %{ $ZONE{$z}[1] };
        my $alg = delete $a{algorithm};
        my (@bad, @line);
        my $keys = $adm{$z} || {};
        for my $k (sort keys %$keys) {
            my $by = admissions_by_key($keys->{$k}, interval => \&interval);
            my $r = check($alg, $by->{$z}{$k}, %a, $z eq 'credit' ? (credited => $credited{"$z $k"} // 0) : ());
            push @line, "$k: " . summary($r);
            push @bad, "$k: " . join('; ', @{ $r->{examples} }) unless $r->{ok};
            my $t = $totals{$z} ||= { admissions => 0, units => 0 };
            $t->{admissions} += $r->{admissions};
            $t->{units} += $r->{units};
            # The hammered key that came closest to its bound.
            @$t{qw(worst bound)} = @$r{qw(worst bound)}
                if $k =~ /h\d$/ && (!defined $t->{worst} || $r->{worst} - $r->{bound} > $t->{worst} - $t->{bound});
        }
        ok(!@bad && @line, "$tag: $z ($alg) never over its limit")
            or diag(join "\n", @bad ? @bad : 'no admissions at all');
        note("$tag: $z: $_") for @line;
        next unless $o{sharp};
        # The audit is sharp: a limit one lower fails for every hammered key.
        # Holds where the keys are driven to their limit exactly (exact mode).
        my $tight = { gcra => 'burst', balance => 'credited' }->{$alg} // 'limit';
        my @missed;
        for my $k (grep { /h\d$/ } sort keys %$keys) {
            my %kp = (%a, $z eq 'credit' ? (credited => $credited{"$z $k"} // 0) : ());
            $kp{$tight}--;
            push @missed, $k if check($alg, admissions_by_key($keys->{$k}, interval => \&interval)->{$z}{$k}, %kp)->{ok};
        }
        SKIP: {
            skip "$tag: $z: hammered keys need not reach the limit exactly with leases", 1 if $LEASES;
            is("@missed", '', "$tag: $z: the audit is sharp: with its $tight one lower, every hammered key fails");
        }
    }
    return unless defined $p;
    my %by_status;
    for my $z (values %st) { for my $k (values %$z) { $by_status{$_} += $k->{$_} for keys %$k } }
    note("$tag: requests " . join ', ', map { "$_ $by_status{$_}" } sort keys %by_status);
    if ($o{no_failures}) {
        # Redis is up all along: every request is decided.
        is($by_status{failed}, 0, "$tag: no decision failed") or diag(join "\n", first_errors());
    }
    for my $z (@ZONES) {
        # The paced key: admitted, against what the limiter decided (a failure
        # while Redis is down is not the limiter's choice).
        my $s = $st{$z}{"${p}p"} || { passed => 0, failed => 0, rejected => 0 };
        my $decided = $s->{passed} + $s->{rejected};
        my $pct = $decided ? 100 * $s->{passed} / $decided : 0;
        cmp_ok($pct, '>=', 99, sprintf('%s: paced %s key admitted %d of %d decided (%.1f %%)',
            $tag, $z, $s->{passed}, $decided, $pct));
        # The hammered keys really were over their limits: each was rejected.
        my @h = sort grep { /h\d$/ } keys %{ $st{$z} };
        my @figures = map { "$_ $st{$z}{$_}{passed}/$st{$z}{$_}{rejected}" } @h;
        ok(@h == 3 && !grep({ !$st{$z}{$_}{rejected} } @h),
            "$tag: ${z}'s hammered keys were all over their limit (admitted/rejected: @figures)");
    }
    my $n = 0;
    $n += $_->{passed} + $_->{rejected} + $_->{failed} for map { values %$_ } values %st;
    return $n;
}

# =====================================================================
# 4. Main phase: both gateways hammer, the paced client paces.  The balance
#    is topped up while it is drawn (early enough for it to be drawn whole).
# =====================================================================
stamp('main phase');
my $took = run_phase('m', $SECS, sub {
    my ($t0) = @_;
    for my $i (1 .. int(($SECS - 2) / 2)) {
        sleep $t0 + 2 * $i - 0.5 - time if $t0 + 2 * $i - 0.5 > time;
        credit(credit => "mh$_", 50) for 1 .. 3;
    }
});
my $n = audit_phase('m', sprintf('main (%.1f s)', $took), sharp => 1, no_failures => 1);
note("main: $n requests logged") if $n;
is($unanswered{m}, 0, 'main: every paced request was answered');

# =====================================================================
# 5. Redis restarted in the middle, ratelimit_fail closed.  Redis saves its
#    data on the way down (a restart that loses the windows cannot keep any
#    limit, with or without reservations), the workers reconnect.
# =====================================================================
stamp('redis restart');
$took = run_phase('r', 8, sub {
    my ($t0) = @_;
    sleep 3;
    redis_cmd('CONFIG', 'SET', 'save', '3600 1');
    my $kept = redis_cmd('GET', 'rl:quota:mh1');
    my $t = time;
    redis()->restart;
    is(redis_cmd('GET', 'rl:quota:mh1'), $kept, 'redis restart: Redis kept its data (the main phase\'s quota)');
    note(sprintf 'redis restarted at %.1f s, down %.2f s', $t - $t0, time - $t);
});
$n = audit_phase('r', sprintf('redis restart (%.1f s)', $took));
my $failed = grep { $_->{key} =~ /^r[hp]/ && $_->{rl_status} eq 'FAILED_CLOSED' } @{ records() };
note("redis restart: $n requests logged, $failed failed closed while it was down");
is($unanswered{r}, 0, 'redis restart: every paced request was answered (failing closed when it must)');

# =====================================================================
# 6. A worker SIGKILLed while it holds reservations: nothing over the limit,
#    and its units lapse: window + lease_time after the kill, the key has its
#    whole limit for a fresh client.
# =====================================================================
stamp('worker killed');
my ($victim, $t_kill, $held, $admin);
my $LAPSE = ($W + $LEASE_MS) / 1000;
$took = run_phase('k', 5, sub {
    # The warm key: paced on one keep-alive connection, so one worker serves
    # it and (with leases) holds units for it.  lease=auto reserves for a key
    # busy enough over a reservation's life, again as each runs out: the kill
    # waits (a few seconds at most) until Redis shows units reserved recently,
    # scored more than 200 ms after now, so that they are still there when the
    # worker dies, not at the end of their life (a loaded machine also paces
    # more slowly at first).
    my $r = http_request(port => $gw[0]->port, request => 'GET /log?k=kw&c=1', keepalive => 1);
    $victim = header($r, 'X-Pid');
    my $sent = 1;
    my $reserved = sub { redis_cmd('ZCOUNT', 'rl:log:kw', '(' . (int(time * 1000) + 200), '+inf') };
    while ($sent < 16 || ($LEASES && !$reserved->() && $sent < 80)) {
        sleep $PACE;
        $r = http_request(sock => $r->{sock}, port => $gw[0]->port, request => 'GET /log?k=kw&c=1', keepalive => 1);
        $sent++;
    }
    $held = $reserved->();
    is(header($r, 'X-Pid'), $victim, "kill: the warm key was served by one worker ($sent requests)");
    die "kill: $victim is not a worker of gw1\n" unless grep { $_ == $victim } $gw[0]->worker_pids;
    kill 'KILL', $victim;
    $t_kill = time;
    # The hammering goes on; the dead worker's units must be gone by
    # window + lease_time after the kill (they were reserved before it).
    my $wait = $t_kill + $LAPSE + 0.01 - time;
    sleep $wait if $wait > 0;
    $admin = http_request(port => $gw[1]->port, request => 'GET /admin/log?key=kw')->{body};
});
SKIP: {
    skip "$NO_LEASE: no units to hold", 1 unless $LEASES;
    cmp_ok($held, '>', 0, "kill: the worker held reserved units of the warm key ($held) when it was killed")
        or diag(join "\n", grep { /ratelimit:|\[(?:warn|error|alert|crit)\]/ && !/\[debug\]/ }
            split /\n/, $gw[0]->error_log_text);
}
like($admin, qr/"remaining":$LIMIT,/, sprintf('kill: %.2f s (window + lease_time) after the kill, '
    . 'the warm key has its whole limit again (admin GET)', $LAPSE)) or diag($admin);
$n = audit_phase('k', sprintf('worker killed (%.1f s)', $took), no_failures => 1);
{
    my @st;
    my $c = http_request(port => $gw[1]->port, request => 'GET /log?k=kw&c=1', keepalive => 1);
    push @st, $c->{status};
    for (2 .. $LIMIT + 1) {
        $c = http_request(sock => $c->{sock}, port => $gw[1]->port, request => 'GET /log?k=kw&c=1', keepalive => 1);
        push @st, $c->{status} // $c->{error};
    }
    close $c->{sock} if $c->{sock};
    my %n;
    $n{$_}++ for @st[0 .. $LIMIT - 1];
    is(join(' ', map { "$_ x $n{$_}" } sort keys %n) . " then $st[$LIMIT]", "200 x $LIMIT then 429",
        "kill: a fresh client gets exactly the limit ($LIMIT), as if the dead worker's units were free");
}

# =====================================================================
# 7. Reload and graceful shutdown give unused units back: afterwards Redis
#    holds exactly what the access logs admitted.
# =====================================================================
stamp('reload and shutdown');
# Redis' count of units for a key of a hold zone, decoded from its value.
sub stored {
    my ($zone, $key, $first) = @_;
    my $k = "rl:$zone:$key";
    return redis_cmd('ZCARD', $k) if $zone eq 'logH';
    my $v = redis_cmd('GET', $k);
    return 0 unless defined $v;
    return length($v) / 6 if $zone eq 'packedH';
    if ($zone eq 'counterH') { my (undef, $cur, $prev) = unpack 'C V V', $v; return $cur + $prev }
    if ($zone eq 'quotaH') { my ($lo, $hi, $count) = unpack 'V v V', $v; return $count }
    return 100_000 - $v if $zone eq 'creditH';
    # gcraH: TAT = first decision + units * T (+ up to lease_time: a reservation
    # moves the TAT to at least now + lease); units = what that leaves, in T.
    # In 1/limit ms, exactly: units * W in [TAT - (hi + lease) * L, TAT - lo * L].
    my ($ms, $r) = unpack 'd< V', $v;
    my ($limit, $w) = (1000, 3_600_000);
    my ($lo, $hi) = @$first;
    my $tat = $ms * $limit + $r;
    my $min = RLTest::Audit::cdiv(max0($tat - ($hi + $LEASE_MS) * $limit), $w);
    my $max = RLTest::Audit::fdiv(max0($tat - $lo * $limit), $w);
    return [$min, $max];
}
sub max0 { $_[0] > 0 ? $_[0] : 0 }
sub hold_traffic {
    my ($secs, $key, @g) = @_;
    return spawn('hold traffic', sub {
        my ($end, $n) = (time + $secs, 0);
        while (time < $end) {
            http_parallel([map { my $z = $_; map { { port => $_->port, request => "GET /$z?k=$key&c=1" } } @g } @HOLD],
                timeout => 10);
        }
    });
}
sub compare_held {
    my ($tag, $key, $before) = @_;
    my @held;
    my $recs = [grep { $_->{key} eq $key } @{ records() }];
    my $by = admissions_by_key($recs, interval => \&interval);
    for my $z (@HOLD) {
        my $adm = $by->{$z}{$key} || [];
        my $units = 0;
        $units += $_->[2] for @$adm;
        my ($first) = sort { $a->[0] <=> $b->[0] } @$adm;
        my $got = $first ? stored($z, $key, $first) : 'none admitted';
        my $name = "$tag: $z: Redis counts what the logs admitted ($units units"
            . (defined $before->{$z} ? ", $before->{$z} before)" : ')');
        if (ref $got && $LEASES) {
            # GCRA with leases: reserved units were counted as arriving at r + lease_time, and
            # a give-back applies only while no other admission has moved the TAT since
            # (docs/leases.md): the TAT may only be later than the admissions say, never earlier.
            ok($units <= $got->[1], "$name: the TAT says at least $got->[0]..$got->[1]");
            diag("$name: the TAT is " . ($got->[0] - $units) . " units later") if $got->[0] > $units;
        } elsif (ref $got) {
            # GCRA: the TAT names the units only within its uncertainty (< 1 unit wide).
            ok($got->[0] <= $units && $units <= $got->[1], "$name: the TAT says $got->[0]..$got->[1]");
        } else {
            is($got, $units, $name);
        }
        push @held, "$z: " . ($before->{$z} - $units) if ($before->{$z} // 0) > $units;
    }
    SKIP: {
        skip "$NO_LEASE: nothing is held", 1 unless $LEASES;
        ok(@held, "$tag: units were held when it began, so some were given back (@held)");
    }
}
redis_cmd('SET', "rl:creditH:$_", 100_000) for qw(cr cq);

# Reload: traffic through gw1 only, HUP as soon as it stops (well within
# lease_time: the units are still held), wait for the old workers to leave.
reap(hold_traffic(1.5, 'cr', $gw[0]));
my %before = map { $_ => stored($_, 'cr', [0, 0]) } grep { !/gcra/ } @HOLD;
my @old = $gw[0]->worker_pids;
$gw[0]->reload;
ok(wait_until(10, sub { !grep { RLTest::Proc::alive($_) } @old }), 'reload: the old workers have left');
compare_held('reload', 'cr', \%before);

# Shutdown: traffic through both gateways, then QUIT both.
reap(hold_traffic(1.5, 'cq', @gw));
%before = map { $_ => stored($_, 'cq', [0, 0]) } grep { !/gcra/ } @HOLD;
ok(stop_nginx("gw$_"), "gw$_ quits gracefully") for 1, 2;
compare_held('shutdown', 'cq', \%before);

# =====================================================================
# 8. Everything at once, and the figures.
# =====================================================================
stamp('all phases');
%totals = ();
audit_phase(undef, 'all phases');
for my $z (@ZONES) {
    my $t = $totals{$z} or next;
    diag(sprintf '%-7s %-18s %6d admissions %6d units; closest hammered key: %s of %s',
        $z, $ZONE{$z}[1]{algorithm}, $t->{admissions}, $t->{units},
        $t->{worst} == int($t->{worst}) ? $t->{worst} : sprintf('%.3f', $t->{worst}), $t->{bound});
}
for my $i (0, 1) {
    my $log = $gw[$i]->error_log_text;
    $log =~ s/^.*worker process \Q$victim\E exited on signal 9.*\n//m if $i == 0 && $victim;
    check_no_alerts($log, "gw" . ($i + 1));
}
done_testing();

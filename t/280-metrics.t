# ratelimit_metrics: the Prometheus exposition (checked by promtool, from
# Debian's prometheus package) and JSON, summed over two workers from the shared
# zone; decisions per zone and status equal what the requests were answered,
# units equal the costs admitted; Redis figures; a reload keeps the counters; a
# zone too small counts and exports nothing and says so once; reloads that add
# or rename zones keep the counters by zone name and never fill the zone.
use lib 't/lib';
use RLTest;
use JSON::PP;

my ($promtool) = grep { -x } map { "$_/promtool" } split /:/, $ENV{PATH};

my $zones = <<'EOF';
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api  key=$arg_k limit=3 window=1m;
    ratelimit_zone plan key=$arg_k limit=$arg_l window=1m;
EOF
my $config = <<'EOF';
    add_header X-RL $ratelimit_status always;
    location /t   { ratelimit api; }
    location /u   { ratelimit api cost=2; ratelimit_dry_run on; }
    location /api { ratelimit plan; ratelimit_fail closed; }
    location /index.html { ratelimit plan; }
    location = /metrics { ratelimit_metrics; allow 127.0.0.1; deny all; }
    location = /hidden  { ratelimit_metrics; deny all; }
EOF

sub metrics_text {
    my $r = http_get('/metrics');
    is($r->{status}, 200, 'metrics answer 200');
    like(header($r, 'Content-Type') // '', qr{^text/plain; version=0\.0\.4},
        'exposition content type');
    return $r->{body};
}

# "name{labels}" => value
sub samples {
    my %s;
    for (split /\n/, $_[0]) {
        next if /^#/;
        my ($k, $v) = /^(\S+) (\S+)$/ or next;
        $s{$k} = $v;
    }
    return \%s;
}

sub promtool_ok {
    my ($text, $what) = @_;
  SKIP: {
        skip 'promtool not installed (Debian: prometheus)', 2 unless $promtool;
        my $file = servroot() . '/metrics.txt';
        open my $fh, '>', $file or die $!;
        print $fh $text;
        close $fh;
        my $out = `$promtool check metrics < $file 2>&1`;
        is($? >> 8, 0, "promtool check metrics: $what") or diag($out);
        is($out, '', "promtool has nothing to say: $what");
    }
}

start_nginx(workers => 2, http_config => "$zones    ratelimit_metrics_zone 64k;\n",
    config => $config);

my (%sent, %units);    # "zone status" => requests, from the responses themselves
sub send_req {
    my ($path, $zone, $cost) = @_;
    my $r = http_get($path);
    my $st = header($r, 'X-RL') // '-';
    $sent{"$zone $st"}++;
    $units{$zone} += $cost if $st eq 'PASSED';
    return $r;
}
send_req('/t?k=a', 'api', 1) for 1 .. 6;                 # 3 PASSED, then rejected (some cached)
send_req('/u?k=b', 'api', 2) for 1 .. 3;                 # dry run: 1 PASSED, 2 REJECTED_DRY_RUN
send_req('/index.html?k=c&l=2', 'plan', 1) for 1 .. 3;   # 2 PASSED, then rejected
send_req('/index.html?k=c&l=abc', 'plan', 1);            # a bad limit: FAILED_OPEN
send_req('/api?k=c&l=abc', 'plan', 1);                   # the same, fail closed: FAILED_CLOSED
is($sent{'api PASSED'}, 4, 'api: 3 + 1 admitted');
is($sent{'api REJECTED_DRY_RUN'}, 2, 'api: 2 dry-run rejections');
is(($sent{'api REJECTED'} // 0) + ($sent{'api REJECTED_CACHED'} // 0), 3, 'api: 3 rejected');
is($sent{'plan FAILED_OPEN'}, 1, 'plan: FAILED_OPEN');
is($sent{'plan FAILED_CLOSED'}, 1, 'plan: FAILED_CLOSED');

my $text = metrics_text();
promtool_ok($text, 'after traffic');
my $s = samples($text);
for my $zone ('api', 'plan') {
    for my $st (qw(PASSED REJECTED REJECTED_CACHED REJECTED_DRY_RUN PASSED_LOCAL REJECTED_LOCAL
                   FAILED_OPEN FAILED_CLOSED)) {
        is($s->{qq{ratelimit_decisions_total{zone="$zone",status="$st"}}}, $sent{"$zone $st"} // 0,
            "decisions $zone $st");
    }
    is($s->{qq{ratelimit_consumed_units_total{zone="$zone"}}}, $units{$zone}, "units $zone");
}
my $srv = qq{server="127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}"};
my $h = 'ratelimit_redis_call_duration_seconds';
my $calls = $s->{"${h}_count{$srv}"};
cmp_ok($calls, '>=', 1, "$calls script calls timed");
cmp_ok($calls, '<=', 12, 'at most one call per decision that reached Redis');
is($s->{qq{${h}_bucket{$srv,le="+Inf"}}}, $calls, '+Inf bucket is the count');
cmp_ok($s->{"${h}_sum{$srv}"}, '>', 0, 'the sum is in seconds, above 0');
cmp_ok($s->{"${h}_sum{$srv}"}, '<', $calls, 'and below a second per call');
is($s->{"ratelimit_redis_decisions_in_flight{$srv}"}, 0, 'nothing in flight');
cmp_ok($s->{"ratelimit_redis_connections{$srv}"}, '>=', 1, 'keepalive connections open');
is($s->{"ratelimit_redis_connections{$srv}"}, $s->{"ratelimit_redis_connects_total{$srv}"},
    'every connection opened is still open');
is($s->{qq{ratelimit_redis_errors_total{$srv,kind="timeout"}}}, 0, 'no timeouts');
cmp_ok($s->{ratelimit_deny_cache_entries}, '>=', 1, 'the deny cache remembers k=a');

# NOSCRIPT: one reload, counted as an error reply and a script load (each worker's first call
# already met an empty script cache).
my $noscript = qq{ratelimit_redis_error_replies_total{$srv,class="NOSCRIPT"}};
my $loads = $s->{"ratelimit_redis_script_loads_total{$srv}"};
cmp_ok($loads, '>=', 1, 'the first calls loaded the script');
is($s->{$noscript}, $loads, 'after as many NOSCRIPT');
redis_cmd('SCRIPT', 'FLUSH');
send_req('/t?k=z', 'api', 1);
$s = samples(metrics_text());
is($s->{$noscript}, $loads + 1, 'one NOSCRIPT more');
is($s->{"ratelimit_redis_script_loads_total{$srv}"}, $loads + 1, 'one SCRIPT LOAD more');
is($s->{qq{ratelimit_decisions_total{zone="api",status="PASSED"}}}, 5, 'and its decision');

# JSON: the same figures.
my $r = http_get('/metrics?format=json');
is($r->{status}, 200, 'json answers');
like(header($r, 'Content-Type') // '', qr{^application/json}, 'json content type');
my $j = eval { decode_json($r->{body}) };
ok($j, 'json parses') or diag($r->{body});
is($j->{zones}{api}{decisions}{PASSED}, 5, 'json: api PASSED');
is($j->{zones}{api}{consumed_units}, $units{api}, 'json: api units');
is($j->{zones}{plan}{decisions}{FAILED_CLOSED}, 1, 'json: plan FAILED_CLOSED');
my $redis = $j->{redis}{"127.0.0.1:$ENV{TEST_NGINX_REDIS_PORT}"};
is($redis->{script_loads}, $loads + 1, 'json: script loads');
is($redis->{call_duration_seconds}{count}, $redis->{call_duration_seconds}{buckets}{'+Inf'},
    'json: histogram count');

is(http_get('/hidden')->{status}, 403, 'allow/deny restrict the page like stub_status');

# A reload with the same zones keeps the counters.
reload_nginx();
$s = samples(metrics_text());
is($s->{qq{ratelimit_decisions_total{zone="api",status="PASSED"}}}, 5, 'reload keeps the counters');
stop_nginx();
check_no_alerts(error_log_text(), 'metrics');

# A zone too small for the counters of 1000 zones: limiting works, nothing is counted, one line.
my $many = join '', map { "    ratelimit_zone z$_ key=\$arg_k limit=1 window=1m;\n" } 1 .. 1000;
start_nginx(workers => 2, http_config => "$zones    ratelimit_metrics_zone 32k;\n$many",
    config => $config);
my $res = http_get('/t?k=full');
is($res->{status}, 200, 'a full zone: requests are decided as usual');
is(header($res, 'X-RL'), 'PASSED', 'by Redis');
$text = metrics_text();
promtool_ok($text, 'full zone');
my @samples = grep { !/^#/ } split /\n/, $text;
is_deeply(\@samples, [], 'no counters exported, rather than zeros') or diag($text);
like($text, qr/^# ratelimit_metrics_zone is full, metrics are not counted$/m, 'the page says why');
$r = http_get('/metrics?format=json');
is($r->{body}, qq({"error":"ratelimit_metrics_zone is full, metrics are not counted"}\n),
    'json: no counters either');
stop_nginx();
my $log = error_log_text();
my @full = $log =~ /\[warn\].*ratelimit: ratelimit_metrics_zone of \d+ bytes is full, metrics are not counted/g;
is(scalar @full, 1, 'said once');
check_no_alerts($log, 'full zone');

# Reloads that change the zones (issue 18): 30 zones in 32k, then 31, 32, ... 45, then 15
# reloads that rename 30 zones each time. The counters are kept by zone name: a kept zone
# counts on, a new one starts at 0, and the zone never fills (each reload used to take a new
# array of every counter: the 7th said "is full" and counted nothing).
my $passed = 0;
my $zone_lines = sub { join '', map { "    ratelimit_zone $_ key=\$arg_k limit=1000 window=1m;\n" } @_ };
my $conf_of = sub {
    ("$zones    ratelimit_metrics_zone 32k;\n" . $zone_lines->(@_),
     $config . "    location /z { ratelimit $_[-1]; }\n");
};
my ($http0, $config0) = $conf_of->(map { "z$_" } 1 .. 30);
start_nginx(workers => 2, http_config => $http0, config => $config0);
my @configs = ((map { my $n = $_; [map { "z$_" } 1 .. $n] } 31 .. 45),
               (map { my $g = $_; [map { "g${g}_$_" } 1 .. 30] } 1 .. 15));
for my $i (0 .. $#configs) {
    my $names = $configs[$i];
    my $what = "reload " . ($i + 1) . " (" . @$names . " zones, last $names->[-1])";
    is(header(http_get("/t?k=reload$i"), 'X-RL'), 'PASSED', "$what: api admits");
    $passed++;
    my ($h, $c) = $conf_of->(@$names);
    my @old = nginx()->worker_pids;
    reload_nginx(http_config => $h, config => $c);
    # The old workers take no request once gone: each request below meets the new zones.
    ok(wait_until(5, sub { !grep { kill 0, $_ } @old }), "$what: the old workers left");
    is(header(http_get("/z?k=$i"), 'X-RL'), 'PASSED', "$what: the last zone admits");
    my $page = http_get('/metrics')->{body};
    my $s = samples($page);
    is($s->{qq{ratelimit_decisions_total{zone="api",status="PASSED"}}}, $passed,
        "$what: api's counters are kept");
    is($s->{qq{ratelimit_decisions_total{zone="$names->[-1]",status="PASSED"}}}, 1,
        "$what: the last zone counted its request");
}
stop_nginx();
$log = error_log_text();
unlike($log, qr/is full/, 'the zone never filled');
check_no_alerts($log, 'reloads');

done_testing();

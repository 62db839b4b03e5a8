# The module allocates nothing on the heap per request on the lease and deny
# paths, up to 4 zones (issue 30): requests admitted from reservations, the
# renewal rounds between them (the reservation's decision, the invalidation
# its write causes, the EXISTS that renews the key's tracking, the check by
# rid), rejections answered from the deny cache, requests that hold a
# concurrency slot (taken, then released when they end), requests to a location
# with a zone on each of two backends (a part asked of each), requests that
# `ratelimit_fail local` decides while Redis is down (a rate zone, and a
# concurrency zone's slot counted by the worker), and requests whose cost is
# settled when they end (`settle=`: units given back, and units charged).  nginx runs under
# valgrind's dhat twice, a warm-up then a short and a long run of the same
# requests; the allocations made from the module's own code in the long
# life's extra requests, per request, must be 0 (a few are let through for a
# buffer still growing to its size).  Before this was built a renewal round
# made about 20, a request holding a slot 5, one decided locally 7, one on
# two backends 7, and one settled 3.  The dead backend's probes follow time, not requests: they
# are counted apart.
use lib 't/lib';
use RLTest;
use JSON::PP ();

plan(skip_all => 'valgrind is not installed') unless grep { -x "$_/valgrind" } split /:/, $ENV{PATH};
# Under t/valgrind.sh every nginx already runs under memcheck.
plan(skip_all => 'the memcheck pass runs nginx under valgrind already') if $ENV{TEST_NGINX_VALGRIND};

my ($WARM, $SHORT, $LONG) = (200, 100, 1100);
# Module allocations per request let through in the long life's extra requests.
my $MOST = 0.005;

# A reservation that ends unused is given back when its time is up, which follows the clock,
# not the requests: lease_time= is longer than a life under dhat on a slow host, so that only
# the renewals (20 units each) and the give-backs of the exit, the same in both lives, happen.
my $http = <<'EOF';
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone per_key  key=$arg_k limit=10000000 window=600s algorithm=sliding_counter lease=20 lease_time=120s;
    ratelimit_zone per_addr key=$binary_remote_addr limit=10000000 window=600s algorithm=sliding_counter lease=20 lease_time=120s;
    ratelimit_zone per_uri  key=$uri limit=10000000 window=600s algorithm=sliding_counter lease=20 lease_time=120s;
    ratelimit_zone per_host key=$host limit=10000000 window=600s algorithm=sliding_counter lease=20 lease_time=120s;
    ratelimit_zone denied   key=$arg_k limit=1 window=60s algorithm=sliding_counter;
    ratelimit_zone settled  key=$arg_k limit=100000000 window=600s algorithm=sliding_counter;
    ratelimit_zone conc     key=$arg_k limit=1000 algorithm=concurrency;
    # The same server under a second name: a location with zones on both asks each its part
    # (both zones exact, as a location gives every zone lease= or none).
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT name=other;
    ratelimit_zone this_key  key=$arg_k limit=10000000 window=600s algorithm=sliding_counter;
    ratelimit_zone other_key key=$arg_k limit=10000000 window=600s algorithm=sliding_counter redis=other;
    # Nobody listens there: every decision of these zones fails, and the breaker stays open.
    ratelimit_redis 127.0.0.1:$TEST_NGINX_DEAD_PORT name=down fail_threshold=1 fail_backoff=60s;
    ratelimit_zone down      key=$arg_k limit=10000000 window=60s algorithm=sliding_counter redis=down;
    ratelimit_zone down_conc key=$arg_k limit=1000 algorithm=concurrency redis=down;
EOF
my $config = <<'EOF';
    add_header X-RL $ratelimit_status always;
    location /l1 { ratelimit per_key; }
    location /l2 { ratelimit per_key; ratelimit per_addr; }
    location /l4 { ratelimit per_key; ratelimit per_addr; ratelimit per_uri; ratelimit per_host; }
    location /deny { ratelimit denied; }
    location /settle { ratelimit settled cost=10 settle=$arg_used; }
    location /conc { ratelimit conc; }
    location /several { ratelimit this_key; ratelimit other_key; }
    location /outage { ratelimit down; ratelimit_fail local; }
    location /outage_conc { ratelimit down_conc; ratelimit_fail local; }
EOF

# One round: a request to each location, each key in its own zone's life.
my @ROUND = ('/l1?k=a', '/l2?k=b', '/l4?k=c', '/deny?k=d', '/conc?k=e', '/outage?k=f',
    '/outage_conc?k=g', '/several?k=h', '/settle?k=i&used=3', '/settle?k=j&used=20');

# Requests on keep-alive connections, pipelined 40 at a time; returns the
# statuses ($ratelimit_status) seen.
sub rounds {
    my ($port, $n) = @_;
    my %seen;
    my @reqs = map { my $r = $_; map { "GET $_ HTTP/1.1" } @ROUND } 1 .. $n;
    while (my @batch = splice @reqs, 0, 40) {
        my @res = http_pipelined($port, \@batch, timeout => 60);
        $seen{ header($_, 'X-RL') // $_->{error} // 'none' }++ for @res;
    }
    return \%seen;
}

# An allocation is the module's when the first function in its stack, past the
# allocator, Rust's allocation library and nginx's pool functions, is the
# module's: its own heap allocations, and pool blocks its requests for room
# made nginx allocate; not what nginx does in a request the module resumed.
my $NGX_POOL = qr/^ngx_(?:alloc|calloc|memalign|palloc\w*|pnalloc|pcalloc|pmemalign|array_push\w*|list_push|create_temp_buf|pool_cleanup_add)$/;
sub charged_to {
    for my $f (@_) {
        my ($fn) = $f =~ /^(?:0x[0-9A-Fa-f]+: )?(\S+)/ or next;
        return $fn if $fn =~ /^<?ngx_http_ratelimit::/;
        return undef if $fn =~ /^ngx_/ && $fn !~ $NGX_POOL;
    }
    return undef;
}

# The dead backend's probes follow time, not requests: 25 ms after it failed, then twice as
# long each time. A slow host makes a life last longer and probe more often, so what a probe
# allocates (its connection and its PING) is counted apart, not charged to the requests.
my $PROBE = qr/\bngx_http_ratelimit::redis::node::on_probe_timer\b/;

sub module_allocs {
    my ($dir) = @_;
    my (%sites, $n, $probes);
    for my $file (glob "$dir/dhat.*.json") {
        open my $fh, '<', $file or die "$file: $!";
        my $d = JSON::PP->new->decode(do { local $/; <$fh> });
        for my $pp (@{ $d->{pps} }) {
            my @frames = map { $d->{ftbl}[$_] } @{ $pp->{fs} };
            my $who = charged_to(@frames) // next;
            if (grep { /$PROBE/ } @frames) {
                $probes += $pp->{tbk};
                next;
            }
            $n += $pp->{tbk};
            $sites{$who} += $pp->{tbk};
        }
    }
    return ($n // 0, \%sites, $probes // 0);
}

sub life {
    my ($name, $n) = @_;
    my $dir = servroot() . "/dhat-$name";
    mkdir $dir;
    unlink glob "$dir/dhat.*.json";
    redis_cmd('FLUSHALL');
    # One process, daemonised: its own requests and its exit are what dhat reports.
    my $gw = start_nginx(name => $name, http_config => $http, config => $config,
        main_config => 'master_process off;',
        prefix_cmd => ['valgrind', '--tool=dhat', '--num-callers=40', "--dhat-out-file=$dir/dhat.%p.json"]);
    # A cold worker under dhat: its first decisions may take a while.
    wait_until(60, sub { (header(http_get('/l1?k=warm', -port => $gw->port), 'X-RL') // '') =~ /^PASSED/ }, 0.5);
    my $warm = rounds($gw->port, $WARM);
    my $seen = rounds($gw->port, $n);
    ok(stop_nginx($name), "$name: nginx quits gracefully");
    my ($allocs, $sites, $probes) = module_allocs($dir);
    note("$name: $probes module allocations in the dead backend's probes, not counted");
    return ($allocs, $sites, $seen);
}

my ($short, $short_sites) = life('short', $SHORT);
my ($long, $long_sites, $seen) = life('long', $LONG);
# Where the long life's extra requests allocated.
my %more = map { my $d = $long_sites->{$_} - ($short_sites->{$_} // 0); $d > 0 ? ($_ => $d) : () } keys %$long_sites;
note("  $more{$_} more in $_") for sort { $more{$b} <=> $more{$a} } keys %more;
my $requests = ($LONG - $SHORT) * @ROUND;
note(sprintf 'module allocations: %d in the short life, %d in the long one: %.4f a request over %d requests',
    $short, $long, ($long - $short) / $requests, $requests);
note('statuses in the long life: ' . join ' ', map { "$_ x $seen->{$_}" } sort keys %$seen);
# Every leased request passed, most from a reservation; every deny-cache one rejected; every
# concurrency, two-backend and settled one passed (by Redis: PASSED).
is(($seen->{PASSED} // 0) + ($seen->{PASSED_LEASE} // 0), 7 * $LONG,
    'the leased, the concurrency, the two-backend and the settled locations admitted every request');
cmp_ok($seen->{PASSED_LEASE} // 0, '>=', 3 * $LONG * 0.8, 'most from reservations');
cmp_ok(($seen->{PASSED} // 0) - 4 * $LONG, '>=', 3 * $LONG / 20, 'the reservations renewed all along (20 units each)');
cmp_ok($seen->{REJECTED_CACHED} // 0, '>=', $LONG - 5, 'the deny location answered from the deny cache');
is($seen->{PASSED_LOCAL} // 0, 2 * $LONG, 'the outage locations decided every request locally');
ok(($long - $short) / $requests <= $MOST,
    "module heap allocations per request on the lease, deny, concurrency, two-backend, outage and settle paths: at most $MOST")
    or diag('the extra requests allocated where the notes above say');

check_no_alerts(error_log_text('long'), 'allocations');
done_testing();

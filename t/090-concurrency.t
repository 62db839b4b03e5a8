# Exactness under concurrency: 500 requests for one key fired at once,
# split across two nginx instances (two workers each) sharing one Redis,
# limit 100: exactly 100 admitted, every time, and exactly 100 members.
# The same traffic against the naive GET-then-INCR limiter over-admits,
# which is what makes the first result mean something.
use lib 't/lib';
use RLTest;
use IO::Select;
use Time::HiRes qw(time);

my $N     = $ENV{TEST_RL_CONCURRENCY} || 500;
my $LIMIT = 100;

my $http = <<"EOF";
    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT timeout=10s;
    ratelimit_zone api  key=\$arg_k limit=$LIMIT window=1m;
    ratelimit_zone apin key=\$arg_k limit=$LIMIT window=1m clock=nginx;
EOF
# fail closed: a Redis failure must not pass for an admission.
my $config = <<'EOF';
    ratelimit_fail closed;
    location /t { ratelimit api;  add_header X-RL $ratelimit_status always; }
    location /u { ratelimit apin; add_header X-RL $ratelimit_status always; }
EOF

my @gw = map { start_nginx(name => $_, workers => 2, http_config => $http, config => $config) }
    qw(a b);

sub fire {
    my ($path, $key) = @_;
    my @specs = map { { port => $gw[$_ % 2]->port, request => "GET $path?k=$key" } } 0 .. $N - 1;
    my $t0 = time;
    my $res = http_parallel(\@specs, timeout => 60);
    my %by;
    $by{ $_->{status} // "error: $_->{error}" }++ for @$res;
    my %rl;
    $rl{ header($_, 'X-RL') // '-' }++ for @$res;
    return (\%by, \%rl, time - $t0);
}

my @rounds = ((['/t', 'clock=redis']) x 3, (['/u', 'clock=nginx']) x 2);
my $round = 0;
for my $r (@rounds) {
    my ($path, $what) = @$r;
    $round++;
    my $key = "c$round";
    my ($by, $rl, $took) = fire($path, $key);
    my $tag = sprintf "round %d (%s, %.1fs)", $round, $what, $took;
    is($by->{200} // 0, $LIMIT, "$tag: exactly $LIMIT of $N admitted") or diag(explain $by);
    is($by->{429} // 0, $N - $LIMIT, "$tag: the other " . ($N - $LIMIT) . " rejected");
    is($rl->{PASSED} // 0, $LIMIT, "$tag: \$ratelimit_status PASSED x $LIMIT") or diag(explain $rl);
    my $zone = $path eq '/t' ? 'api' : 'apin';
    my $members = redis_cmd('ZRANGE', "rl:$zone:$key", 0, -1);
    is(scalar @$members, $LIMIT, "$tag: the sorted set holds exactly $LIMIT members");
    my %uniq = map { $_ => 1 } @$members;
    is(scalar keys %uniq, $LIMIT, "$tag: all members distinct");
    is(scalar(grep { /^[0-9]{16}$/ } @$members), $LIMIT, "$tag: members are integers");
}

my @pids = map { $_->worker_pids } @gw;
is(scalar @pids, 4, 'two gateways with two workers each');
for my $g (@gw) {
    ok($g->stop, 'gateway ' . $g->port . ' quits gracefully');
    check_no_alerts($g->error_log_text, 'gateway ' . $g->port);
}

# --- The naive limiter, same traffic shape: $N clients at once, each with its
# own connection, each doing GET, deciding, then INCR.
my $script = do {
    open my $fh, '<', RLTest::Nginx::repo_root() . '/t/naive_limiter.lua' or die $!;
    local $/; <$fh>;
};
my $sha = redis_cmd('SCRIPT', 'LOAD', $script);

sub naive {
    my ($key, $clients) = @_;
    my @c = map { redis_client(name => 'naive') } 1 .. $clients;
    my %of = map { fileno($c[$_]->sock) => $_ } 0 .. $#c;
    my @phase = ('get') x @c;
    my $admitted = 0;
    $_->send_cmd('EVALSHA', $sha, 1, $key, 'get', 60) for @c;
    my $sel = IO::Select->new(map { $_->sock } @c);
    my $deadline = time + 30;
    while ($sel->count && time < $deadline) {
        for my $s ($sel->can_read(1)) {
            my $i = $of{ fileno $s };
            my ($done, $reply) = $c[$i]->poll_reply or next;
            if ($phase[$i] eq 'get' && $reply < $LIMIT) {
                $phase[$i] = 'incr';
                $admitted++;
                $c[$i]->send_cmd('EVALSHA', $sha, 1, $key, 'incr', 60);
            } else {
                $sel->remove($s);
            }
        }
    }
    $_->close for @c;
    return $admitted;
}

sub naive_sequential {
    my ($key, $n) = @_;
    my $c = redis_client(name => 'naive');
    my $admitted = 0;
    for (1 .. $n) {
        next unless $c->cmd('EVALSHA', $sha, 1, $key, 'get', 60) < $LIMIT;
        $c->cmd('EVALSHA', $sha, 1, $key, 'incr', 60);
        $admitted++;
    }
    return $admitted;
}

is(naive_sequential('naive:seq', $N), $LIMIT,
    "naive limiter, one request at a time: $LIMIT of $N admitted (it is correct when serial)");
for my $i (1 .. 2) {
    my $admitted = naive("naive:par$i", $N);
    cmp_ok($admitted, '>', $LIMIT,
        "naive limiter, $N at once: over-admits ($admitted of $N admitted, limit $LIMIT)");
    cmp_ok(redis_cmd('GET', "naive:par$i"), '>', $LIMIT, 'and its counter ends above the limit');
}

done_testing();

# Exactness under concurrency for quotas and credits (as 090-concurrency for
# rates): 500 requests for one key at once over two gateways × two workers
# sharing one Redis.  A monthly quota of 100 admits exactly 100; a balance of
# 100 admits exactly 100 and ends at 0, never below; top-ups through Redis
# while the traffic runs are never lost: admitted + what is left = every
# credit ever given.
use lib 't/lib';
use RLTest;

my $N = $ENV{TEST_RL_CONCURRENCY} || 500;
my $LIMIT = 100;

my $http = <<"EOF";
    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT timeout=10s;
    ratelimit_zone monthly key=\$arg_k limit=$LIMIT period=month;
    ratelimit_zone credits key=\$arg_k limit=$LIMIT algorithm=balance status=402;
EOF
my $config = <<'EOF';
    ratelimit_fail closed;
    location /t { ratelimit monthly; }
    location /u { ratelimit credits; }
EOF
my @gw = map { start_nginx(name => $_, workers => 2, http_config => $http, config => $config) }
    qw(a b);

sub fire {
    my ($path) = @_;
    my @specs = map { { port => $gw[$_ % 2]->port, request => "GET $path" } } 0 .. $N - 1;
    my %by;
    $by{ $_->{status} // "error: $_->{error}" }++ for @{ http_parallel(\@specs, timeout => 60) };
    return \%by;
}

for my $round (1 .. 2) {
    my $by = fire("/t?k=q$round");
    is($by->{200} // 0, $LIMIT, "quota round $round: exactly $LIMIT of $N admitted") or diag(explain $by);
    is($by->{429} // 0, $N - $LIMIT, "quota round $round: the others rejected with 429");
}

for my $round (1 .. 2) {
    my $key = "b$round";
    redis_cmd('SET', "rl:credits:$key", $LIMIT);
    my $by = fire("/u?k=$key");
    is($by->{200} // 0, $LIMIT, "balance round $round: exactly $LIMIT of $N admitted") or diag(explain $by);
    is($by->{402} // 0, $N - $LIMIT, "balance round $round: the others rejected with 402");
    is(redis_cmd('GET', "rl:credits:$key"), '0', "balance round $round: the balance is 0, not below");
}

# Top-ups of 10 credits, five times 20 ms apart, from another process while
# the requests run.
for my $round (1 .. 3) {
    my $key = "t$round";
    redis_cmd('SET', "rl:credits:$key", $LIMIT);
    my $port = redis()->port;
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        # exec: the child must not run the harness's END blocks.
        exec 'sh', '-c', "for i in 1 2 3 4 5; do sleep 0.02; "
            . "redis-cli -p $port INCRBY rl:credits:$key 10 >/dev/null; done";
        die "exec: $!";
    }
    my $by = fire("/u?k=$key");
    waitpid $pid, 0;
    my $left = redis_cmd('GET', "rl:credits:$key");
    cmp_ok($left, '>=', 0, "top-up round $round: the balance never went below 0 ($left left)");
    is(($by->{200} // 0) + $left, $LIMIT + 50,
        "top-up round $round: admitted + left = every credit given (" . ($by->{200} // 0) . " admitted)")
        or diag(explain $by);
    is(($by->{200} // 0) + ($by->{402} // 0), $N, "top-up round $round: every request answered 200 or 402");
}

for my $g (@gw) {
    ok($g->stop, 'gateway ' . $g->port . ' quits gracefully');
    check_no_alerts($g->error_log_text, 'gateway ' . $g->port);
}

done_testing();

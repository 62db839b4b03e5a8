# A denied request is never recorded: a client hammering past its limit is
# admitted again as soon as its oldest admitted request leaves the window.
# Members are integers (the request's clock in microseconds), unique per
# admitted request.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(time sleep);

for my $clock (qw(nginx redis)) {
    start_nginx(http_config => <<"EOF", config => <<'EOF');
    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=\$arg_k limit=2 window=2s clock=$clock;
EOF
    location /t {
        ratelimit api;
        add_header X-RL $ratelimit_status always;
    }
EOF
    my $key = "h$clock";
    my $t0 = time;
    for (1 .. 2) {
        my $r = http_get("/t?k=$key");
        is($r->{status}, 200, "clock=$clock: request $_ admitted");
    }
    my $t1 = time;    # the newest admitted entry is no later than this

    # Hammer until a request gets in (bounded: 6 s at most).
    my ($denied, $admitted_at, $max_card, $first_retry) = (0);
    while (time < $t0 + 6) {
        my $r = http_get("/t?k=$key");
        if ($r->{status} == 429) {
            $denied++;
            $first_retry //= header($r, 'Retry-After');
        } elsif ($r->{status} == 200) {
            $admitted_at = time;
            last;
        } else {
            fail("clock=$clock: unexpected status $r->{status}");
            last;
        }
        my $card = redis_cmd('ZCARD', "rl:api:$key");
        $max_card = $card if !defined $max_card || $card > $max_card;
        sleep 0.05;
    }
    cmp_ok($denied, '>=', 10, "clock=$clock: hammering was denied ($denied times)");
    is($max_card, 2, "clock=$clock: the sorted set never grew past the limit");
    like($first_retry // '', qr/^[12]$/, "clock=$clock: Retry-After is 1 or 2 s for window=2s");
    ok(defined $admitted_at, "clock=$clock: admitted again while still hammering");
    if ($admitted_at) {
        # The oldest entry is scored at or after $t0; it leaves at t0+2s.
        cmp_ok($admitted_at - $t0, '>=', 1.95, "clock=$clock: not before the oldest left the window");
        cmp_ok($admitted_at - $t1, '<', 3.0, "clock=$clock: soon after it left");
    }

    # Only admitted requests are members: 2 at most in the window, each an
    # integer, all distinct.
    my $members = redis_cmd('ZRANGE', "rl:api:$key", 0, -1);
    ok(@$members >= 1 && @$members <= 2, "clock=$clock: 1 or 2 members left in the window")
        or diag(explain $members);
    like($_, qr/^[0-9]{16}$/, "clock=$clock: member $_ is an integer") for @$members;
    is(scalar(keys %{{ map { $_ => 1 } @$members }}), scalar @$members,
        "clock=$clock: members are distinct");
    my $score = redis_cmd('ZSCORE', "rl:api:$key", $members->[-1]) // 0;
    cmp_ok(abs($score - time * 1000), '<', 10_000,
        "clock=$clock: scores are Unix-epoch milliseconds ($score)");

    ok(stop_nginx(), "clock=$clock: nginx quits gracefully");
    check_no_alerts(error_log_text(), "clock=$clock");
}

done_testing();

# Three gateway hosts (network namespaces made by this file, see
# RLTest::Netns) of two workers each share one Redis on a host of its own.
# Exact under a burst spread over all three; then one gateway is cut off
# from Redis by its firewall: it follows its ratelimit_fail within timeout,
# while the other two stay exact; restored, it decides through Redis again.
use lib 't/lib';
use RLTest;
use RLTest::Netns;
use Time::HiRes qw(time sleep);

my ($ok, $why) = RLTest::Netns->available;
plan skip_all => "network namespaces: $why" unless $ok;

my $N = $ENV{TEST_RL_CONCURRENCY} || 500;
my $LIMIT = 100;
my $net = RLTest::Netns->new(gateways => 3, dir => servroot() . '/netns')->setup;
my $redis = $net->start_redis(port => 6380);
my $addr = $net->redis_addr;
for my $g (1 .. 3) {
    start_nginx(name => "gw$g", $net->nginx_options($g), workers => 2,
        http_config => "    ratelimit_redis $addr:6380 timeout=300ms fail_backoff=200ms;\n"
            . "    ratelimit_zone api key=\$arg_k limit=$LIMIT window=1h;\n",
        config => '        location /t { ratelimit api; ratelimit_fail closed; '
            . 'ratelimit_deny_cache off; add_header X-RL $ratelimit_status always; }');
}

# $N requests at once for key $k over the given gateways.
sub burst {
    my ($k, @gws) = @_;
    my @specs = map {
        { port => nginx('gw' . $gws[$_ % @gws])->addr, request => "GET /t?k=$k" }
    } 0 .. $N - 1;
    my %by;
    $by{ ($_->{status} // 'error') . ' ' . (header($_, 'X-RL') // '-') }++
        for @{ http_parallel(\@specs, timeout => 60) };
    return \%by;
}

for my $round (1 .. 2) {
    my $by = burst("all$round", 1, 2, 3);
    SKIP: {
        # Three gateways' bursts at once take valgrind longer than the decisions' timeout.
        skip 'under valgrind the decisions time out', 2 if $ENV{TEST_NGINX_VALGRIND};
        is($by->{'200 PASSED'} // 0, $LIMIT, "round $round, three hosts: exactly $LIMIT of $N admitted")
            or diag(explain $by);
        is($by->{'429 REJECTED'} // 0, $N - $LIMIT, '... the rest rejected by Redis');
    }
}

# Gateway 1 loses Redis (packets dropped: connects hang, replies never come).
$net->cut(1, 6380);
my $t0 = time;
my $res = http_get('/t?k=cut', -port => nginx('gw1')->addr);
my $waited = time - $t0;
is("$res->{status} " . header($res, 'X-RL'), '503 FAILED_CLOSED', 'the cut gateway follows its ratelimit_fail');
cmp_ok($waited, '<', 1.5 * $RLTest::Nginx::SLOW, sprintf '... within its timeout (%.2f s)', $waited);
my $by = burst('cut', 2, 3);
is($by->{'200 PASSED'} // 0, $LIMIT, 'the other two gateways stay exact meanwhile') or diag(explain $by);
$by = burst('cut2', 1);
is(join(',', keys %$by), '503 FAILED_CLOSED', "every decision of the cut gateway follows ratelimit_fail");

$net->restore(1);
my $back;
for (1 .. 100) {
    my $r = http_get('/t?k=back', -port => nginx('gw1')->addr);
    if (($r->{status} // 0) == 200) { $back = 1; last }
    sleep 0.05;
}
ok($back, 'restored, the gateway decides through Redis again');
$by = burst('after', 1, 2, 3);
is($by->{'200 PASSED'} // 0, $LIMIT, 'three hosts exact again') or diag(explain $by);

for my $g (1 .. 3) {
    ok(stop_nginx("gw$g"), "gw$g quits gracefully");
    check_no_alerts(error_log_text("gw$g"), "gw$g");
}
$net->teardown;
done_testing;

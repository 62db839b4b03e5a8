# The tracker (Redis client tracking, which keeps the deny cache and the
# reservations honest) starts again at most once a second after it lost its
# connections, and only when a rejection or a grant asks for it. One asked for
# within that second starts when the second is over, by itself: before, it
# waited for the next ask after it, and a worker whose keys had gone quiet
# remembered nothing for longer than 100 ms until then.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(sleep time);

sub rl { header($_[0], 'X-RL') // '(none)' }

start_nginx(http_config => <<'EOF', config => <<'EOF');
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone one key=$arg_k limit=1 window=1h;
EOF
    add_header X-RL $ratelimit_status always;
    location /t { ratelimit one; }
EOF
nginx()->write_html({ t => "ok\n" });

# A key's second request is rejected; remembering that rejection asks for tracking.
sub rejected {
    my ($k) = @_;
    my @st = map { rl(http_get("/t?k=$k")) } 1 .. 2;
    is("@st", 'PASSED REJECTED', "$k: rejected by Redis");
}
sub killed {
    redis_cmd('CLIENT', 'KILL', 'TYPE', 'pubsub');
    ok(wait_until(5, sub { !redis()->tracking_clients }, 0.02), "$_[0]: the tracker's connections killed");
}

rejected('a');
ok(wait_until(5, sub { redis()->tracking_clients }, 0.02), 'the first rejection starts the tracker');
is(rl(http_get('/t?k=a')), 'REJECTED_CACHED', 'tracked: the rejection is remembered');

killed('over a second after its start');
sleep 1.1;
my $asked = time;
rejected('b');
ok(wait_until(5, sub { redis()->tracking_clients }, 0.02), 'a rejection starts it again at once');

killed('within a second of its start');
rejected('c');
SKIP: {
    # Slow requests (valgrind) may ask after the second is over: then it starts at once.
    my $since = time - $asked;
    skip(sprintf('asked %.2f s after the last start could be: not within its second', $since), 1)
        if $since > 0.9;
    is(redis()->tracking_clients, 0, 'the start that rejection asks for is put off');
}
ok(wait_until(3, sub { redis()->tracking_clients }, 0.05),
    'and comes when the second is over, with no request after it');
sleep 0.2;
is(join(' ', map { rl(http_get('/t?k=d')) } 1 .. 3), 'PASSED REJECTED REJECTED_CACHED',
    'tracked again: a rejection is remembered');

ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'tracker restart');
done_testing();

# A reset revokes reservations (issue 20): a worker holding units of a key
# (lease_time=10s, so they would last) stops admitting from them within a round
# trip of a ratelimit_admin DELETE or a redis-cli DEL: its next request after the
# reset is decided by Redis again, not from the reservation (Redis client tracking
# says the key changed; until EXISTS says it is still there, nothing is spent).
use lib 't/lib';
use RLTest;
use Time::HiRes qw(sleep);

sub rl { header($_[0], 'X-RL') // '(none)' }

start_nginx(http_config => <<'EOF', config => <<'EOF');
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1000 window=1m lease=auto lease_time=10s;
EOF
    add_header X-RL $ratelimit_status always;
    location /t { ratelimit api; }
    location = /admin { ratelimit_admin api; }
EOF

# Requests until the worker admits from a reservation.
sub reserve {
    my ($k) = @_;
    for (1 .. 50) {
        return 1 if rl(http_get("/t?k=$k")) eq 'PASSED_LEASE';
    }
    return 0;
}

for my $how (['admin DELETE', sub { http_request(port => server_port(), request => "DELETE /admin?key=$_[0]") }],
             ['redis-cli DEL', sub { redis_cmd('DEL', "rl:api:$_[0]") }]) {
    my ($what, $reset) = @$how;
    my $k = $what =~ s/\W+/-/gr;
    ok(reserve($k), "$what: the worker admits from a reservation");
    is(rl(http_get("/t?k=$k")), 'PASSED_LEASE', "$what: and goes on doing so");
    $reset->($k);
    sleep 0.1;
    is(rl(http_get("/t?k=$k")), 'PASSED', "$what: after the reset Redis decides again");
}

ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'lease reset');
done_testing();

# Redis over a unix socket: `ratelimit_redis unix:/path`.
use lib 't/lib';
use RLTest;

start_nginx(http_config => <<'EOF', config => <<'EOF');
    ratelimit_redis unix:$TEST_NGINX_REDIS_SOCKET;
    ratelimit_zone api key=$arg_k limit=2 window=10s clock=nginx;
EOF
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
EOF

my @r = map { http_get('/t?k=a') } 1 .. 3;
is(join(' ', map { $_->{status} } @r), '200 200 429', 'limit 2 over a unix socket');
is(join(' ', map { header($_, 'X-RL') // '-' } @r), 'PASSED PASSED REJECTED', '$ratelimit_status');
is(redis_cmd('ZCARD', 'rl:api:a'), 2, 'two recorded');

my @clients = redis()->foreign_clients;
my $sock = redis()->socket_path;
ok(scalar(@clients), 'nginx holds a Redis connection');
ok(!grep({ $_->{addr} !~ /^\Q$sock\E/ } @clients), 'every nginx connection is on the unix socket')
    or diag(explain \@clients);

ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'unix');
done_testing();

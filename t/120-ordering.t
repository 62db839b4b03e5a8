# Replies are matched to decisions in order: many decisions pipelined on
# one connection, each key with a different known state, errors mixed in;
# and client-side keep-alive and HTTP pipelining, where one connection
# carries several requests that are each decided once.
use lib 't/lib';
use RLTest;

sub rl { header($_[0], 'X-RL') // ($_[0]{error} ? "error: $_[0]{error}" : '(none)') }

start_nginx(workers => 1, http_config => <<'EOF', config => <<'EOF');
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT pool_size=1 timeout=5s;
    ratelimit_zone api key=$arg_k limit=1000 window=1m clock=nginx;
    ratelimit_zone two key=$arg_k limit=2 window=1m clock=nginx;
EOF
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
    location /u { ratelimit two; add_header X-RL $ratelimit_status always; }
EOF

# Key k<i> already holds i entries, so its decision must say remaining =
# 999 - i; key e<i> holds a string, so its decision must fail (WRONGTYPE).
my ($now) = redis_cmd('TIME')->[0] * 1000;
my $N = 100;
for my $i (0 .. $N - 1) {
    redis_cmd('ZADD', "rl:api:k$i", map { ($now - 1000, "pre$_") } 1 .. $i) if $i;
    redis_cmd('SET', "rl:api:e$i", 'x') if $i % 3 == 0;
}
my @specs = map {
    { port => server_port(), request => $_ % 3 == 0 ? "GET /t?k=e$_" : "GET /t?k=k$_" }
} 0 .. $N - 1;
my $res = http_parallel(\@specs);
my (@wrong, @failed);
for my $i (0 .. $N - 1) {
    my $r = $res->[$i];
    if ($i % 3 == 0) {
        push @failed, $i unless rl($r) eq 'FAILED_OPEN';
    } else {
        my $rem = header($r, 'RateLimit-Remaining') // 'none';
        push @wrong, "k$i: remaining $rem, want " . (999 - $i) unless $rem eq 999 - $i;
    }
}
is(scalar @wrong, 0, "$N pipelined decisions: each reply reached its own request")
    or diag(join "\n", @wrong[0 .. ($#wrong < 9 ? $#wrong : 9)]);
is(scalar @failed, 0, 'error replies in the middle of the pipeline fail only their own request')
    or diag("wrong: @failed");
is(redis()->foreign_clients, 1, 'all of it on one connection');

# Keep-alive: several requests, one client connection, each decided.
my $r = http_request(port => server_port(), request => 'GET /u?k=ka', keepalive => 1);
my @st = ($r->{status});
for (1 .. 2) {
    $r = http_request(sock => $r->{sock}, request => 'GET /u?k=ka', keepalive => $_ < 2);
    push @st, $r->{status} // $r->{error};
}
is("@st", '200 200 429', 'keep-alive connection: each request decided once');

# HTTP pipelining: all three written at once; nginx handles them in turn,
# each waiting for its own decision.
my @p = http_pipelined(server_port(), [map { 'GET /u?k=pl' } 1 .. 3]);
is(join(' ', map { $_->{status} // $_->{error} } @p), '200 200 429', 'pipelined HTTP requests');
is(join(' ', map { header($_, 'RateLimit-Remaining') // '-' } @p), '1 0 0', 'in order');
is(redis_cmd('ZCARD', 'rl:two:pl'), 2, 'two recorded');

ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'ordering');
done_testing();

# HTTP/2 clients that reset or drop their stream while the decision is
# pending: the stream ends with 499, no alert, no crash, and later requests
# are served. curl is the HTTP/2 client (the harness's own speaks HTTP/1.1).
# Redis is SIGSTOPped so that the decisions are certainly pending.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(sleep);

my ($curl) = grep { -x } map { "$_/curl" } split /:/, $ENV{PATH};
if (!$curl || `$curl --version` !~ /HTTP2/) {
    Test::More::plan(skip_all => 'curl with HTTP/2 support is not installed');
}

my $redis = redis();
my $h2 = free_port();
start_nginx(workers => 1, http_config => <<"EOF", config => <<'EOF');
    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT timeout=2s;
    ratelimit_zone api key=\$arg_k limit=1000 window=10s clock=nginx;
    log_format rl '\$status \$ratelimit_status \$server_protocol \$request_uri';
    server {
        listen 127.0.0.1:$h2 http2;
        access_log logs/access.log rl;
        root \$TEST_NGINX_HTML_DIR;
        location /t { ratelimit api; add_header X-RL \$ratelimit_status always; }
    }
EOF
    location /u { }
EOF

sub h2 {
    my ($query, $max_time) = @_;
    return scalar `$curl -s --http2-prior-knowledge -m $max_time -o /dev/null -w '%{http_code} %{http_version} %header{x-rl}' 'http://127.0.0.1:$h2/t?$query'`;
}

is(h2('k=w', 5), '200 2 PASSED', 'HTTP/2 warm-up decision');
my ($worker) = nginx()->worker_pids;

kill 'STOP', $redis->pid;
# Each curl gives up after 0.3 s and drops its stream with its connection.
my @pids;
for my $i (1 .. 5) {
    my $pid = fork // die "fork: $!";
    if (!$pid) { h2("k=a$i", 0.3); exit 0 }
    push @pids, $pid;
}
waitpid $_, 0 for @pids;
sleep 0.2;
kill 'CONT', $redis->pid;
sleep 0.3;

is(h2('k=x', 5), '200 2 PASSED', 'the worker decides HTTP/2 requests after the aborts');
my ($after) = nginx()->worker_pids;
is($after, $worker, 'the worker never crashed (same pid)');

ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'h2 abort');
my @aborted = grep { m{^499 PENDING HTTP/2\.0 /t\?k=a\d$} } split /\n/, access_log_text();
is(scalar @aborted, 5, 'the five abandoned streams are logged as 499');
done_testing();

# The harness itself, exercised with plain nginx features only, so that a
# broken harness is told apart from a broken module.
use lib 't/lib';
use RLTest;

# The plain-Perl helpers, before the blocks.  nginx()->port, not server_port():
# under RLTEST_HARNESS=test-nginx, server_port() is Test::Nginx's server, the
# one the blocks below use.
start_nginx(workers => 2, config => '        location /t { add_header X-Port $server_port; }');
my $port = nginx()->port;
my $r = http_request(port => $port, request => 'GET /t', keepalive => 1);
my $r2 = http_request(sock => $r->{sock}, request => 'GET /t');
is("$r->{status} $r2->{status}", '200 200', 'keep-alive: two requests on one connection');
my @p = http_pipelined($port, ['GET /t', 'GET /missing', 'HEAD /t']);
is(join(' ', map { $_->{status} } @p), '200 404 200', 'HTTP pipelining, answers in order');
my $res = http_parallel([map { { port => $port, request => 'GET /t' } } 1 .. 300]);
is(scalar(grep { $_->{status} == 200 } @$res), 300, '300 parallel requests');
my @old = nginx()->worker_pids;
is(scalar @old, 2, 'two workers');
my @new = reload_nginx();
ok(@new == 2 && !grep({ my $n = $_; grep { $_ == $n } @old } @new), 'reload: new workers');
ok(stop_nginx(), 'graceful stop');
my ($rc, $out, $n) = nginx_t(config => '        location /x { no_such_directive; }');
isnt($rc, 0, 'nginx -t fails on a bad config');
my $line = $n->line_of('no_such_directive');
like($out, qr/unknown directive "no_such_directive" in \S+nginx\.conf:$line\b/, 'file:line');

run_tests();

__DATA__




=== TEST 1: static file, headers, body
--- config
    location /t { add_header X-Test yes; }
--- request
GET /t
--- error_code: 200
--- response_headers
X-Test: yes
!X-Absent
--- response_body
ok
--- no_error_log
[error]



=== TEST 2: several requests, per-request expectations
--- config
    location /t { add_header X-Arg $arg_a; }
    location /missing { }
--- request eval
["GET /t?a=1", "GET /t?a=2", "GET /missing"]
--- error_code eval
[200, 200, 404]
--- response_headers eval
["X-Arg: 1", "X-Arg: 2", "!X-Arg"]
--- response_body_like eval
["^ok\$", "^ok\$", "404 Not Found"]
--- rl_error_log eval
[qr/open\(\) ".*missing" failed/]



=== TEST 3: error_log is checked against what each request logged
--- config
    location /missing { }
--- request eval
["GET /missing/a", "GET /missing/b"]
--- error_code eval
[404, 404]
--- error_log eval
qr/open\(\) ".*missing\/[ab]" failed/
--- no_error_log
[alert]



=== TEST 4: more_headers, variables, user_files
--- config
    location /echo { add_header X-Echo "$http_x_foo:$server_port" always; return 204; }
    location /f { }
--- user_files
>>> f/hello.txt
hello $TEST_NGINX_SERVER_PORT
--- request eval
["GET /echo", "GET /f/hello.txt"]
--- more_headers
X-Foo: bar
--- error_code eval
[204, 200]
--- response_headers eval
["X-Echo: bar:$ENV{TEST_NGINX_SERVER_PORT}", undef]
--- response_body eval
["", "hello $ENV{TEST_NGINX_SERVER_PORT}\n"]



=== TEST 5: redis setup and checks
--- rl_redis_setup
SET foo bar
RPUSH "list with space" a b
--- config
    location /t { }
--- request
GET /t
--- rl_redis_check
GET foo => bar
LRANGE "list with space" 0 -1 => a b
EXISTS nope => 0
GET nope => (nil)
INCR foo =~ ^ERR:.*not an integer
--- error_code: 200



=== TEST 6: redis is flushed between blocks
--- config
    location /t { }
--- request
GET /t
--- rl_redis_check
DBSIZE => 0



=== TEST 7: nginx -t failures
--- http_config
    limit_req_zone $binary_remote_addr zone=one:10m rate=abc;
--- config
--- must_die
--- error_log eval
[qr/invalid rate "rate=abc" in .*nginx\.conf:\d+/, "[emerg]"]



=== TEST 8: access log and log_level
--- http_config
    log_format t '$status $arg_x';
--- config
    access_log logs/access.log t;
    location /t { }
--- log_level: notice
--- request
GET /t?x=abc
--- access_log
200 abc
--- no_error_log
[info]



=== TEST 9: two workers and a POST body
--- rl_workers: 2
--- config
    location /t { }
--- request
POST /t
hello
--- error_code: 405



=== TEST 10: init code runs after nginx is up
--- config
    location /t { }
--- init
main::redis_cmd('SET', 'from-init', main::server_port());
--- request
GET /t
--- rl_redis_check
GET from-init => $TEST_NGINX_SERVER_PORT



=== TEST 11: main_config, and a request that is given up on
--- skip_eval: 1: $ENV{TEST_NGINX_VALGRIND} # valgrind refuses setrlimit(RLIMIT_NOFILE) above its own descriptor limit: nginx logs an [alert]
--- main_config
worker_rlimit_nofile 4096;
--- config
    location /slow { limit_rate 1; alias $TEST_NGINX_HTML_DIR/big; }
--- user_files
>>> big
0123456789012345678901234567890123456789
--- request
GET /slow
--- timeout: 0.3
--- abort
--- ignore_response

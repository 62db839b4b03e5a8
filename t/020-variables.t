# $ratelimit_* variables in add_header, log_format and after internal
# redirects, where the decision must be remembered rather than re-made.
use lib 't/lib';
use RLTest;

run_tests();

__DATA__




=== TEST 1: variables in add_header
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s clock=nginx;
--- config
    location /t {
        ratelimit api;
        add_header X-RL "$ratelimit_status $ratelimit_limit $ratelimit_remaining $ratelimit_reset" always;
    }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 429]
--- response_headers_like eval
["X-RL: ^PASSED 2 1 (9|10)\$", "X-RL: ^PASSED 2 0 (9|10)\$", "X-RL: ^REJECTED 2 0 (9|10)\$"]



=== TEST 2: variables in the access log
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
    log_format rl '$arg_k $status $ratelimit_status $ratelimit_limit $ratelimit_remaining $ratelimit_reset';
--- config
    access_log logs/access.log rl;
    location /t { ratelimit api; }
    location /u { }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t", "GET /u?k=u"]
--- error_code eval
[200, 429, 200, 200]
--- rl_access_log eval
[qr/^a 200 PASSED 1 0 (9|10)$/m, qr/^a 429 REJECTED 1 0 (9|10)$/m, qr/^- 200 SKIPPED /m,
 qr/^u 200 -? ?/m]



=== TEST 3: error_page 429 to a named location keeps the decision
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s clock=nginx;
--- config
    ratelimit api;
    error_page 429 @limited;
    location /t { }
    location @limited {
        add_header X-RL "$ratelimit_status $ratelimit_limit $ratelimit_remaining" always;
    }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 429, 429]
--- response_headers_like eval
["!X-RL",
 "!X-RL",
 "X-RL: REJECTED 2 0\nRetry-After: (9|10)",
 "X-RL: REJECTED_CACHED 2 0\nRetry-After: (9|10)"]
--- response_body eval
["ok\n", "ok\n", "ok\n", "ok\n"]
--- rl_redis_check
ZCARD rl:api:a => 2



=== TEST 4: try_files to a named location after a pass
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s clock=nginx;
--- config
    ratelimit api;
    location /t { try_files /nonexistent @fallback; }
    location @fallback {
        add_header X-RL "$ratelimit_status $ratelimit_remaining" always;
    }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 429]
--- response_headers eval
["X-RL: PASSED 1\nRateLimit-Remaining: 1", "X-RL: PASSED 0\nRateLimit-Remaining: 0", "!X-RL"]
--- rl_redis_check
ZCARD rl:api:a => 2



=== TEST 5: error_page 404 to a URI: the redirected request is not counted again
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=3 window=10s clock=nginx;
--- config
    ratelimit api;
    location /missing { error_page 404 = /t; }
    location /t { add_header X-RL "$ratelimit_status $ratelimit_remaining" always; }
--- request eval
["GET /missing?k=a", "GET /missing?k=a"]
--- error_code eval
[200, 200]
--- response_headers eval
["X-RL: PASSED 2", "X-RL: PASSED 1"]
--- rl_redis_check
ZCARD rl:api:a => 2



=== TEST 6: rejected with fail headers off still exposes variables
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t {
        ratelimit api;
        ratelimit_headers off;
        add_header X-RL "$ratelimit_status $ratelimit_limit $ratelimit_remaining" always;
    }
--- request eval
["GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 429]
--- response_headers eval
["X-RL: PASSED 1 0\n!RateLimit-Limit", "X-RL: REJECTED 1 0\n!RateLimit-Limit"]



=== TEST 7: variables of a location without ratelimit are empty
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /u { add_header X-RL "[$ratelimit_status]" always; }
--- request
GET /u?k=a
--- error_code: 200
--- response_headers
X-RL: []
--- rl_redis_check
DBSIZE => 0



=== TEST 8: the access log sees the decision after error_page to an internal location without ratelimit
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
    log_format rl '$request_uri $status rl=[$ratelimit_status] zone=[$ratelimit_zone] rem=[$ratelimit_remaining]';
--- config
    access_log logs/access.log rl;
    location /t { ratelimit api; error_page 429 /limited.html; }
    location = /limited.html { internal; }
--- user_files
>>> limited.html
slow down
--- request eval
["GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 429]
--- response_body eval
["ok\n", "slow down\n"]
--- rl_access_log eval
[qr/^\/t\?k=a 200 rl=\[PASSED\] zone=\[api\] rem=\[0\]$/m, qr/^\/t\?k=a 429 rl=\[REJECTED\] zone=\[api\] rem=\[0\]$/m]



=== TEST 9: the access log sees the decision after error_page to a named location with ratelimit off
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
    log_format rl '$arg_k $status rl=[$ratelimit_status] zone=[$ratelimit_zone] rem=[$ratelimit_remaining]';
--- config
    access_log logs/access.log rl;
    ratelimit api;
    error_page 429 @lim;
    location /t { }
    location @lim { ratelimit off; return 429 "limited\n"; }
--- request eval
["GET /t?k=b", "GET /t?k=b"]
--- error_code eval
[200, 429]
--- rl_access_log eval
[qr/^b 200 rl=\[PASSED\] zone=\[api\] rem=\[0\]$/m, qr/^b 429 rl=\[REJECTED\] zone=\[api\] rem=\[0\]$/m]

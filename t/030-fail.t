# Redis down or answering errors: ratelimit_fail decides, and the error log
# says why.  (Slow and stopped Redis: 031-slow.t.)
use lib 't/lib';
use RLTest;

run_tests();

__DATA__




=== TEST 1: Redis down, fail open
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_DEAD_PORT timeout=500ms;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 200]
--- response_headers eval
["X-RL: FAILED_OPEN\n!Retry-After", "X-RL: FAILED_OPEN", "X-RL: FAILED_OPEN"]
--- rl_error_log eval
qr/\[error\] .*ratelimit: .*(refused|connect)/i



=== TEST 2: Redis down, fail closed
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_DEAD_PORT timeout=500ms;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; ratelimit_fail closed; add_header X-RL $ratelimit_status always; }
--- request eval
["GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[503, 503]
--- response_headers eval
["X-RL: FAILED_CLOSED\n",
 "X-RL: FAILED_CLOSED\n"]
--- rl_error_log eval
qr/\[error\] .*ratelimit: .*(refused|connect)/i



=== TEST 3: fail closed answers 503 even with another ratelimit_status
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_DEAD_PORT timeout=500ms;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; ratelimit_fail closed; ratelimit_status 429; }
--- request
GET /t?k=a
--- error_code: 503



=== TEST 4: an empty key is skipped even while Redis is down
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_DEAD_PORT timeout=500ms;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; ratelimit_fail closed; add_header X-RL $ratelimit_status always; }
--- request
GET /t
--- error_code: 200
--- response_headers
X-RL: SKIPPED



=== TEST 5: Redis answers an error (WRONGTYPE), fail open
--- rl_redis_setup
SET rl:api:a not-a-sorted-set
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=b", "GET /t?k=b"]
--- error_code eval
[200, 200, 200, 429]
--- response_headers eval
["X-RL: FAILED_OPEN", "X-RL: FAILED_OPEN", "X-RL: PASSED", "X-RL: REJECTED"]
--- rl_redis_check
GET rl:api:a => not-a-sorted-set
ZCARD rl:api:b => 1
--- rl_error_log eval
qr/\[error\] .*ratelimit: redis replied WRONGTYPE: one of the keys "rl:api:a" holds other data, request passed by ratelimit_fail/



=== TEST 6: Redis answers an error, fail closed
--- rl_redis_setup
SET rl:api:a not-a-sorted-set
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; ratelimit_fail closed; add_header X-RL $ratelimit_status always; }
--- request eval
["GET /t?k=a", "GET /t?k=b"]
--- error_code eval
[503, 200]
--- response_headers eval
["X-RL: FAILED_CLOSED", "X-RL: PASSED"]
--- rl_error_log eval
qr/\[error\] .*ratelimit: .*WRONGTYPE/



=== TEST 7: ratelimit_fail is per location and inherited
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_DEAD_PORT timeout=500ms;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    ratelimit api;
    ratelimit_fail closed;
    location /t { }
    location /u { ratelimit_fail open; }
--- request eval
["GET /t?k=a", "GET /u?k=a"]
--- error_code eval
[503, 200]



=== TEST 8: a Redis failure is logged at error even when rejections log at info
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_DEAD_PORT timeout=500ms;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; ratelimit_log_level info; }
--- log_level: warn
--- request
GET /t?k=a
--- error_code: 200
--- error_log eval
qr/\[error\] .*ratelimit: /



=== TEST 9: unix socket that does not exist, fail open
--- http_config
    ratelimit_redis unix:$TEST_NGINX_SERVROOT/no-such.sock timeout=500ms;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
--- request
GET /t?k=a
--- error_code: 200
--- response_headers
X-RL: FAILED_OPEN
--- error_log eval
# nginx's own connect() reports a missing unix socket at crit (it does so
# for proxy_pass too); the module's line is at error.
[qr/\[error\] .*ratelimit: .*no-such\.sock/, qr/\[crit\] .*no-such\.sock/]

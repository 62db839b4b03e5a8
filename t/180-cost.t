# cost= on ratelimit lines, and limit=/window= from variables (plans).
use lib 't/lib';
use RLTest;

run_tests();

__DATA__




=== TEST 1: an expensive endpoint takes several units
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=5 window=10s clock=nginx;
--- config
    location /t { ratelimit api; }
    location /u { ratelimit api cost=3; }
--- request eval
["GET /u?k=a", "GET /u?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 429, 200, 200, 429]
--- response_headers_like eval
["RateLimit-Remaining: 2",
 "RateLimit-Remaining: 2\nRetry-After: (9|10)",
 "RateLimit-Remaining: 1",
 "RateLimit-Remaining: 0",
 "RateLimit-Remaining: 0\nRetry-After: (9|10)"]
--- rl_redis_check
ZCARD rl:api:a => 5



=== TEST 2: cost from a variable (a map), members stay unique
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=100 window=10s clock=nginx;
    map $request_method $cost { POST 10; default 1; }
--- config
    location /t { ratelimit api cost=$cost; }
--- request eval
["GET /t?k=a", "POST /t?k=a", "POST /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 405, 405, 200]
--- response_headers eval
["RateLimit-Remaining: 99", "RateLimit-Remaining: 89", "RateLimit-Remaining: 79",
 "RateLimit-Remaining: 78"]
--- rl_redis_check
ZCARD rl:api:a => 22



=== TEST 3: cost=0 reports the quota without taking any
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s clock=nginx;
--- config
    location /t { ratelimit api; }
    location /u { ratelimit api cost=0; }
--- request eval
["GET /u?k=a", "GET /t?k=a", "GET /u?k=a", "GET /t?k=a", "GET /u?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 200, 200, 200, 429]
--- response_headers eval
["RateLimit-Remaining: 2\nRateLimit-Reset: 0", "RateLimit-Remaining: 1",
 "RateLimit-Remaining: 1", "RateLimit-Remaining: 0", "RateLimit-Remaining: 0",
 "RateLimit-Remaining: 0"]
--- rl_redis_check
ZCARD rl:api:a => 2



=== TEST 4: a cost above what the zone can ever grant is denied without asking Redis
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api  key=$arg_k limit=5 window=10s;
    ratelimit_zone pace key=$arg_k limit=5 window=10s algorithm=gcra burst=2;
--- config
    location /t { ratelimit api cost=6; add_header X-RL $ratelimit_status always; }
    location /u { ratelimit pace cost=3; add_header X-RL $ratelimit_status always; }
--- request eval
["GET /t?k=a", "GET /u?k=a"]
--- error_code eval
[429, 429]
--- response_headers eval
["X-RL: REJECTED\n!Retry-After\n",
 "X-RL: REJECTED\n!Retry-After\n"]
--- rl_redis_check
DBSIZE => 0
--- rl_error_log eval
[qr/ratelimit: cost 6 exceeds the 5 units zone "api" can ever grant, request rejected/,
 qr/ratelimit: cost 3 exceeds the 2 units zone "pace" can ever grant/]



=== TEST 4b: a cost above the zone's capacity names its zone in the access log and is counted as a rejection
Issue 19: it logged zone=- limit=- and was missing from ratelimit_decisions_total. A second zone
before it is counted as rejected with it, as in any rejection of several zones; the zone's own
status= answers, and no RateLimit header suggests a wait.
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_metrics_zone 64k;
    ratelimit_zone wide key=$arg_k limit=100 window=10s;
    ratelimit_zone api  key=$arg_k limit=5 window=10s status=403;
    log_format rl '$arg_k $status rl=[$ratelimit_status] zone=[$ratelimit_zone] limit=[$ratelimit_limit] rem=[$ratelimit_remaining]';
--- config
    access_log logs/access.log rl;
    location /t { ratelimit wide; ratelimit api cost=6; }
    location /u { ratelimit api cost=6; ratelimit_dry_run on; }
    location = /metrics { ratelimit_metrics; }
--- request eval
["GET /t?k=a", "GET /u?k=d", "GET /metrics"]
--- error_code eval
[403, 200, 200]
--- response_headers eval
["!RateLimit-Limit\n!RateLimit-Remaining\n!Retry-After", "!RateLimit-Limit", ""]
--- response_body_like eval
[qr/./, qr/./, qr/\A(?=.*^ratelimit_decisions_total\{zone="api",status="REJECTED"\} 1$)(?=.*^ratelimit_decisions_total\{zone="api",status="REJECTED_DRY_RUN"\} 1$)(?=.*^ratelimit_decisions_total\{zone="wide",status="REJECTED"\} 1$)/ms]
--- rl_access_log eval
[qr/^a 403 rl=\[REJECTED\] zone=\[api\] limit=\[5\] rem=\[0\]$/m,
 qr/^d 200 rl=\[REJECTED_DRY_RUN\] zone=\[api\] limit=\[5\] rem=\[0\]$/m]
--- rl_redis_check
DBSIZE => 0



=== TEST 5: limit and window per consumer plan
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    map $arg_plan $plan_limit  { gold 3;   default 1; }
    map $arg_plan $plan_window { gold 1m;  default 10s; }
    ratelimit_zone api key=$arg_k limit=$plan_limit window=$plan_window clock=nginx;
--- config
    location /t { ratelimit api; ratelimit_headers draft; }
--- request eval
["GET /t?k=free", "GET /t?k=free",
 "GET /t?k=g&plan=gold", "GET /t?k=g&plan=gold", "GET /t?k=g&plan=gold", "GET /t?k=g&plan=gold"]
--- error_code eval
[200, 429, 200, 200, 200, 429]
--- response_headers eval
["RateLimit-Policy: \"api\";q=1;w=10", "RateLimit-Policy: \"api\";q=1;w=10",
 "RateLimit-Policy: \"api\";q=3;w=60", undef, undef, "RateLimit: \"api\";r=0;t=60"]
--- rl_redis_check
ZCARD rl:api:free => 1
ZCARD rl:api:g => 3
PTTL rl:api:g =~ ^(59\d{3}|60000)$



=== TEST 6: a variable limit that is not a number: logged, fail open
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=$arg_limit window=10s;
--- config
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
--- request eval
["GET /t?k=a&limit=abc", "GET /t?k=a&limit=0", "GET /t?k=a&limit=2"]
--- error_code eval
[200, 200, 200]
--- response_headers eval
["X-RL: FAILED_OPEN", "X-RL: FAILED_OPEN", "X-RL: PASSED"]
--- rl_redis_check
ZCARD rl:api:a => 1
--- rl_error_log eval
qr/\[error\] .*ratelimit: invalid limit "abc" for zone "api", request passed by ratelimit_fail/



=== TEST 6b: invalid-value lines are throttled per figure and zone, so one never hides another
Issue 19: "invalid limit" and "invalid cost" shared one throttle, so the second kind, or the
same kind in another zone, was not logged for a second; the same line again within the second
still is not.
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api  key=$arg_k limit=$arg_limit window=10s;
    ratelimit_zone pace key=$arg_k limit=$arg_limit window=10s;
--- config
    location /t { ratelimit api cost=$arg_cost; }
    location /u { ratelimit pace; }
--- request eval
["GET /t?k=a&limit=abc&cost=1", "GET /t?k=a&limit=5&cost=x", "GET /u?k=a&limit=def",
 "GET /t?k=a&limit=ghi&cost=1"]
--- error_code eval
[200, 200, 200, 200]
--- rl_error_log eval
[qr/ratelimit: invalid limit "abc" for zone "api"/, qr/ratelimit: invalid cost "x" for zone "api"/,
 qr/ratelimit: invalid limit "def" for zone "pace"/]
--- rl_no_error_log eval
qr/invalid limit "ghi"/



=== TEST 7: a bad window or cost under fail closed: 503, never unlimited
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=5 window=$arg_w;
--- config
    ratelimit_fail closed;
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
    location /u { ratelimit api cost=$arg_c; add_header X-RL $ratelimit_status always; }
--- request eval
["GET /t?k=a&w=", "GET /u?k=a&w=1s&c=-1", "GET /t?k=a&w=1s"]
--- error_code eval
[503, 503, 200]
--- response_headers eval
["X-RL: FAILED_CLOSED", "X-RL: FAILED_CLOSED", "X-RL: PASSED"]
--- rl_error_log eval
qr/ratelimit: invalid window "" for zone "api", request rejected by ratelimit_fail/



=== TEST 8: bad cost values fail nginx -t
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=5 window=10s;
--- config
    location /t { ratelimit api cost=abc; }
--- must_die
--- error_log eval
qr/invalid value "cost=abc" in "ratelimit" directive in .*nginx\.conf:\d+/

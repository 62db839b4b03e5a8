# ratelimit_dry_run: Redis decides every request as usual (a would-be rejection
# is not recorded), nothing is rejected, $ratelimit_status and the log say so,
# and without dry run the same Redis state rejects.
use lib 't/lib';
use RLTest;

run_tests();

__DATA__

=== TEST 1: over the limit every request passes, the would-be rejections are reported, not recorded
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s;
--- config
    ratelimit_dry_run on;
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 200, 200, 200]
--- response_headers eval
["X-RL: PASSED\n!RateLimit-Limit", "X-RL: PASSED\n!RateLimit-Limit",
 "X-RL: REJECTED_DRY_RUN\n!RateLimit-Limit\n!Retry-After",
 "X-RL: REJECTED_DRY_RUN\n!RateLimit-Limit\n!Retry-After",
 "X-RL: REJECTED_DRY_RUN\n!RateLimit-Limit\n!Retry-After"]
--- rl_redis_check
ZCARD rl:api:a => 2
--- rl_error_log eval
[qr/\[error\] .*ratelimit: limiting requests, dry run, by zone "api", limit 2 per 10000ms/]
--- rl_no_error_log
limiting requests by zone



=== TEST 2: switching dry run off rejects exactly as the Redis state says
Redis's dry-run rejection of k=a is remembered by the deny cache, exact as any rejection, so the
first request without dry run is answered from it.
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s;
--- config
    location /u { ratelimit api; ratelimit_dry_run on; add_header X-RL $ratelimit_status always; }
    location /t   { ratelimit api; ratelimit_dry_run off; add_header X-RL $ratelimit_status always; }
--- request eval
["GET /u?k=a", "GET /u?k=a", "GET /u?k=a", "GET /t?k=a", "GET /t?k=b", "GET /t?k=b", "GET /t?k=b"]
--- error_code eval
[200, 200, 200, 429, 200, 200, 429]
--- response_headers eval
["X-RL: PASSED", "X-RL: PASSED", "X-RL: REJECTED_DRY_RUN", "X-RL: REJECTED_CACHED",
 "X-RL: PASSED", "X-RL: PASSED", "X-RL: REJECTED"]
--- rl_redis_check
ZCARD rl:api:a => 2
ZCARD rl:api:b => 2



=== TEST 3: headers in a dry run only when asked, and never a Retry-After on the 200
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s;
--- config
    location /t {
        ratelimit api;
        ratelimit_dry_run on;
        ratelimit_headers legacy;
        add_header X-RL $ratelimit_status always;
    }
--- request eval
["GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200]
--- response_headers eval
["X-RL: PASSED\nRateLimit-Limit: 1\nRateLimit-Remaining: 0",
 "X-RL: REJECTED_DRY_RUN\nRateLimit-Limit: 1\nRateLimit-Remaining: 0\n!Retry-After"]



=== TEST 4: the deny cache is not consulted in a dry run: every decision is Redis's
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s;
--- config
    location /t   { ratelimit api; add_header X-RL $ratelimit_status always; }
    location /u { ratelimit api; ratelimit_dry_run on; add_header X-RL $ratelimit_status always; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /u?k=a", "GET /u?k=a"]
--- error_code eval
[200, 429, 429, 200, 200]
--- response_headers eval
["X-RL: PASSED", "X-RL: REJECTED", "X-RL: REJECTED_CACHED", "X-RL: REJECTED_DRY_RUN",
 "X-RL: REJECTED_DRY_RUN"]
--- rl_access_log eval
[qr/GET \/u\?k=a/]



=== TEST 5: a cost no window can grant is let through and logged as a dry run
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s;
--- config
    location /t { ratelimit api cost=5; ratelimit_dry_run on; add_header X-RL $ratelimit_status always; }
--- request
GET /t?k=a
--- error_code: 200
--- response_headers
X-RL: REJECTED_DRY_RUN
--- rl_redis_check
DBSIZE => 0
--- error_log
request let through, dry run

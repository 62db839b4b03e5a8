# algorithm=sliding_counter and algorithm=gcra end to end (exact decisions at
# exact timestamps are in the direct script tests, t/20x-script-*.t).
use lib 't/lib';
use RLTest;

run_tests();

__DATA__




=== TEST 1: sliding_counter admits the limit, then rejects with a Retry-After
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=3 window=10s algorithm=sliding_counter clock=nginx;
--- config
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 200, 429]
--- response_headers_like eval
["RateLimit-Limit: 3\nRateLimit-Remaining: 2",
 "RateLimit-Remaining: 1",
 "RateLimit-Remaining: 0",
 "RateLimit-Remaining: 0\nX-RL: REJECTED\nRetry-After: \\d+"]
--- rl_redis_check
STRLEN rl:api:a => 9
PTTL rl:api:a =~ ^\d+$
DBSIZE => 1



=== TEST 2: one 9-byte string per key whatever the limit
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1000000 window=1h algorithm=sliding_counter;
--- config
    location /t { ratelimit api; }
--- request eval
[("GET /t?k=a") x 20]
--- error_code eval
[200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200]
--- rl_redis_check
TYPE rl:api:a => string
STRLEN rl:api:a => 9



=== TEST 3: gcra without burst spaces requests window/limit apart
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=10 window=100s algorithm=gcra clock=nginx;
--- config
    location /t { ratelimit api; ratelimit_deny_cache off; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=b"]
--- error_code eval
[200, 429, 200]
--- response_headers_like eval
["RateLimit-Limit: 10\nRateLimit-Remaining: 0",
 "RateLimit-Remaining: 0\nRetry-After: (9|10)",
 undef]
--- rl_redis_check
TYPE rl:api:a => string
STRLEN rl:api:a => 12
PTTL rl:api:a =~ ^(9\d{3}|10000)$



=== TEST 4: gcra with burst=3 admits three at once, and a denial stores nothing
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=1h algorithm=gcra burst=3 clock=nginx;
--- config
    location /t { ratelimit api; ratelimit_deny_cache off; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 200, 429, 429]
--- response_headers_like eval
["RateLimit-Remaining: 2",
 "RateLimit-Remaining: 1",
 "RateLimit-Remaining: 0",
 "RateLimit-Remaining: 0\nRetry-After: (3599|3600)",
 "RateLimit-Remaining: 0\nRetry-After: (3599|3600)"]
--- rl_redis_check
PTTL rl:api:a =~ ^(1079\d{4}|10800000)$



=== TEST 4b: gcra's RateLimit-Limit is the rate, its Remaining what may come at once (docs/algorithms.md)
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=100 window=1m algorithm=gcra burst=10;
--- config
    location /t { ratelimit api; }
    location /u { ratelimit api; ratelimit_headers draft; }
--- request eval
["GET /t?k=a", "GET /u?k=b"]
--- response_headers eval
["RateLimit-Limit: 100\nRateLimit-Remaining: 9\nRateLimit-Reset: 1",
 "RateLimit-Policy: \"api\";q=100;w=60\nRateLimit: \"api\";r=9;t=1"]



=== TEST 5: gcra with a spacing that is no whole number of ms (1000/7)
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone a key=$arg_k limit=7 window=1s algorithm=gcra;
    ratelimit_zone b key=$arg_k limit=3 window=1s algorithm=gcra burst=3;
--- config
    location /t { ratelimit a; ratelimit_deny_cache off; }
    location /u { ratelimit b; ratelimit_deny_cache off; }
--- request eval
["GET /t?k=x", "GET /t?k=x", "GET /u?k=y", "GET /u?k=y", "GET /u?k=y", "GET /u?k=y"]
--- error_code eval
[200, 429, 200, 200, 200, 429]



=== TEST 6: gcra with the Redis clock
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=1h algorithm=gcra burst=2;
--- config
    location /t { ratelimit api; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 429]



=== TEST 7: unknown algorithm, and burst= without gcra
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=1h algorithm=leaky;
--- config
    location /t { ratelimit api; }
--- must_die
--- error_log eval
qr/invalid value "algorithm=leaky" in "ratelimit_zone" directive in .*nginx\.conf:\d+/



=== TEST 8: burst= needs algorithm=gcra
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=1h burst=5;
--- config
    location /t { ratelimit api; }
--- must_die
--- error_log eval
qr/"burst=" of "ratelimit_zone" directive "api" needs algorithm=gcra in .*nginx\.conf:\d+/

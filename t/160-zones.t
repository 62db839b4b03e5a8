# Several zones in one location: decided in one script call, all or nothing,
# reported by the deciding zone; inherited as a set, like limit_req.
use lib 't/lib';
use RLTest;

run_tests();

__DATA__




=== TEST 1: a rejection by one zone uses up none of the others
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone per_ip  key=$remote_addr limit=100 window=10s clock=nginx;
    ratelimit_zone per_key key=$arg_k       limit=2   window=10s clock=nginx;
--- config
    location /t {
        ratelimit per_ip;
        ratelimit per_key;
        add_header X-RL "$ratelimit_status $ratelimit_zone $ratelimit_remaining" always;
    }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=b"]
--- error_code eval
[200, 200, 429, 429, 200]
--- response_headers eval
["X-RL: PASSED per_key 1", "X-RL: PASSED per_key 0", "X-RL: REJECTED per_key 0",
 "X-RL: REJECTED_CACHED per_key 0", "X-RL: PASSED per_key 1"]
--- rl_redis_check
ZCARD rl:per_ip:127.0.0.1 => 3
ZCARD rl:per_key:a => 2
ZCARD rl:per_key:b => 1
--- rl_error_log
limiting requests by zone "per_key", limit 2 per 10000ms



=== TEST 2: headers describe the zone with the least remaining
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone minute key=$arg_k limit=5  window=1m clock=nginx;
    ratelimit_zone hour   key=$arg_k limit=50 window=1h clock=nginx;
--- config
    location /t {
        ratelimit hour;
        ratelimit minute;
        add_header X-Zone $ratelimit_zone always;
    }
--- rl_redis_setup
ZADD rl:hour:a 1 x1 2 x2 3 x3
--- request eval
["GET /t?k=a", "GET /t?k=b"]
--- error_code eval
[200, 200]
--- response_headers eval
["X-Zone: minute\nRateLimit-Limit: 5\nRateLimit-Remaining: 4",
 "X-Zone: minute\nRateLimit-Limit: 5\nRateLimit-Remaining: 4"]



=== TEST 3: on rejection, the rejecting zone with the longest Retry-After
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone short key=$arg_k limit=1 window=5s  clock=nginx;
    ratelimit_zone long  key=$arg_k limit=1 window=50s clock=nginx;
    ratelimit_zone wide  key=$arg_k limit=9 window=1h  clock=nginx;
--- config
    location /t {
        ratelimit short;
        ratelimit long;
        ratelimit wide;
        ratelimit_deny_cache off;
        add_header X-Zone $ratelimit_zone always;
    }
--- request eval
["GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 429]
--- response_headers_like eval
["X-Zone: short",
 "X-Zone: long\nRateLimit-Limit: 1\nRateLimit-Remaining: 0\nRetry-After: (49|50)"]
--- rl_redis_check
ZCARD rl:short:a => 1
ZCARD rl:long:a => 1
ZCARD rl:wide:a => 1



=== TEST 4: draft headers list every zone's policy and report the deciding one
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone per_ip key=$remote_addr limit=10   window=1s clock=nginx;
    ratelimit_zone api    key=$arg_k       limit=1000 window=1h clock=nginx;
--- config
    location /t {
        ratelimit per_ip;
        ratelimit api;
        ratelimit_headers draft;
    }
--- request
GET /t?k=a
--- error_code: 200
--- response_headers
RateLimit-Policy: "per_ip";q=10;w=1, "api";q=1000;w=3600
RateLimit: "per_ip";r=9;t=1
!RateLimit-Limit



=== TEST 5: inherited as a set; a level with its own lines replaces it
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone a key=$arg_k limit=5 window=10s clock=nginx;
    ratelimit_zone b key=$arg_k limit=5 window=10s clock=nginx;
    ratelimit_zone c key=$arg_k limit=5 window=10s clock=nginx;
--- config
    ratelimit a;
    ratelimit b;
    location /t { }
    location /u { ratelimit c; }
    location /api { ratelimit off; }
--- request eval
["GET /t?k=x", "GET /u?k=y", "GET /api?k=z"]
--- error_code eval
[200, 200, 200]
--- rl_redis_check
ZCARD rl:a:x => 1
ZCARD rl:b:x => 1
ZCARD rl:c:x => 0
ZCARD rl:a:y => 0
ZCARD rl:b:y => 0
ZCARD rl:c:y => 1
DBSIZE => 3



=== TEST 6: a zone whose key is empty is left out of the decision
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone per_ip key=$remote_addr limit=1 window=10s clock=nginx;
    ratelimit_zone per_key key=$http_x_api_key limit=5 window=10s clock=nginx;
--- config
    location /t {
        ratelimit per_key;
        ratelimit per_ip;
        add_header X-Zone $ratelimit_zone always;
    }
--- request eval
["GET /t", "GET /t"]
--- error_code eval
[200, 429]
--- response_headers eval
["X-Zone: per_ip", "X-Zone: per_ip"]
--- rl_redis_check
DBSIZE => 1



=== TEST 7: zones of different algorithms in one call
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone log     key=$arg_k limit=3 window=10s clock=nginx;
    ratelimit_zone counter key=$arg_k limit=3 window=10s algorithm=sliding_counter clock=nginx;
    ratelimit_zone gcra    key=$arg_k limit=2 window=10s algorithm=gcra burst=2 clock=nginx;
--- config
    location /t {
        ratelimit log;
        ratelimit counter;
        ratelimit gcra;
        ratelimit_deny_cache off;
        add_header X-Zone "$ratelimit_status $ratelimit_zone" always;
    }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 429]
--- response_headers eval
["X-Zone: PASSED gcra", "X-Zone: PASSED gcra", "X-Zone: REJECTED gcra"]
--- rl_redis_check
ZCARD rl:log:a => 2
STRLEN rl:counter:a => 9
TYPE rl:gcra:a => string



=== TEST 8: the same zone twice at one level is refused
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone a key=$arg_k limit=5 window=10s;
--- config
    location /t { ratelimit a; ratelimit a; }
--- must_die
--- error_log eval
qr/"ratelimit" directive is duplicate in .*nginx\.conf:\d+/



=== TEST 9: "off" cannot be mixed with zones at one level
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone a key=$arg_k limit=5 window=10s;
--- config
    location /t { ratelimit off; ratelimit a; }
--- must_die
--- error_log eval
qr/"ratelimit" directive is duplicate in .*nginx\.conf:\d+/

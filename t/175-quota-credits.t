# Calendar quotas (period=) and credit balances (algorithm=balance) end to
# end: status, headers, variables, the Redis values, and the recipe of a
# per-second rate, a monthly quota and a balance on one location
# (docs/quotas-and-credits.md).  Period arithmetic is covered by t/208-script-quota.t.
use lib 't/lib';
use RLTest;

run_tests();

__DATA__

=== TEST 1: a monthly quota: exact limit, Retry-After and Reset at the month's end
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone monthly key=$arg_k limit=3 period=month clock=nginx;
--- config
    location /t { ratelimit monthly; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 200, 429]
--- response_headers_like eval
["RateLimit-Remaining: ^2\$", "RateLimit-Remaining: ^1\$", "RateLimit-Remaining: ^0\$",
 "RateLimit-Remaining: ^0\$\nRetry-After: ^[1-9][0-9]*\$"]
--- rl_redis_check
STRLEN rl:monthly:a => 10
PTTL rl:monthly:a =~ ^[1-9][0-9]*$
--- rl_error_log
limiting requests by zone "monthly", limit 3 per



=== TEST 2: draft headers: w is the length of the current period, t the time to its end
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone day   key=$arg_k limit=5 period=day utc_offset=+02:00;
    ratelimit_zone month key=$arg_k limit=9 period=month;
--- config
    ratelimit_headers draft;
    location /t { ratelimit day; ratelimit month; }
--- request
GET /t?k=a
--- error_code: 200
--- response_headers_like eval
"RateLimit-Policy: ^\"day\";q=5;w=86400, \"month\";q=9;w=(2419200|2505600|2592000|2678400)\$
RateLimit: ^\"day\";r=4;t=([1-9][0-9]{0,3}|[1-7][0-9]{4}|8[0-5][0-9]{3}|86[0-3][0-9]{2}|86400)\$"



=== TEST 3: a balance: drawn by cost, never below zero, 402 when empty, no Retry-After
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone credits key=$arg_k limit=1000 algorithm=balance status=402;
--- config
    ratelimit_headers draft;
    location /t {
        ratelimit credits cost=2;
        add_header X-Credits "$ratelimit_remaining/$ratelimit_limit" always;
    }
--- rl_redis_setup
SET rl:credits:a 5
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=b"]
--- error_code eval
[200, 200, 402, 402]
--- response_headers_like eval
["X-Credits: ^3/1000\$\nRateLimit-Policy: ^\"credits\";q=1000\$", "X-Credits: ^1/1000\$",
 "X-Credits: ^1/1000\$\n!Retry-After", "X-Credits: ^0/1000\$\n!Retry-After"]
--- rl_redis_check
GET rl:credits:a => 1
EXISTS rl:credits:b => 0



=== TEST 4: missing=N grants a new key N credits; a top-up through Redis is seen at once
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone credits key=$arg_k limit=2 algorithm=balance missing=2;
--- config
    location /t { ratelimit credits; add_header X-Left $ratelimit_remaining always; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 429]
--- response_headers eval
["X-Left: 1", "X-Left: 0", "X-Left: 0"]
--- rl_redis_check
GET rl:credits:a => 0
INCRBY rl:credits:a 7 => 7



=== TEST 5: the recipe of docs/quotas-and-credits.md: a rate, a monthly quota and a balance on one location, JSON and X-Credits-Remaining on 402
Issue 19: the recipe promised X-Credits-Remaining on the 402, but add_header is the final
location's, and error_page 402 = @no_credits ends in @no_credits: it must add it there too.
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    map $uri $request_cost { /t 1; default 1; }
    ratelimit_zone per_second key=$http_x_api_key limit=10     window=1s algorithm=gcra burst=10;
    ratelimit_zone monthly    key=$http_x_api_key limit=100000 period=month;
    ratelimit_zone credits    key=$http_x_api_key limit=50000  algorithm=balance status=402;
--- config
    location /t {
        ratelimit per_second;
        ratelimit monthly;
        ratelimit credits cost=$request_cost;
        add_header X-Credits-Remaining $ratelimit_remaining always;
        error_page 402 = @no_credits;
    }
    location @no_credits {
        add_header X-Credits-Remaining $ratelimit_remaining always;
        default_type application/json;
        return 402 '{"creditsRemaining":$ratelimit_remaining,"creditsLimit":$ratelimit_limit}\n';
    }
--- more_headers
X-Api-Key: a
--- rl_redis_setup
SET rl:credits:a 2
--- request eval
["GET /t", "GET /t", "GET /t"]
--- error_code eval
[200, 200, 402]
--- response_headers eval
["X-Credits-Remaining: 1", "X-Credits-Remaining: 0", "X-Credits-Remaining: 0\nContent-Type: application/json\nRateLimit-Remaining: 0\nRateLimit-Limit: 50000"]
--- response_body eval
["ok\n", "ok\n", "{\"creditsRemaining\":0,\"creditsLimit\":50000}\n"]
--- rl_redis_check
GET rl:credits:a => 0
STRLEN rl:monthly:a => 10



=== TEST 6: period= and balance errors
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone q key=$arg_k limit=2 period=year;
--- config
    location /t { ratelimit q; }
--- must_die
--- error_log eval
qr/invalid value "period=year" in "ratelimit_zone" directive in .*nginx\.conf:\d+/



=== TEST 7: a quota has no window=
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone q key=$arg_k limit=2 period=day window=1h;
--- config
    location /t { ratelimit q; }
--- must_die
--- error_log eval
qr/"ratelimit_zone" directive "q": "window=" is not for a calendar quota or a balance in .*nginx\.conf:\d+/



=== TEST 8: period= with algorithm=, utc_offset= without period=, missing= without a balance, bad offset
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone a key=$arg_k limit=2 period=day algorithm=gcra;
--- config
    location /t { ratelimit a; }
--- must_die
--- error_log eval
qr/"period=" makes a calendar quota, without "algorithm="/



=== TEST 9: utc_offset= needs period=
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone a key=$arg_k limit=2 window=1h utc_offset=+01:00;
--- config
    location /t { ratelimit a; }
--- must_die
--- error_log eval
qr/"utc_offset=" needs "period="/



=== TEST 10: missing= needs algorithm=balance
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone a key=$arg_k limit=2 window=1h missing=5;
--- config
    location /t { ratelimit a; }
--- must_die
--- error_log eval
qr/"missing=" needs "algorithm=balance"/



=== TEST 11: a bad utc_offset= and status=
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone a key=$arg_k limit=2 period=day utc_offset=+25:00;
--- config
    location /t { ratelimit a; }
--- must_die
--- error_log eval
qr/invalid value "utc_offset=\+25:00" in "ratelimit_zone"/



=== TEST 12: a quota's rejection is remembered until the period ends; an empty balance's until it changes
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone weekly  key=$arg_k limit=1 period=week;
    ratelimit_zone credits key=$arg_k limit=9 algorithm=balance;
--- config
    location /t { ratelimit weekly; add_header X-RL $ratelimit_status always; }
    location /u { ratelimit credits; add_header X-RL "$ratelimit_status $ratelimit_reset" always; }
--- rl_redis_setup
SET rl:credits:a 0
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /u?k=a", "GET /u?k=a"]
--- error_code eval
[200, 429, 429, 429, 429]
--- response_headers_like eval
["X-RL: ^PASSED\$", "X-RL: ^REJECTED\$\nRetry-After: ^([1-9][0-9]{0,5})\$",
 "X-RL: ^REJECTED_CACHED\$\nRetry-After: ^([1-9][0-9]{0,5})\$", "X-RL: ^REJECTED 0\$\n!Retry-After",
 "X-RL: ^REJECTED_CACHED 0\$\n!Retry-After"]

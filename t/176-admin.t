# ratelimit_admin: a location that reads (GET) and resets (DELETE) what a
# zone of any algorithm holds for a key, and sets and tops up (POST, PUT) a
# balance zone's credits, through the worker's Redis pool, answering JSON;
# protected by nginx's own allow/deny.
use lib 't/lib';
use RLTest;

run_tests();

__DATA__

=== TEST 1: set, add, read; the balance zone sees the result at once
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone credits key=$arg_k limit=100 algorithm=balance status=402;
--- config
    location /t { ratelimit credits; add_header X-Left $ratelimit_remaining always; }
    location = /admin { allow 127.0.0.1; deny all; ratelimit_admin credits; }
--- request eval
["GET /admin?key=a", "POST /admin?key=a&set=2", "GET /t?k=a", "POST /admin?key=a&add=5",
 "GET /admin?key=a", "GET /t?k=a", "POST /admin?key=a&set=0", "GET /t?k=a"]
--- error_code eval
[200, 200, 200, 200, 200, 200, 200, 402]
--- response_body_like eval
["^\\{\"zone\":\"credits\",\"key\":\"a\",\"balance\":0,\"limit\":100\\}\$",
 "^\\{\"zone\":\"credits\",\"key\":\"a\",\"balance\":2\\}\$", "^ok\$",
 "\"balance\":6\\}\$", "\"balance\":6,", "^ok\$", "\"balance\":0\\}\$", "402 Payment Required"]
--- response_headers eval
["Content-Type: application/json", undef, "X-Left: 1", undef, undef, "X-Left: 5", undef, undef]
--- rl_redis_check
GET rl:credits:a => 0



=== TEST 2: bad requests are refused without asking Redis
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone credits key=$arg_k limit=100 algorithm=balance;
--- config
    location = /admin { ratelimit_admin credits; }
--- request eval
["GET /admin", "POST /admin?key=a&set=-1", "POST /admin?key=a&add=x", "POST /admin?key=a&set=1&add=1",
 "POST /admin?key=a&set=1000000001"]
--- error_code eval
[400, 400, 400, 400, 400]
--- response_body_like eval
["^\\{\"error\":\"key= is required", "^\\{\"error\":", "^\\{\"error\":", "^\\{\"error\":",
 "^\\{\"error\":"]
--- rl_redis_check
EXISTS rl:credits:a => 0



=== TEST 3: deny all protects it
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone credits key=$arg_k limit=100 algorithm=balance;
--- config
    location = /admin { deny all; ratelimit_admin credits; }
--- request
GET /admin?key=a&set=5
--- error_code: 403
--- rl_redis_check
EXISTS rl:credits:a => 0
--- error_log
access forbidden by rule



=== TEST 4: Redis down: 502 with the reason, the worker keeps serving
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_DEAD_PORT;
    ratelimit_zone credits key=$arg_k limit=100 algorithm=balance;
--- config
    location = /admin { ratelimit_admin credits; }
--- request eval
["POST /admin?key=a&add=1", "GET /t"]
--- error_code eval
[502, 200]
--- response_body_like eval
["^\\{\"error\":\"redis ", "ok"]
--- rl_error_log
connect failed



=== TEST 5: NOSCRIPT: loaded again, once
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone credits key=$arg_k limit=100 algorithm=balance;
--- config
    location = /admin { ratelimit_admin credits; }
--- init
RLTest::redis_cmd('SCRIPT', 'FLUSH');
--- request
POST /admin?key=a&add=3
--- error_code: 200
--- response_body
{"zone":"credits","key":"a","balance":3}



=== TEST 6: a zone declared before
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
--- config
    location = /admin { ratelimit_admin api; }
--- must_die
--- error_log eval
qr/"ratelimit_admin" needs "ratelimit_redis" and a zone "api" declared before it in .*nginx\.conf:\d+/



=== TEST 7: set and add change balances by POST or PUT only (a GET could come from any page)
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone credits key=$arg_k limit=100 algorithm=balance;
--- config
    location = /admin { ratelimit_admin credits; }
--- request eval
["GET /admin?key=a&set=5", "GET /admin?key=a&add=5", "HEAD /admin?key=a&add=5",
 "PUT /admin?key=a&set=5", "POST /admin?key=a&add=1", "GET /admin?key=a"]
--- error_code eval
[405, 405, 405, 200, 200, 200]
--- response_body_like eval
["^\\{\"error\":\"set= and add= need POST or PUT\"\\}", "POST or PUT", "^\$", "\"balance\":5\\}",
 "\"balance\":6\\}", "\"balance\":6,"]



=== TEST 8: the key requests use: an exact key, a literal text around the variable, a key percent-decoded
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone cr key=cr:$arg_k limit=100 algorithm=balance exact_key=on;
    ratelimit_zone plan key=plan-${arg_k}-x limit=100 algorithm=balance;
--- config
    location /t { ratelimit cr; add_header X-Left $ratelimit_remaining always; }
    location /p { ratelimit plan; add_header X-Left $ratelimit_remaining always; try_files /t =404; }
    location = /a1 { ratelimit_admin cr; }
    location = /a2 { ratelimit_admin plan; }
--- request eval
["POST /a1?key=bob&set=10", "GET /t?k=bob", "POST /a2?key=b%2520b&set=3", "GET /p?k=b%20b"]
--- error_code eval
[200, 200, 200, 200]
--- response_headers eval
[undef, "X-Left: 9", undef, "X-Left: 2"]
--- rl_redis_check
GET cr:bob => 9
GET rl:plan:plan-b%20b-x => 2



=== TEST 9: a zone whose key has several variables cannot say which one key= gives
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone credits key=$arg_k:$host limit=100 algorithm=balance;
--- config
    location = /admin { ratelimit_admin credits; }
--- must_die
--- error_log eval
qr/"ratelimit_admin" needs the key of zone "credits" to hold exactly one variable, whose value key= gives; it is "\$arg_k:\$host" in .*nginx\.conf:\d+/


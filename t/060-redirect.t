# Each main request is counted exactly once: internal redirects (error_page,
# try_files, named locations, rewrite ... last, index) do not count it
# again, and subrequests (SSI include, mirror) are not counted at all.
use lib 't/lib';
use RLTest;

run_tests();

__DATA__

=== TEST 1: error_page to a named location
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=5 window=10s clock=nginx;
--- config
    ratelimit api;
    location /missing { error_page 404 = @fallback; }
    location @fallback { try_files /t =404; }
--- request eval
["GET /missing?k=a", "GET /missing?k=a", "GET /missing?k=a"]
--- error_code eval
[200, 200, 200]
--- response_headers eval
["RateLimit-Remaining: 4", "RateLimit-Remaining: 3", "RateLimit-Remaining: 2"]
--- rl_redis_check
ZCARD rl:api:a => 3



=== TEST 2: error_page to a URI
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=5 window=10s clock=nginx;
--- config
    ratelimit api;
    location /missing { error_page 404 = /t?k=$arg_k; }
    location /t { }
--- request eval
["GET /missing?k=a", "GET /missing?k=a"]
--- error_code eval
[200, 200]
--- rl_redis_check
ZCARD rl:api:a => 2



=== TEST 3: try_files falling back to a URI and to a named location
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=5 window=10s clock=nginx;
--- config
    ratelimit api;
    location /a { try_files /nonexistent /t?$args; }
    location /b { try_files /nonexistent @named; }
    location /t { }
    location @named { try_files /t =404; }
--- request eval
["GET /a?k=a", "GET /b?k=a", "GET /a?k=a"]
--- error_code eval
[200, 200, 200]
--- rl_redis_check
ZCARD rl:api:a => 3



=== TEST 4: rewrite ... last
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=5 window=10s clock=nginx;
--- config
    ratelimit api;
    location /r { rewrite ^ /t last; }
    location /t { }
--- request eval
["GET /r?k=a", "GET /r?k=a"]
--- error_code eval
[200, 200]
--- rl_redis_check
ZCARD rl:api:a => 2



=== TEST 5: index redirects to the index file
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=5 window=10s clock=nginx;
--- config
    ratelimit api;
    location /dir/ { }
--- user_files
>>> dir/index.html
index
--- request eval
["GET /dir/?k=a", "GET /dir/?k=a"]
--- error_code eval
[200, 200]
--- response_body eval
["index\n", "index\n"]
--- rl_redis_check
ZCARD rl:api:a => 2



=== TEST 6: SSI include subrequests are not counted
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s clock=nginx;
--- config
    ratelimit api;
    location /ssi.html { ssi on; }
    location /t { }
--- user_files
>>> ssi.html
<!--# include virtual="/t?k=a" -->
<!--# include virtual="/t?k=a" -->
<!--# include virtual="/t?k=a" -->
--- request eval
["GET /ssi.html?k=a", "GET /ssi.html?k=a"]
--- error_code eval
[200, 200]
--- response_body eval
["ok\n\nok\n\nok\n\n", "ok\n\nok\n\nok\n\n"]
--- rl_redis_check
ZCARD rl:api:a => 2



=== TEST 7: mirror subrequests are not counted
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=5 window=10s clock=nginx;
--- config
    ratelimit api;
    location /t { mirror /mirror; }
    location = /mirror { internal; try_files /u =404; }
--- request eval
["GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200]
--- wait: 0.2
--- rl_redis_check
ZCARD rl:api:a => 2



=== TEST 8: a rejection redirected by error_page to a limited URI is not counted again
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    ratelimit api;
    error_page 429 = /u?k=$arg_k;
    location /t { }
    location /u { }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 200]
--- rl_redis_check
ZCARD rl:api:a => 1



=== TEST 9: a rejection stays a rejection after error_page to a named location
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    ratelimit api;
    error_page 429 @limited;
    location /t { }
    location @limited { try_files /u =404; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 429, 429]
--- rl_redis_check
ZCARD rl:api:a => 1



=== TEST 10: subrequests of an unlimited main request are not limited either
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /ssi.html { ssi on; }
    location /t { ratelimit api; }
--- user_files
>>> ssi.html
<!--# include virtual="/t?k=a" -->
<!--# include virtual="/t?k=a" -->
--- request
GET /ssi.html
--- error_code: 200
--- response_body eval
"ok\n\nok\n\n"
--- rl_redis_check
DBSIZE => 0

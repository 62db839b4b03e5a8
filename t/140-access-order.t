# The handler's place in the access phase, as docs/access-phase.md documents it:
# before allow/deny, auth_basic and auth_request (so their refusals are
# still counted), before a postponed access_by_lua, and after it with
# access_by_lua_no_postpone.  ratelimit_status 403 under satisfy any is one
# failed check that another may overrule.  Blocks needing modules the nginx
# under test lacks are skipped.
use lib 't/lib';
use RLTest;

run_tests();

__DATA__

=== TEST 1: a request deny refuses has been counted
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; deny all; }
--- request eval
["GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[403, 429]
--- rl_redis_check
ZCARD rl:api:a => 1



=== TEST 2: a request auth_basic refuses has been counted
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=5 window=10s clock=nginx;
--- config
    location /t {
        ratelimit api;
        auth_basic "rl";
        auth_basic_user_file $TEST_NGINX_HTML_DIR/htpasswd;
    }
--- user_files
>>> htpasswd
user:{PLAIN}pass
--- request eval
["GET /t?k=a", "GET /t?k=a"]
--- more_headers eval
["", "Authorization: Basic dXNlcjpwYXNz"]
--- error_code eval
[401, 200]
--- rl_redis_check
ZCARD rl:api:a => 2



=== TEST 3: ratelimit_status 403 under satisfy any is overruled by allow
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { satisfy any; ratelimit api; ratelimit_status 403; allow 127.0.0.1; deny all; }
    location /u { satisfy any; ratelimit api; ratelimit_status 403; deny all; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /u?k=a"]
--- error_code eval
[200, 200, 403]



=== TEST 4: a 429 ends the request under satisfy any even if allow would pass it
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { satisfy any; ratelimit api; allow 127.0.0.1; deny all; }
--- request eval
["GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 429]



=== TEST 5: auth_request runs after the limiter; its subrequest is not counted
--- skip_eval: 1: !main::nginx_has('http_auth_request_module')
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=5 window=10s clock=nginx;
--- config
    ratelimit api;
    location /t { auth_request /auth; }
    location /u { auth_request /deny; }
    location = /auth { internal; return 204; }
    location = /deny { internal; return 403; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /u?k=a"]
--- error_code eval
[200, 200, 403]
--- rl_redis_check
ZCARD rl:api:a => 3



=== TEST 6: a postponed access_by_lua runs after the limiter and sees its decision
--- skip_eval: 1: !main::nginx_has('ngx_http_lua_module')
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t {
        ratelimit api;
        access_by_lua_block {
            ngx.header["X-Lua-Saw"] = ngx.var.ratelimit_status
            if ngx.var.arg_deny then ngx.exit(403) end
        }
    }
--- request eval
["GET /t?k=a&deny=1", "GET /t?k=a", "GET /t?k=b"]
--- error_code eval
[403, 429, 200]
--- response_headers eval
["X-Lua-Saw: PASSED", "!X-Lua-Saw", "X-Lua-Saw: PASSED"]
--- rl_redis_check
ZCARD rl:api:a => 1



=== TEST 7: access_by_lua_no_postpone: the limiter still runs first, so a lua refusal counts
--- skip_eval: 1: !main::nginx_has('ngx_http_lua_module')
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
    access_by_lua_no_postpone on;
--- config
    location /t {
        ratelimit api;
        access_by_lua_block {
            if ngx.var.arg_deny then ngx.exit(403) end
        }
    }
--- request eval
["GET /t?k=a&deny=1", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[403, 429, 429]
--- rl_redis_check
ZCARD rl:api:a => 1

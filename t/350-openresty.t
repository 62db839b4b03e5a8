# What surprises a Lua user (lua-nginx-module, OpenResty): docs/openresty.md, one block per
# surprise and its way out. Needs the Lua module: the system flavour (make test-system, Debian's
# nginx with libnginx-mod-http-lua), or an nginx built with lua-nginx-module.
use lib 't/lib';
use RLTest;

plan(skip_all => 'needs the Lua module (Debian: libnginx-mod-http-lua; make test-system)')
    unless nginx_has('ngx_http_lua_module');

# (3) nginx -t warns about a ratelimit line in an auth_request target of the same server; one
# inherited from the server level is not warned about (it limits the location's own requests).
if (nginx_has('http_auth_request_module')) {
    my ($rc, $out) = nginx_t(http_config => <<'HTTP', config => <<'SERVER');
    ratelimit_redis 127.0.0.1:6379;
    ratelimit_zone api key=$arg_k limit=5 window=10s;
    ratelimit_zone site key=$arg_k limit=5 window=10s;
HTTP
    ratelimit site;
    location /t { auth_request /auth; }
    location ~ ^/re/ { auth_request /deep/auth?from=re; }
    location = /auth { internal; ratelimit api; return 204; }
    location /deep { location /deep/auth { ratelimit api; } }
    location /other { ratelimit api; }
SERVER
    is($rc, 0, 'nginx -t passes with a ratelimit in an auth_request target');
    like($out, qr/\[warn\].*ratelimit "api" in location "\/auth" never applies to the auth_request subrequests of "\/t" \(subrequests are not limited: limit the requests that make them\), in \S+nginx\.conf:\d+/,
        '... and warns, naming the zone, both locations and the line');
    like($out, qr/\[warn\].*ratelimit "api" in location "\/deep\/auth" never applies to the auth_request subrequests of "\^\/re\/"/,
        '... also for a nested target named by a regex location');
    unlike($out, qr/"site"|location "\/other"|location "\/deep" /,
        '... not about a ratelimit inherited from the server, nor about locations no auth_request names');
}

run_tests();

__DATA__



=== TEST 1: (1) a header variable read before rewrite_by_lua changes the header keeps the old value
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone fresh key=$http_x_user limit=5 window=10s clock=nginx;
    ratelimit_zone cached key=$http_x_user limit=5 window=10s clock=nginx;
--- config
    location /fresh {
        ratelimit fresh;
        rewrite_by_lua_block { ngx.req.set_header("X-User", "lua-" .. ngx.var.http_x_user) }
        content_by_lua_block { ngx.say("ok") }
    }
    location /cached {
        ratelimit cached;
        set $seen $http_x_user;
        rewrite_by_lua_block { ngx.req.set_header("X-User", "lua-" .. ngx.var.http_x_user) }
        content_by_lua_block { ngx.say("ok") }
    }
--- more_headers
X-User: alice
--- request eval
["GET /fresh", "GET /cached"]
--- rl_redis_check
EXISTS rl:fresh:lua-alice => 1
EXISTS rl:cached:alice => 1
DBSIZE => 2



=== TEST 2: (1) the way out: key on a variable Lua sets itself
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$rl_user limit=5 window=10s clock=nginx;
--- config
    location /t {
        ratelimit api;
        set $seen $http_x_user;
        set $rl_user "";
        rewrite_by_lua_block { ngx.var.rl_user = "lua-" .. ngx.var.http_x_user }
    }
--- more_headers
X-User: alice
--- request
GET /t
--- rl_redis_check
EXISTS rl:api:lua-alice => 1
DBSIZE => 1



=== TEST 3: (2) ngx.exec into a location with another zone reuses the first decision
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone front key=$arg_k limit=5 window=10s clock=nginx;
    ratelimit_zone back key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /front {
        ratelimit front;
        content_by_lua_block { ngx.exec("/back", ngx.var.args) }
    }
    location /back {
        ratelimit back;
        content_by_lua_block { ngx.say("back ", ngx.var.ratelimit_status) }
    }
--- request eval
["GET /front?k=a", "GET /front?k=a", "GET /back?k=a", "GET /back?k=a"]
--- error_code eval
[200, 200, 200, 429]
--- response_body eval
["back PASSED\n", "back PASSED\n", "back PASSED\n", qr/429 Too Many Requests/]
--- rl_redis_check
ZCARD rl:front:a => 2
ZCARD rl:back:a => 1



=== TEST 4: (2) the way out: ngx.exec from rewrite_by_lua runs before any decision, so the target decides
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone front key=$arg_k limit=5 window=10s clock=nginx;
    ratelimit_zone back key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /front {
        ratelimit front;
        rewrite_by_lua_block { ngx.exec("/back", ngx.var.args) }
    }
    location /back {
        ratelimit back;
        content_by_lua_block { ngx.say("back ", ngx.var.ratelimit_status) }
    }
--- request eval
["GET /front?k=a", "GET /front?k=a"]
--- error_code eval
[200, 429]
--- rl_redis_check
EXISTS rl:front:a => 0
ZCARD rl:back:a => 1



=== TEST 5: (3) ratelimit in an ngx.location.capture target does nothing; its variables show the main request's decision
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone main key=$arg_k limit=5 window=10s clock=nginx;
    ratelimit_zone sub key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /main {
        ratelimit main;
        content_by_lua_block {
            for i = 1, 3 do
                local r = ngx.location.capture("/sub", { args = ngx.var.args })
                ngx.say(r.status, " ", r.body)
            end
        }
    }
    location /sub {
        ratelimit sub;
        content_by_lua_block {
            ngx.print(ngx.var.ratelimit_status, " remaining=", ngx.var.ratelimit_remaining)
        }
    }
--- request
GET /main?k=a
--- response_body
200 PASSED remaining=4
200 PASSED remaining=4
200 PASSED remaining=4
--- rl_redis_check
ZCARD rl:main:a => 1
EXISTS rl:sub:a => 0



=== TEST 6: (3) the same for an auth_request target
--- skip_eval: 1: !main::nginx_has('http_auth_request_module')
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone auth key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t {
        auth_request /auth;
        content_by_lua_block { ngx.say("served") }
    }
    location = /auth {
        internal;
        ratelimit auth;
        content_by_lua_block { ngx.exit(ngx.HTTP_NO_CONTENT) }
    }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 200]
--- rl_redis_check
DBSIZE => 0



=== TEST 7: (4) a response produced in rewrite_by_lua is never limited
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /rewrite {
        ratelimit api;
        rewrite_by_lua_block { ngx.say("from rewrite"); ngx.exit(ngx.HTTP_OK) }
    }
    location /content {
        ratelimit api;
        content_by_lua_block { ngx.say("from content") }
    }
--- request eval
["GET /rewrite?k=a", "GET /rewrite?k=a", "GET /content?k=a", "GET /content?k=a"]
--- error_code eval
[200, 200, 200, 429]
--- rl_redis_check
ZCARD rl:api:a => 1



=== TEST 8: (5) error_page 429 = @named answers what the handler answers: 200 unless it sets the status
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    ratelimit api;
    location /equals { error_page 429 = @slow_down; try_files /t =404; }
    location /equals-status { error_page 429 = @slow_down_429; try_files /t =404; }
    location /plain { error_page 429 @slow_down; try_files /t =404; }
    location @slow_down { content_by_lua_block { ngx.say("slow down") } }
    location @slow_down_429 { content_by_lua_block { ngx.status = 429; ngx.say("slow down") } }
--- request eval
["GET /equals?k=a", "GET /equals?k=a", "GET /equals-status?k=a", "GET /plain?k=a"]
--- error_code eval
[200, 200, 429, 429]
--- response_body eval
[qr/^ok$/, "slow down\n", "slow down\n", "slow down\n"]
--- rl_redis_check
ZCARD rl:api:a => 1

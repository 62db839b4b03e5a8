# satisfy any/all with auth_basic, allow/deny and auth_request, as
# docs/access-phase.md ("Order in the access phase, satisfy ...") says: the
# limiter runs before them; an admitted request returns NGX_DECLINED, so it
# grants nothing under satisfy any and the other checks still decide; a
# rejection (429) ends the request under satisfy all and any alike, even
# when allow or valid credentials would pass it -- unless ratelimit_status
# is 401 or 403, which nginx treats as one failed check another may
# overrule.  Every request that reaches the limiter is counted, whatever
# the later checks say.
#
# htpasswd: user:pass ("dXNlcjpwYXNz"); "dXNlcjp3cm9uZw==" is user:wrong.
# auth_request blocks need ngx_http_auth_request_module (Debian's nginx has
# it, the vendored build does not): they are skipped without it.
# A rejection after the first is REJECTED(_CACHED)?: from memory when it comes
# within 100 ms of the first, or once the worker's tracker (which the first
# starts) is ready, from Redis otherwise (a loaded machine): both end the
# request the same way, which is what these blocks are about.
use lib 't/lib';
use RLTest;

run_tests();

__DATA__




=== TEST 1: satisfy any: an admitted request is still subject to auth_basic
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=5 window=10s clock=nginx;
--- config
    location /t {
        satisfy any;
        ratelimit api;
        auth_basic "rl";
        auth_basic_user_file $TEST_NGINX_HTML_DIR/htpasswd;
        add_header X-RL $ratelimit_status always;
    }
--- user_files
>>> htpasswd
user:{PLAIN}pass
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- more_headers eval
["", "Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic dXNlcjp3cm9uZw==", ""]
--- error_code eval
[401, 200, 401, 401]
--- response_headers eval
["X-RL: PASSED\nWWW-Authenticate: Basic realm=\"rl\"\nRateLimit-Limit: 5\nRateLimit-Remaining: 4",
 "X-RL: PASSED\n!WWW-Authenticate\nRateLimit-Remaining: 3",
 "X-RL: PASSED\nWWW-Authenticate: Basic realm=\"rl\"\nRateLimit-Remaining: 2",
 "X-RL: PASSED\nRateLimit-Remaining: 1"]
--- response_body_like eval
[qr/401 Authorization Required/, qr/^ok$/, qr/401 Authorization Required/, qr/401/]
--- rl_redis_check
ZCARD rl:api:a => 4
--- rl_error_log
password mismatch



=== TEST 2: satisfy any + auth_basic: once the limit is used up, 429 with or without credentials
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s clock=nginx;
--- config
    location /t {
        satisfy any;
        ratelimit api;
        auth_basic "rl";
        auth_basic_user_file $TEST_NGINX_HTML_DIR/htpasswd;
        add_header X-RL $ratelimit_status always;
    }
--- user_files
>>> htpasswd
user:{PLAIN}pass
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- more_headers eval
["", "Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic dXNlcjpwYXNz", ""]
--- error_code eval
[401, 200, 429, 429]
--- response_headers_like eval
["X-RL: PASSED",
 "X-RL: PASSED",
 "X-RL: REJECTED\n!WWW-Authenticate\nRateLimit-Remaining: 0\nRetry-After: (9|10)",
 "X-RL: REJECTED(_CACHED)?\n!WWW-Authenticate\nRateLimit-Remaining: 0\nRetry-After: (9|10)"]
--- rl_redis_check
ZCARD rl:api:a => 2



=== TEST 3: satisfy any + allow: admitted and allowed without credentials; used up: 429 although allow matches
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s clock=nginx;
--- config
    location /t {
        satisfy any;
        ratelimit api;
        allow 127.0.0.1;
        deny all;
        auth_basic "rl";
        auth_basic_user_file $TEST_NGINX_HTML_DIR/htpasswd;
        add_header X-RL $ratelimit_status always;
    }
--- user_files
>>> htpasswd
user:{PLAIN}pass
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=b"]
--- more_headers eval
["", "", "", "Authorization: Basic dXNlcjpwYXNz", ""]
--- error_code eval
[200, 200, 429, 429, 200]
--- response_headers_like eval
["X-RL: PASSED\n!WWW-Authenticate", "X-RL: PASSED", "X-RL: REJECTED", "X-RL: REJECTED(_CACHED)?",
 "X-RL: PASSED"]
--- rl_redis_check
ZCARD rl:api:a => 2
ZCARD rl:api:b => 1



=== TEST 4: satisfy any + deny all + auth_basic: credentials pass, none 401, used up 429
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s clock=nginx;
--- config
    location /t {
        satisfy any;
        ratelimit api;
        deny all;
        auth_basic "rl";
        auth_basic_user_file $TEST_NGINX_HTML_DIR/htpasswd;
        add_header X-RL $ratelimit_status always;
    }
    location /u {
        satisfy any;
        ratelimit api;
        deny all;
        add_header X-RL $ratelimit_status always;
    }
--- user_files
>>> htpasswd
user:{PLAIN}pass
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /u?k=b", "GET /u?k=b", "GET /u?k=b"]
--- more_headers eval
["", "Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic dXNlcjpwYXNz", "", "", ""]
--- error_code eval
[401, 200, 429, 403, 403, 429]
--- response_headers eval
["X-RL: PASSED", "X-RL: PASSED", "X-RL: REJECTED", "X-RL: PASSED", "X-RL: PASSED",
 "X-RL: REJECTED"]
--- rl_redis_check
ZCARD rl:api:a => 2
ZCARD rl:api:b => 2
--- rl_error_log
access forbidden by rule



=== TEST 5: satisfy all: allow and auth_basic must both pass, and a 429 comes first
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=3 window=10s clock=nginx;
--- config
    location /t {
        satisfy all;
        ratelimit api;
        allow 127.0.0.1;
        deny all;
        auth_basic "rl";
        auth_basic_user_file $TEST_NGINX_HTML_DIR/htpasswd;
        add_header X-RL $ratelimit_status always;
    }
    location /u {
        ratelimit api;
        deny all;
        auth_basic "rl";
        auth_basic_user_file $TEST_NGINX_HTML_DIR/htpasswd;
        add_header X-RL $ratelimit_status always;
    }
--- user_files
>>> htpasswd
user:{PLAIN}pass
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=a",
 "GET /u?k=b", "GET /u?k=b", "GET /u?k=b", "GET /u?k=b"]
--- more_headers eval
["", "Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic dXNlcjp3cm9uZw==",
 "Authorization: Basic dXNlcjpwYXNz",
 "Authorization: Basic dXNlcjpwYXNz", "", "", "Authorization: Basic dXNlcjpwYXNz"]
--- error_code eval
[401, 200, 401, 429, 403, 403, 403, 429]
--- response_headers eval
["X-RL: PASSED", "X-RL: PASSED", "X-RL: PASSED", "X-RL: REJECTED",
 "X-RL: PASSED", "X-RL: PASSED", "X-RL: PASSED", "X-RL: REJECTED"]
--- rl_redis_check
ZCARD rl:api:a => 3
ZCARD rl:api:b => 3
--- rl_error_log
password mismatch
access forbidden by rule



=== TEST 6: satisfy any + auth_request: 204 lets in, 401 keeps out, a 429 ends the request before the subrequest
--- skip_eval: 1: !main::nginx_has('http_auth_request_module')
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s clock=nginx;
    log_format auth 'AUTH $request_uri $status';
--- config
    location /t {
        satisfy any;
        ratelimit api;
        auth_request /auth;
        add_header X-RL $ratelimit_status always;
    }
    location = /auth {
        internal;
        log_subrequest on;
        access_log logs/access.log auth;
        if ($http_x_pass) { return 204; }
        return 401;
    }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- more_headers eval
["", "X-Pass: 1", "X-Pass: 1", ""]
--- error_code eval
[401, 200, 429, 429]
--- response_headers_like eval
["X-RL: PASSED", "X-RL: PASSED", "X-RL: REJECTED", "X-RL: REJECTED(_CACHED)?"]
--- rl_redis_check
ZCARD rl:api:a => 2
--- rl_access_log eval
# Exactly two auth subrequests: the rejected requests never asked.
[qr/\A(?:(?!AUTH )[^\n]*\n)*AUTH \/t\?k=a 401\n(?:(?!AUTH )[^\n]*\n)*AUTH \/t\?k=a 204\n(?:(?!AUTH )[^\n]*\n)*\z/]



=== TEST 7: satisfy any + allow + auth_request: allow lets in whatever auth_request says; 429 still ends it
--- skip_eval: 1: !main::nginx_has('http_auth_request_module')
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s clock=nginx;
--- config
    location /t {
        satisfy any;
        ratelimit api;
        allow 127.0.0.1;
        deny all;
        auth_request /auth;
        add_header X-RL $ratelimit_status always;
    }
    location = /auth { internal; return 401; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 429]
--- response_headers eval
["X-RL: PASSED", "X-RL: PASSED", "X-RL: REJECTED"]
--- rl_redis_check
ZCARD rl:api:a => 2



=== TEST 8: satisfy all + auth_request: a refused subrequest after an admission is counted
--- skip_eval: 1: !main::nginx_has('http_auth_request_module')
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s clock=nginx;
--- config
    location /t {
        ratelimit api;
        auth_request /auth;
        add_header X-RL $ratelimit_status always;
    }
    location = /auth {
        internal;
        if ($http_x_pass) { return 204; }
        return 401;
    }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- more_headers eval
["", "X-Pass: 1", "X-Pass: 1"]
--- error_code eval
[401, 200, 429]
--- rl_redis_check
ZCARD rl:api:a => 2



=== TEST 9: the README's caveat: ratelimit_status 401 under satisfy any is overruled by valid credentials
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t {
        satisfy any;
        ratelimit api;
        ratelimit_status 401;
        auth_basic "rl";
        auth_basic_user_file $TEST_NGINX_HTML_DIR/htpasswd;
        add_header X-RL $ratelimit_status always;
    }
    location /u {
        satisfy all;
        ratelimit api;
        ratelimit_status 401;
        auth_basic "rl";
        auth_basic_user_file $TEST_NGINX_HTML_DIR/htpasswd;
        add_header X-RL $ratelimit_status always;
    }
--- user_files
>>> htpasswd
user:{PLAIN}pass
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a", "GET /u?k=a"]
--- more_headers eval
["Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic dXNlcjpwYXNz", "",
 "Authorization: Basic dXNlcjpwYXNz"]
--- error_code eval
[200, 200, 401, 401]
--- response_headers_like eval
["X-RL: PASSED", "X-RL: REJECTED", "X-RL: REJECTED(_CACHED)?", "X-RL: REJECTED(_CACHED)?"]
--- rl_redis_check
ZCARD rl:api:a => 1



=== TEST 10: Redis down under satisfy any: open leaves the decision to auth_basic, closed ends it with 503
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_DEAD_PORT timeout=1s;
    ratelimit_zone api key=$arg_k limit=2 window=10s;
--- config
    location /t {
        satisfy any;
        ratelimit api;
        ratelimit_fail open;
        auth_basic "rl";
        auth_basic_user_file $TEST_NGINX_HTML_DIR/htpasswd;
        add_header X-RL $ratelimit_status always;
    }
    location /u {
        satisfy any;
        ratelimit api;
        ratelimit_fail closed;
        allow 127.0.0.1;
        auth_basic "rl";
        auth_basic_user_file $TEST_NGINX_HTML_DIR/htpasswd;
        add_header X-RL $ratelimit_status always;
    }
--- user_files
>>> htpasswd
user:{PLAIN}pass
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /u?k=a", "GET /u?k=a"]
--- more_headers eval
["", "Authorization: Basic dXNlcjpwYXNz", "", "Authorization: Basic dXNlcjpwYXNz"]
--- error_code eval
[401, 200, 503, 503]
--- response_headers eval
["X-RL: FAILED_OPEN", "X-RL: FAILED_OPEN", "X-RL: FAILED_CLOSED", "X-RL: FAILED_CLOSED"]
--- rl_error_log eval
[qr/\[error\] .*ratelimit: /]



=== TEST 11: satisfy any with an empty key: SKIPPED, auth_basic alone decides
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t {
        satisfy any;
        ratelimit api;
        auth_basic "rl";
        auth_basic_user_file $TEST_NGINX_HTML_DIR/htpasswd;
        add_header X-RL $ratelimit_status always;
    }
--- user_files
>>> htpasswd
user:{PLAIN}pass
--- request eval
["GET /t", "GET /t", "GET /t"]
--- more_headers eval
["", "Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic dXNlcjpwYXNz"]
--- error_code eval
[401, 200, 200]
--- response_headers eval
["X-RL: SKIPPED", "X-RL: SKIPPED", "X-RL: SKIPPED"]
--- rl_redis_check
DBSIZE => 0

# Limiting, headers, inheritance, keys: the behaviour a user sees first.
use lib 't/lib';
use RLTest;

run_tests();

__DATA__




=== TEST 1: limit 2, the third request is rejected with honest headers
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s clock=nginx;
--- config
    location /t { ratelimit api; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 429]
--- response_headers_like eval
["RateLimit-Limit: 2\nRateLimit-Remaining: 1\n!Retry-After\nRateLimit-Reset: (9|10)",
 "RateLimit-Limit: 2\nRateLimit-Remaining: 0\n!Retry-After\nRateLimit-Reset: (9|10)",
 "RateLimit-Limit: 2\nRateLimit-Remaining: 0\nRateLimit-Reset: (9|10)\nRetry-After: (9|10)"]
--- response_body_like eval
[qr/^ok$/, qr/^ok$/, qr/429 Too Many Requests/]
--- rl_redis_check
ZCARD rl:api:a => 2
ZRANGE rl:api:a 0 -1 =~ ^[0-9]{16} [0-9]{16}$
PTTL rl:api:a =~ ^(9\d{3}|10000)$
DBSIZE => 1
--- rl_error_log eval
qr/\[error\] .*ratelimit: /



=== TEST 2: keys are independent
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; }
--- request eval
["GET /t?k=a", "GET /t?k=b", "GET /t?k=a", "GET /t?k=c"]
--- error_code eval
[200, 200, 429, 200]
--- rl_redis_check
ZCARD rl:api:a => 1
ZCARD rl:api:b => 1
ZCARD rl:api:c => 1



=== TEST 3: the default clock is Redis TIME and behaves the same
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s;
--- config
    location /t { ratelimit api; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 429]
--- response_headers_like eval
[undef, undef, "Retry-After: ^(9|10)\$"]
--- rl_redis_check
ZCARD rl:api:a => 2



=== TEST 4: ratelimit_status
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; ratelimit_status 503; }
--- request eval
["GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 503]
--- response_headers_like eval
[undef, "Retry-After: ^(9|10)\$"]
--- response_body_like eval
[undef, qr/503 Service/]



=== TEST 5: draft headers
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s clock=nginx;
--- config
    location /t { ratelimit api; ratelimit_headers draft; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 429]
--- response_headers_like eval
["RateLimit-Policy: \"api\";q=2;w=10\n!RateLimit-Limit\n!RateLimit-Remaining\n!RateLimit-Reset\n!Retry-After\nRateLimit: \"api\";r=1;t=(9|10)",
 "RateLimit-Policy: \"api\";q=2;w=10\n!Retry-After\nRateLimit: \"api\";r=0;t=(9|10)",
 "RateLimit-Policy: \"api\";q=2;w=10\n!RateLimit-Limit\nRateLimit: \"api\";r=0;t=(9|10)\nRetry-After: (9|10)"]



=== TEST 6: draft policy window in seconds for window=1m
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone minute key=$arg_k limit=100 window=1m clock=nginx;
--- config
    location /t { ratelimit minute; ratelimit_headers draft; }
--- request
GET /t?k=a
--- error_code: 200
--- response_headers_like eval
"RateLimit-Policy: \"minute\";q=100;w=60\nRateLimit: \"minute\";r=99;t=(59|60)"



=== TEST 7: headers off, but a rejection still says when to retry
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; ratelimit_headers off; }
--- request eval
["GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 429]
--- response_headers_like eval
["!RateLimit-Limit\n!RateLimit-Remaining\n!RateLimit-Reset\n!RateLimit-Policy\n!RateLimit",
 "!RateLimit-Limit\n!RateLimit-Policy\n!RateLimit\nRetry-After: (9|10)"]



=== TEST 8: http-level ratelimit is inherited; off switches it off
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
    ratelimit api;
--- config
    location /t { }
    location /u { ratelimit off; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /u?k=a", "GET /u?k=a", "GET /u?k=b"]
--- error_code eval
[200, 429, 200, 200, 200]
--- response_headers eval
["RateLimit-Limit: 1", "RateLimit-Limit: 1", "!RateLimit-Limit", "!RateLimit-Limit", "!RateLimit-Limit"]
--- rl_redis_check
ZCARD rl:api:a => 1
EXISTS rl:api:b => 0



=== TEST 9: server-level ratelimit is inherited; a location may pick another zone
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
    ratelimit_zone other key=$arg_k limit=3 window=10s clock=nginx;
--- config
    ratelimit api;
    location /t { }
    location /u { ratelimit other; }
--- request eval
["GET /t?k=a", "GET /t?k=a", "GET /u?k=a", "GET /u?k=a"]
--- error_code eval
[200, 429, 200, 200]
--- response_headers eval
["RateLimit-Limit: 1", "RateLimit-Limit: 1", "RateLimit-Limit: 3", "RateLimit-Remaining: 1"]
--- rl_redis_check
ZCARD rl:api:a => 1
ZCARD rl:other:a => 2



=== TEST 10: an empty key is not limited
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
--- request eval
["GET /t", "GET /t", "GET /t?k=", "GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 200, 200, 200, 429]
--- response_headers eval
["X-RL: SKIPPED", "X-RL: SKIPPED", "X-RL: SKIPPED", "X-RL: PASSED", "X-RL: REJECTED"]
--- rl_redis_check
DBSIZE => 1
ZCARD rl:api:a => 1



=== TEST 11: a key that is one variable alone, in braces, or a regex capture
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone braces key=${arg_k} limit=1 window=10s clock=nginx;
    ratelimit_zone capture key=$1 limit=1 window=10s clock=nginx;
--- config
    location /b { ratelimit braces; add_header X-RL $ratelimit_status always; try_files /index.html =404; }
    location ~ ^/c/(\w+)$ {
        ratelimit capture;
        add_header X-RL $ratelimit_status always;
        try_files /index.html =404;
    }
--- request eval
["GET /b?k=a", "GET /b?k=a", "GET /b", "GET /c/x", "GET /c/x", "GET /c/y"]
--- error_code eval
[200, 429, 200, 200, 429, 200]
--- response_headers eval
["X-RL: PASSED", "X-RL: REJECTED", "X-RL: SKIPPED", "X-RL: PASSED", "X-RL: REJECTED", "X-RL: PASSED"]
--- rl_redis_check
DBSIZE => 3
ZCARD rl:braces:a => 1
ZCARD rl:capture:x => 1
ZCARD rl:capture:y => 1



=== TEST 12: a key longer than 4 KiB is stored as its SHA-1
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$http_x_key limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; }
--- request eval
["GET /t", "GET /t"]
--- more_headers eval
"X-Key: " . ("k" x 5000)
--- error_code eval
[200, 429]
--- rl_redis_check eval
use Digest::SHA 'sha1_hex';
["KEYS * => rl:api:" . sha1_hex("k" x 5000), "ZCARD rl:api:" . sha1_hex("k" x 5000) . " => 1"]



=== TEST 13: a key of exactly 4096 bytes is kept as it is, 4097 is hashed
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$http_x_key limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; }
--- request eval
["GET /t", "GET /t"]
--- more_headers eval
["X-Key: " . ("k" x 4096), "X-Key: " . ("k" x 4097)]
--- error_code eval
[200, 200]
--- rl_redis_check eval
use Digest::SHA 'sha1_hex';
["EXISTS rl:api:" . ("k" x 4096) . " => 1", "EXISTS rl:api:" . sha1_hex("k" x 4097) . " => 1",
 "DBSIZE => 2"]



=== TEST 14: binary and composite keys, custom prefix
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT prefix=test:;
    ratelimit_zone ip key=$binary_remote_addr limit=5 window=10s clock=nginx;
    ratelimit_zone hk "key=$host:$arg_k" limit=5 window=10s clock=nginx;
--- config
    location /t { ratelimit ip; }
    location /u { ratelimit hk; }
--- request eval
["GET /t", "GET /u?k=a"]
--- error_code eval
[200, 200]
--- rl_redis_check
EXISTS "test:ip:\x7f\x00\x00\x01" => 1
EXISTS test:hk:localhost:a => 1
DBSIZE => 2



=== TEST 15: rejections are logged at ratelimit_log_level
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; ratelimit_log_level warn; }
--- request eval
["GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 429]
--- rl_error_log eval
qr/\[warn\] .*ratelimit: .*api/
--- no_error_log
[error]



=== TEST 16: rejections below the error_log level are not logged
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; ratelimit_log_level info; }
--- log_level: notice
--- request eval
["GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 429]
--- no_error_log
ratelimit:



=== TEST 17: an allowed request is not NGX_OK: satisfy any still needs deny to pass
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=5 window=10s clock=nginx;
--- config
    location /t { satisfy any; ratelimit api; deny all; }
--- request
GET /t?k=a
--- error_code: 403



=== TEST 18: satisfy any with auth_basic: credentials still required
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=5 window=10s clock=nginx;
--- config
    location /t {
        satisfy any;
        ratelimit api;
        deny all;
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



=== TEST 19: satisfy all: limiting and access rules both apply
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=1 window=10s clock=nginx;
--- config
    location /t { ratelimit api; allow 127.0.0.1; deny all; }
--- request eval
["GET /t?k=a", "GET /t?k=a"]
--- error_code eval
[200, 429]



=== TEST 20: HEAD and POST are limited like GET
--- http_config
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=2 window=10s clock=nginx;
--- config
    location /t { ratelimit api; }
--- request eval
["HEAD /t?k=a", "POST /t?k=a\nbody", "GET /t?k=a"]
--- error_code eval
[200, 405, 429]
--- rl_redis_check
ZCARD rl:api:a => 2

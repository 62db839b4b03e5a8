# Bad configurations, one row each: `nginx -t` must fail, at [emerg], with a
# message that names the directive, the bad value and the place
# (nginx.conf:<line> of the offending line), so that a user can fix the
# line without reading the source.  (t/000-config.t has the first such
# checks; this table covers every directive's wrong forms.)
#
# A row is [what it checks, http{} lines, server{} lines, directive, value,
# never]:
# - `directive`: the directive name the message must contain;
# - `value`: a regex the message must match: the bad value as written (or,
#   for a missing or repeated parameter, the words that say so);
# - `never` (optional): a regex the output must not match (a secret);
# - the offending line is the one marked with `#<-` in the snippet (the
#   marker is a comment, nginx ignores it); the message must name
#   nginx.conf:<that line>.
#
# Rows by directive:
#   ratelimit_redis   bad port, port not a number, empty unix path; unknown
#                     parameter; parameter without "="; no address, a
#                     misspelt password or sentinel password, a password cut
#                     by a space, a URL with a password (none of them echoes
#                     the secret: unknown parameters are named without their
#                     value, lone words by position), user:password@host:port
#                     (says user= and password=); db=70000 (the range); pool_size=0/abc/5000;
#                     timeout=abc/0/-1s; connect_timeout=0; keepalive_timeout=abc;
#                     fail_threshold=0; fail_backoff=abc; empty password= or
#                     user= (and the other secret is not echoed); user=
#                     without password=; twice; in server{}; no argument
#                     name= declared twice (both places), a/b, empty
#   ratelimit_zone    redis= naming no ratelimit_redis (none named, another named)
#   ratelimit_zone    bad name (a/b, 65 characters); same name twice; unknown
#                     parameter (shown: a zone has no secret); a lone algorithm
#                     name; no key/limit/window (each named); limit_req's rate=,
#                     zone=one:10m and limit=10r/s (each says what to write);
#                     lease_time= above a quarter of the window, or above 1h;
#                     limit=0/-1/abc/1000000001/10r/s; window=0/abc/2y/-1s;
#                     clock=foo; algorithm=foo; burst=0/abc; burst= on a
#                     sliding_log (default) and a sliding_counter zone; in
#                     server{}
#   ratelimit         unknown zone (server and location); without
#                     ratelimit_redis; cost=abc/-1/1.5; foo=1; limit_req's
#                     zone=, burst=, burst=5 nodelay, nodelay; cost= twice;
#                     no argument; off with a
#                     parameter; the same zone twice at one level; off then a
#                     zone, a zone then off, at one level; three arguments
#                     a zone without redis= while every ratelimit_redis is
#                     named; delay= in a location whose zones are on two backends
#   ratelimit_fail    foo; twice
#   ratelimit_fail_local_share 0, abc
#   ratelimit_fail_local_size 8k, 2g, 1.5m; twice; in server{}
#   ratelimit_status  200, 600, abc; twice
#   ratelimit_zone exact_key=yes; member=foo; member=request_id with gcra; lease=some,
#   lease_time=0, lease_time= alone, lease= with member=request_id
#   ratelimit_zone algorithm=concurrency with window=, lease=, period=, burst=,
#                     member=, lease_time=500ms (below 1s), 1000y or abc,
#                     limit=100001 (not sent to the rate algorithms),
#                     lease_time=2s with timeout=1s; a concurrency zone used with cost=2
#   ratelimit_dry_run foo; twice
#   ratelimit_metrics_zone 8k; twice; ratelimit_metrics with an argument, without the zone
#   ratelimit_headers foo
#   ratelimit_log_level foo (and debug, which nginx has but the module does
#                     not offer)
#   ratelimit_deny_cache foo
#
# At the end a table (diag) of row -> nginx's message, for the README.
use lib 't/lib';
use RLTest;

my $R = 'ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;';
my $Z = 'ratelimit_zone api key=$arg_k limit=2 window=10s;';
my $G = 'ratelimit_zone g key=$arg_k limit=2 window=10s algorithm=gcra;';
sub zone { "$R\nratelimit_zone api key=\$arg_k $_[0]; #<-" }

my @rows = (
    # --- ratelimit_redis
    ['ratelimit_redis: port out of range', "ratelimit_redis 127.0.0.1:99999; #<-\n$Z", '',
        'ratelimit_redis', qr/99999/],
    ['ratelimit_redis: port not a number', "ratelimit_redis 127.0.0.1:abc; #<-\n$Z", '',
        'ratelimit_redis', qr/127\.0\.0\.1:abc/],
    ['ratelimit_redis: empty unix path', "ratelimit_redis unix:; #<-\n$Z", '',
        'ratelimit_redis', qr/"unix:"/],
    ['ratelimit_redis: unknown parameter (named, its value not shown)',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT foo=1; #<-\n$Z", '',
        'ratelimit_redis', qr/invalid parameter "foo=" \(value not shown\)/, qr/foo=1/],
    ['ratelimit_redis: parameter without = (taken for an address)',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT pool_size; #<-\n$Z", '',
        'ratelimit_redis', qr/"pool_size"/],
    ['ratelimit_redis: parameter without =, after a parameter',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT timeout=1s pool_size; #<-\n$Z", '',
        'ratelimit_redis', qr/"pool_size" \(not name=value\)/],
    ['ratelimit_redis: password= without an address (never echoed)',
        "ratelimit_redis password=S3cretPW; #<-\n$Z", '',
        'ratelimit_redis', qr/no address before "password=" \(value not shown\)/, qr/S3cret/],
    ['ratelimit_redis: misspelt passwrd= (never echoed)',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT passwrd=S3cretPW; #<-\n$Z", '',
        'ratelimit_redis', qr/invalid parameter "passwrd=" \(value not shown\)/, qr/S3cret/],
    ['ratelimit_redis: misspelt sentinel_passwrd= (never echoed)',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT sentinel=m sentinel_passwrd=S3cretPW; #<-\n$Z", '',
        'ratelimit_redis', qr/invalid parameter "sentinel_passwrd=" \(value not shown\)/, qr/S3cret/],
    ['ratelimit_redis: a password cut by a space (the rest never echoed)',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT password=S3cret PW2nd; #<-\n$Z", '',
        'ratelimit_redis', qr/invalid parameter #3 \(not name=value, not shown\)/, qr/S3cret|PW2nd/],
    ['ratelimit_redis: a Redis URL with a password (never echoed)',
        "ratelimit_redis redis://lim:S3cretPW\@127.0.0.1:6379; #<-\n$Z", '',
        'ratelimit_redis', qr/"\.\.\.\@127\.0\.0\.1:6379"/, qr/S3cret/],
    ['ratelimit_redis: user:password\@host:port (says where credentials go, never echoed)',
        "ratelimit_redis lim:S3cretPW\@127.0.0.1:6379; #<-\n$Z", '',
        'ratelimit_redis', qr/credentials in the address "\.\.\.\@127\.0\.0\.1:6379".*"user=" and "password="/, qr/S3cret/],
    ['ratelimit_redis: db=70000 (the range given)',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT db=70000; #<-\n$Z", '',
        'ratelimit_redis', qr/"db=70000".*must be 0\.\.65535/],
    ['ratelimit_redis: pool_size=0',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT pool_size=0; #<-\n$Z", '',
        'ratelimit_redis', qr/"pool_size=0"/],
    ['ratelimit_redis: pool_size=abc',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT pool_size=abc; #<-\n$Z", '',
        'ratelimit_redis', qr/"pool_size=abc"/],
    ['ratelimit_redis: pool_size=5000 (max 4096)',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT pool_size=5000; #<-\n$Z", '',
        'ratelimit_redis', qr/"pool_size=5000"/],
    ['ratelimit_redis: timeout=abc',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT timeout=abc; #<-\n$Z", '',
        'ratelimit_redis', qr/"timeout=abc"/],
    ['ratelimit_redis: timeout=0',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT timeout=0; #<-\n$Z", '',
        'ratelimit_redis', qr/"timeout=0"/],
    ['ratelimit_redis: timeout=-1s',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT timeout=-1s; #<-\n$Z", '',
        'ratelimit_redis', qr/"timeout=-1s"/],
    ['ratelimit_redis: connect_timeout=0',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT connect_timeout=0; #<-\n$Z", '',
        'ratelimit_redis', qr/"connect_timeout=0"/],
    ['ratelimit_redis: keepalive_timeout=abc',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT keepalive_timeout=abc; #<-\n$Z", '',
        'ratelimit_redis', qr/"keepalive_timeout=abc"/],
    ['ratelimit_redis: fail_threshold=0',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT fail_threshold=0; #<-\n$Z", '',
        'ratelimit_redis', qr/"fail_threshold=0"/],
    ['ratelimit_redis: fail_backoff=abc',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT fail_backoff=abc; #<-\n$Z", '',
        'ratelimit_redis', qr/"fail_backoff=abc"/],
    ['ratelimit_redis: empty password= (the secret is never echoed)',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT user=s3cr3tuser password=; #<-\n$Z", '',
        'ratelimit_redis', qr/"password"/, qr/s3cr3t/],
    ['ratelimit_redis: empty user= (the password is never echoed)',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT password=s3cr3t user=; #<-\n$Z", '',
        'ratelimit_redis', qr/"user"/, qr/s3cr3t/],
    ['ratelimit_redis: user= without password=',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT user=bob; #<-\n$Z", '',
        'ratelimit_redis', qr/user=.*password=/],
    ['ratelimit_redis: twice', "$R\nratelimit_redis 127.0.0.1:6380; #<-\n$Z", '',
        'ratelimit_redis', qr/is duplicate/],
    ['ratelimit_redis: in server{}', $Z, "ratelimit_redis 127.0.0.1:6380; #<-",
        'ratelimit_redis', qr/not allowed here/],
    ['ratelimit_redis: no argument', "ratelimit_redis; #<-\n$Z", '',
        'ratelimit_redis', qr/invalid number of arguments/],

    # --- several backends: name= and redis= (issue 34)
    ['ratelimit_redis: a name declared twice (the first place named too)',
        "$R\nratelimit_redis 127.0.0.1:6380 name=regional;\nratelimit_redis 127.0.0.1:6381 name=regional; #<-\n$Z", '',
        'ratelimit_redis', qr/name="regional" is declared twice, first in \S*nginx\.conf:\d+/],
    ['ratelimit_redis: an invalid name (a/b)',
        "$R\nratelimit_redis 127.0.0.1:6380 name=a/b; #<-\n$Z", '',
        'ratelimit_redis', qr{"name=a/b".*letters, digits}],
    ['ratelimit_redis: an empty name',
        "$R\nratelimit_redis 127.0.0.1:6380 name=; #<-\n$Z", '',
        'ratelimit_redis', qr/"name=".*letters, digits/],
    ['ratelimit_zone: redis= names no ratelimit_redis (the zone\'s place)',
        "$R\nratelimit_zone q key=\$arg_k limit=3 window=1m redis=foo; #<-", '',
        'ratelimit_zone', qr/"q": unknown "redis=foo": no "ratelimit_redis" has "name=foo"/],
    ['ratelimit_zone: redis= names no ratelimit_redis, another name declared',
        "$R\nratelimit_redis 127.0.0.1:6380 name=eu;\nratelimit_zone q key=\$arg_k limit=3 window=1m redis=us; #<-", '',
        'ratelimit_zone', qr/"q": unknown "redis=us": no "ratelimit_redis" has "name=us"/],
    ['ratelimit: a zone without redis= while every ratelimit_redis has a name',
        "ratelimit_redis 127.0.0.1:6380 name=eu;\n$Z", "location /t {\n ratelimit api; #<-\n}",
        'ratelimit', qr/"api" is used but its zone has no "redis=" and every "ratelimit_redis" has a "name="/],
    ['ratelimit: delay= in a location whose zones are on two backends',
        "$R\nratelimit_redis 127.0.0.1:6380 name=eu;\n$G\nratelimit_zone e key=\$arg_k limit=2 window=10s algorithm=gcra redis=eu;",
        "location /t {\n ratelimit e;\n ratelimit g delay=1s; #<-\n}",
        'ratelimit', qr/"g" may delay requests \(delay=\).*several Redis backends/],

    # --- ratelimit_zone
    ['ratelimit_zone: bad name', "$R\nratelimit_zone a/b key=\$arg_k limit=2 window=10s; #<-", '',
        'ratelimit_zone', qr/"a\/b"/],
    ['ratelimit_zone: name of 65 characters',
        "$R\nratelimit_zone " . ('n' x 65) . " key=\$arg_k limit=2 window=10s; #<-", '',
        'ratelimit_zone', qr/"n{65}"/],
    ['ratelimit_zone: same name twice',
        "$R\n$Z\nratelimit_zone api key=\$arg_x limit=5 window=1m; #<-", '',
        'ratelimit_zone', qr/duplicate zone "api"/],
    ['ratelimit_zone: unknown parameter (no secret: shown)',
        zone('limit=2 window=10s foo=bar'), '',
        'ratelimit_zone', qr/invalid parameter "foo=bar"/],
    ['ratelimit_zone: an algorithm without algorithm=', zone('limit=2 window=10s gcra'), '',
        'ratelimit_zone', qr/"gcra" \(not name=value\).*write "algorithm=gcra"/],
    ['ratelimit_zone: no key', "$R\nratelimit_zone api limit=2 window=10s; #<-", '',
        'ratelimit_zone', qr/"api": needs key=/],
    ['ratelimit_zone: no limit', zone('window=10s'), '',
        'ratelimit_zone', qr/"api": needs limit=/],
    ['ratelimit_zone: no window (period= and the windowless algorithms named)', zone('limit=2'), '',
        'ratelimit_zone', qr/"api": needs window=.*period=hour\|day\|week\|month.*algorithm=balance\|concurrency/],
    ['ratelimit_zone: limit_req\'s rate=10r/s', zone('rate=10r/s'), '',
        'ratelimit_zone', qr{invalid parameter "rate=10r/s".*write "limit=10 window=1s"}],
    ['ratelimit_zone: limit_req\'s rate=30r/m', zone('rate=30r/m'), '',
        'ratelimit_zone', qr{"rate=30r/m".*write "limit=30 window=1m"}],
    ['ratelimit_zone: limit_req_zone\'s zone=name:10m', zone('zone=one:10m limit=2 window=1s'), '',
        'ratelimit_zone', qr{"zone=one:10m".*first argument}],
    ['ratelimit_zone: lease_time= above a quarter of the window',
        zone('limit=100 window=4s lease=auto lease_time=5s'), '',
        'ratelimit_zone', qr/"lease_time=5s" is more than a quarter of the window \(4000ms\).*lease_time=1000ms or less/],
    ['ratelimit_zone: lease_time= beyond 1h', zone('limit=100 window=1d lease=auto lease_time=2h'), '',
        'ratelimit_zone', qr/"lease_time=2h" is too long, 1h at most/],
    ['ratelimit_zone: limit=0', zone('limit=0 window=10s'), '',
        'ratelimit_zone', qr/"limit=0"/],
    ['ratelimit_zone: limit=-1', zone('limit=-1 window=10s'), '',
        'ratelimit_zone', qr/"limit=-1"/],
    ['ratelimit_zone: limit=abc', zone('limit=abc window=10s'), '',
        'ratelimit_zone', qr/"limit=abc"/],
    ['ratelimit_zone: limit=1000000001 (max 10^9)', zone('limit=1000000001 window=10s'), '',
        'ratelimit_zone', qr/"limit=1000000001"/],
    ['ratelimit_zone: limit=100001 on a sliding_log (max 10^5)', zone('limit=100001 window=10s'), '',
        'ratelimit_zone', qr/limit=100001 .*keeps exactly \(100000/],
    ['ratelimit_zone: limit=10001 on a sliding_log_packed (max 10^4)',
        zone('limit=10001 window=10s algorithm=sliding_log_packed'), '',
        'ratelimit_zone', qr/limit=10001 .*keeps exactly \(10000/],
    ['ratelimit_zone: limit=10r/s (limit_req syntax)', zone('limit=10r/s window=10s'), '',
        'ratelimit_zone', qr{"limit=10r/s".*write "limit=10 window=1s"}],
    ['ratelimit_zone: window=0', zone('limit=2 window=0'), '',
        'ratelimit_zone', qr/"window=0"/],
    ['ratelimit_zone: window=abc', zone('limit=2 window=abc'), '',
        'ratelimit_zone', qr/"window=abc"/],
    ['ratelimit_zone: window=2y (max 1y)', zone('limit=2 window=2y'), '',
        'ratelimit_zone', qr/"window=2y"/],
    ['ratelimit_zone: window=-1s', zone('limit=2 window=-1s'), '',
        'ratelimit_zone', qr/"window=-1s"/],
    ['ratelimit_zone: clock=foo', zone('limit=2 window=10s clock=foo'), '',
        'ratelimit_zone', qr/"clock=foo"/],
    ['ratelimit_zone: algorithm=foo', zone('limit=2 window=10s algorithm=foo'), '',
        'ratelimit_zone', qr/"algorithm=foo"/],
    ['ratelimit_zone: burst=0', zone('limit=2 window=10s algorithm=gcra burst=0'), '',
        'ratelimit_zone', qr/"burst=0"/],
    ['ratelimit_zone: burst=abc', zone('limit=2 window=10s algorithm=gcra burst=abc'), '',
        'ratelimit_zone', qr/"burst=abc"/],
    ['ratelimit_zone: burst= without algorithm (sliding_log)', zone('limit=2 window=10s burst=5'), '',
        'ratelimit_zone', qr/burst=/],
    ['ratelimit_zone: burst= on sliding_counter',
        zone('limit=2 window=10s algorithm=sliding_counter burst=5'), '',
        'ratelimit_zone', qr/burst=/],
    ['ratelimit_zone: in server{}', "$R\n$Z", "ratelimit_zone o key=\$arg_k limit=2 window=10s; #<-",
        'ratelimit_zone', qr/not allowed here/],

    # --- ratelimit
    ['ratelimit: unknown zone (server)', "$R\n$Z", "ratelimit nope; #<-",
        'ratelimit', qr/"nope"/],
    ['ratelimit: unknown zone (location)', "$R\n$Z", "location /t {\n ratelimit nope; #<-\n}",
        'ratelimit', qr/"nope"/],
    ['ratelimit: without ratelimit_redis', $Z, "location /t {\n ratelimit api; #<-\n}",
        'ratelimit_redis', qr/"api"/],
    ['ratelimit: cost=abc', "$R\n$Z", "ratelimit api cost=abc; #<-",
        'ratelimit', qr/"cost=abc"/],
    ['ratelimit: cost=-1', "$R\n$Z", "ratelimit api cost=-1; #<-",
        'ratelimit', qr/"cost=-1"/],
    ['ratelimit: cost=1.5', "$R\n$Z", "ratelimit api cost=1.5; #<-",
        'ratelimit', qr/"cost=1\.5"/],
    ['ratelimit: unknown parameter (no secret: shown)', "$R\n$Z", "ratelimit api foo=bar; #<-",
        'ratelimit', qr/invalid parameter "foo=bar"/],
    ['ratelimit: limit_req\'s zone=', "$R\n$Z", "ratelimit zone=api; #<-",
        'ratelimit', qr/"zone=api".*named bare, write "ratelimit api;"/],
    ['ratelimit: limit_req\'s burst=', "$R\n$Z", "ratelimit api burst=5; #<-",
        'ratelimit', qr/"burst=5".*ratelimit_zone \.\.\. algorithm=gcra burst=6.*delay=TIME/],
    ['ratelimit: limit_req\'s burst=5 nodelay', "$R\n$Z", "ratelimit api burst=5 nodelay; #<-",
        'ratelimit', qr/"burst=5".*algorithm=gcra burst=6/],
    ['ratelimit: limit_req\'s nodelay', "$R\n$Z", "ratelimit api nodelay; #<-",
        'ratelimit', qr/"nodelay".*at once unless its line says "delay=TIME".*remove it/],
    ['ratelimit: limit_req\'s delay=8 (a count there)', "$R\n$Z", "ratelimit api delay=8; #<-",
        'ratelimit', qr/"delay=8".*a time such as "delay=2s".*burst= with algorithm=gcra/],
    ['ratelimit: delay=2h', "$R\n$Z", "ratelimit api delay=2h; #<-",
        'ratelimit', qr/"delay=2h".*the longest delay is 1h/],
    ['ratelimit: delay=soon', "$R\n$Z", "ratelimit api delay=soon; #<-",
        'ratelimit', qr/"delay=soon".*write a time/],
    ['ratelimit: delay= twice', "$R\n$Z", "ratelimit api delay=1s delay=2s; #<-",
        'ratelimit', qr/duplicate parameter "delay=2s"/],
    ['ratelimit: cost= twice', "$R\n$Z", "ratelimit api cost=1 cost=2; #<-",
        'ratelimit', qr/duplicate parameter "cost=2"/],
    ['ratelimit: off with a parameter', "$R\n$Z", "ratelimit off cost=1; #<-",
        'ratelimit', qr/"cost=1"/],
    ['ratelimit: same zone twice at one level', "$R\n$Z", "ratelimit api;\nratelimit api; #<-",
        'ratelimit', qr/is duplicate/],
    ['ratelimit: off, then a zone, at one level', "$R\n$Z", "ratelimit off;\nratelimit api; #<-",
        'ratelimit', qr/is duplicate/],
    ['ratelimit: a zone, then off, at one level', "$R\n$Z", "ratelimit api;\nratelimit off; #<-",
        'ratelimit', qr/is duplicate/],
    ['ratelimit: three arguments', "$R\n$Z", "ratelimit api cost=1 x; #<-",
        'ratelimit', qr/invalid parameter "x" \(not name=value\)/],
    ['ratelimit: no argument', "$R\n$Z", "ratelimit; #<-",
        'ratelimit', qr/invalid number of arguments/],

    # --- the location-level keyword and number directives
    ['ratelimit_fail foo', "$R\n$Z", "ratelimit_fail foo; #<-",
        'ratelimit_fail', qr/"foo"/],
    ['ratelimit_fail_local_share 0', "$R\n$Z", "ratelimit_fail_local_share 0; #<-",
        'ratelimit_fail_local_share', qr/"0"/],
    ['ratelimit_fail_local_share abc', "$R\n$Z", "ratelimit_fail_local_share abc; #<-",
        'ratelimit_fail_local_share', qr/"abc"/],
    ['ratelimit_fail twice', "$R\n$Z", "ratelimit_fail open;\nratelimit_fail closed; #<-",
        'ratelimit_fail', qr/is duplicate/],
    ['ratelimit_fail_local_size 8k', "$R\n$Z\nratelimit_fail_local_size 8k; #<-", '',
        'ratelimit_fail_local_size', qr/"8k"/],
    ['ratelimit_fail_local_size 2g', "$R\n$Z\nratelimit_fail_local_size 2g; #<-", '',
        'ratelimit_fail_local_size', qr/"2g"/],
    ['ratelimit_fail_local_size 1.5m', "$R\n$Z\nratelimit_fail_local_size 1.5m; #<-", '',
        'ratelimit_fail_local_size', qr/"1\.5m"/],
    ['ratelimit_fail_local_size twice', "$R\n$Z\nratelimit_fail_local_size 1m;\nratelimit_fail_local_size 2m; #<-", '',
        'ratelimit_fail_local_size', qr/is duplicate/],
    ['ratelimit_fail_local_size in server{}', "$R\n$Z", "ratelimit_fail_local_size 1m; #<-",
        'ratelimit_fail_local_size', qr/not allowed here/],
    ['ratelimit_status 200', "$R\n$Z", "ratelimit_status 200; #<-",
        'ratelimit_status', qr/"200"/],
    ['ratelimit_status 600', "$R\n$Z", "ratelimit_status 600; #<-",
        'ratelimit_status', qr/"600"/],
    ['ratelimit_status abc', "$R\n$Z", "ratelimit_status abc; #<-",
        'ratelimit_status', qr/"abc"/],
    ['ratelimit_status twice', "$R\n$Z", "ratelimit_status 429;\nratelimit_status 503; #<-",
        'ratelimit_status', qr/is duplicate/],
    ['ratelimit_headers foo', "$R\n$Z", "ratelimit_headers foo; #<-",
        'ratelimit_headers', qr/"foo"/],
    ['ratelimit_log_level foo', "$R\n$Z", "ratelimit_log_level foo; #<-",
        'ratelimit_log_level', qr/"foo"/],
    ['ratelimit_log_level debug', "$R\n$Z", "ratelimit_log_level debug; #<-",
        'ratelimit_log_level', qr/"debug"/],
    ['ratelimit_deny_cache foo', "$R\n$Z", "ratelimit_deny_cache foo; #<-",
        'ratelimit_deny_cache', qr/"foo"/],
    ['ratelimit_dry_run foo', "$R\n$Z", "ratelimit_dry_run foo; #<-",
        'ratelimit_dry_run', qr/"foo"/],
    ['ratelimit_zone: exact_key=yes', zone('limit=2 window=10s exact_key=yes'), '',
        'ratelimit_zone', qr/"exact_key=yes"/],
    ['ratelimit_zone: member=foo', zone('limit=2 window=10s member=foo'), '',
        'ratelimit_zone', qr/"member=foo"/],
    ['ratelimit_zone: member=request_id with gcra', zone('limit=2 window=10s algorithm=gcra member=request_id'), '',
        'ratelimit_zone', qr/needs algorithm=sliding_log/],
    ['ratelimit_zone: lease=some', zone('limit=2 window=10s lease=some'), '',
        'ratelimit_zone', qr/"lease=some"/],
    ['ratelimit_zone: lease_time=0', zone('limit=2 window=10s lease=auto lease_time=0'), '',
        'ratelimit_zone', qr/"lease_time=0"/],
    ['ratelimit_zone: lease_time= without lease=', zone('limit=2 window=10s lease_time=1s'), '',
        'ratelimit_zone', qr/"lease_time=" needs "lease="/],
    ['ratelimit_zone: lease= with member=request_id', zone('limit=2 window=10s lease=auto member=request_id'), '',
        'ratelimit_zone', qr/cannot reserve with "member=request_id"/],
    ['concurrency: window=', zone('limit=5 algorithm=concurrency window=10s'), '',
        'ratelimit_zone', qr/"window=" is not for algorithm=concurrency/],
    ['concurrency: lease=', zone('limit=5 algorithm=concurrency lease=auto'), '',
        'ratelimit_zone', qr/"lease=" is not for algorithm=concurrency/],
    ['concurrency: period=', zone('limit=5 algorithm=concurrency period=day'), '',
        'ratelimit_zone', qr/"period=" is not for algorithm=concurrency/],
    ['concurrency: lease_time=500ms', zone('limit=5 algorithm=concurrency lease_time=500ms'), '',
        'ratelimit_zone', qr/"lease_time=500ms" is too short/],
    ['concurrency: lease_time=abc', zone('limit=5 algorithm=concurrency lease_time=abc'), '',
        'ratelimit_zone', qr/"lease_time=abc"/],
    ['concurrency: burst=', zone('limit=5 algorithm=concurrency burst=3'), '',
        'ratelimit_zone', qr/"burst=" is not for algorithm=concurrency/],
    ['concurrency: member=', zone('limit=5 algorithm=concurrency member=request_id'), '',
        'ratelimit_zone', qr/"member=" is not for algorithm=concurrency/],
    ['concurrency: limit=100001', zone('limit=100001 algorithm=concurrency'), '',
        'ratelimit_zone', qr/"limit=100001" is more than algorithm=concurrency holds, 100000 requests in flight/, qr/sliding_counter|gcra/],
    ['concurrency: lease_time=1000y (1h at most)', zone('limit=5 algorithm=concurrency lease_time=1000y'), '',
        'ratelimit_zone', qr/"lease_time=1000y" is too long, 1h at most/],
    ['concurrency: lease_time under 3 x (timeout + 100ms)',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT timeout=1s;\nratelimit_zone api key=\$arg_k limit=5 algorithm=concurrency lease_time=2s; #<-", '',
        'ratelimit_zone', qr/"lease_time=2000ms" is too short for "timeout=1000ms".*3300ms/],
    ['concurrency: cost=2', "$R\nratelimit_zone c key=\$arg_k limit=5 algorithm=concurrency;",
        "location /c { ratelimit c cost=2; #<-\n}", 'ratelimit', qr/"c" is a concurrency zone: .*cost= must be 1/],
    ['settle= on a concurrency zone', "$R\nratelimit_zone c key=\$arg_k limit=5 algorithm=concurrency;",
        "location /c { ratelimit c settle=\$arg_u; #<-\n}", 'ratelimit', qr/"c" is a concurrency zone: a request holds a slot, it spends nothing to settle; remove settle=/],
    ['settle= on a zone with lease=', "$R\nratelimit_zone l key=\$arg_k limit=50 window=1s lease=auto;",
        "location /l { ratelimit l settle=\$arg_u; #<-\n}", 'ratelimit', qr/"l" has lease=: .*remove lease= from the zone or settle= from this line/],
    ['settle= on a log with member=', "$R\nratelimit_zone m key=\$arg_k limit=5 window=1s member=request_id;",
        "location /m { ratelimit m settle=\$arg_u; #<-\n}", 'ratelimit', qr/"m" is a sliding_log with member=.*remove member= or settle=/],
    ['settle= with cost=0', "$R\n$Z", "location /z { ratelimit api cost=0 settle=\$arg_u; #<-\n}",
        'ratelimit', qr/"api" has cost=0 with settle=: an estimate of nothing places nothing/],
    ['settle= empty', "$R\n$Z", "ratelimit api settle=; #<-", 'ratelimit', qr/invalid value "settle="/],
    ['settle= twice', "$R\n$Z", "ratelimit api settle=\$arg_a settle=\$arg_b; #<-", 'ratelimit', qr/duplicate parameter "settle=\$arg_b"/],
    ['delay= on a concurrency zone', "$R\nratelimit_zone c key=\$arg_k limit=5 algorithm=concurrency;",
        "location /c { ratelimit c delay=1s; #<-\n}", 'ratelimit', qr/"c" is a concurrency zone, whose slots have no known end: a request cannot wait for it, remove delay=/],
    ['delay= on a balance zone', "$R\nratelimit_zone b key=\$arg_k limit=1 algorithm=balance;",
        "location /b { ratelimit b delay=1s; #<-\n}", 'ratelimit', qr/"b" is a balance zone, which nothing refills by time: .*remove delay=/],
    ['delay= beside a balance zone', "$R\n$Z\nratelimit_zone b key=\$arg_k limit=1 algorithm=balance;",
        "location /b { ratelimit api delay=1s;\n ratelimit b; #<-\n}", 'ratelimit', qr/"b" is a balance zone.*may wait for its turn in zone "api" \(delay=.*a location of its own/],
    ['a zone with delay= elsewhere beside a balance zone', "$R\n$Z\nratelimit_zone b key=\$arg_k limit=1 algorithm=balance;",
        "location /d { ratelimit api delay=1s; }\nlocation /b { ratelimit api;\n ratelimit b; #<-\n}", 'ratelimit', qr/"b" is a balance zone.*zone "api" \(delay= on a ratelimit line of it\)/],
    ['delay= on a log with member=', "$R\nratelimit_zone m key=\$arg_k limit=5 window=1s member=request_id;",
        "location /m { ratelimit m delay=1s; #<-\n}", 'ratelimit', qr/"m" is a sliding_log with member=.*remove delay=/],
    ['ratelimit_metrics_zone 8k', "$R\n$Z\nratelimit_metrics_zone 8k; #<-", '',
        'ratelimit_metrics_zone', qr/"8k"/],
    ['ratelimit_metrics_zone twice', "$R\n$Z\nratelimit_metrics_zone 64k;\nratelimit_metrics_zone 64k; #<-", '',
        'ratelimit_metrics_zone', qr/is duplicate/],
    ['ratelimit_metrics with an argument', "$R\n$Z", "location = /m { ratelimit_metrics on; } #<-",
        'ratelimit_metrics', qr/invalid number of arguments/],
    ['ratelimit_metrics without ratelimit_metrics_zone', "$R\n$Z", "location = /m { ratelimit_metrics; } #<-",
        'ratelimit_metrics', qr/needs "ratelimit_metrics_zone"/],
    ['ratelimit_dry_run twice', "$R\n$Z", "ratelimit_dry_run on;\nratelimit_dry_run off; #<-",
        'ratelimit_dry_run', qr/is duplicate/],
    ['65 zones in one location', join("\n", $R, map { "ratelimit_zone z$_ key=\$arg_k limit=5 window=1s;" } 1 .. 65),
        join("\n", 'location /many {', (map { "ratelimit z$_;" } 1 .. 64), 'ratelimit z65; #<-', '}'),
        'ratelimit', qr/"z65" is more than a location may name, 64 zones: one decision covers all of them/],
);

my @table;
for my $row (@rows) {
    my ($title, $http, $server, $directive, $value, $never) = @$row;
    my $indent = sub { join "\n", map { "    $_" } split /\n/, $_[0] };
    my ($rc, $out, $n) = nginx_t(http_config => $indent->($http),
        config => $indent->($indent->($server)));
    my $line = $n->line_of('#<-');
    my ($msg) = $out =~ /^.*\[emerg\] (.*)$/m;
    $msg //= '(no [emerg] line) ' . ($out =~ s/\s+/ /gr);
    my @fails;
    push @fails, 'nginx -t succeeded' if $rc == 0;
    push @fails, 'no [emerg]' unless $out =~ /\[emerg\]/;
    push @fails, "no $directive" unless $msg =~ /\Q$directive\E/;
    push @fails, "no $value" unless $msg =~ $value;
    push @fails, "not at nginx.conf:$line" unless defined $line && $msg =~ /nginx\.conf:$line\b/;
    push @fails, "echoes $never" if $never && $out =~ $never;
    ok(!@fails, "$title: refused, naming $directive, the value and nginx.conf:"
        . ($line // '?')) or diag(join('; ', @fails) . "\nnginx -t said:\n$out");
    push @table, [$title, $msg =~ s{ in \S*/(nginx\.conf:\d+)}{ in $1}r];
}

# The table of messages, for the README.
my $w = 0;
$w < length $_->[0] and $w = length $_->[0] for @table;
diag(sprintf "%-${w}s | %s", @$_) for ['row', 'nginx -t says'], ['-' x $w, '-' x 13], @table;

done_testing();

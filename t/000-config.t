# Configuration errors: `nginx -t` must refuse each bad line and say which
# directive, which value, and where (file:line), so that a user can fix it
# without reading the source.
use lib 't/lib';
use RLTest;

my $redis = 'ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;';
my $zone  = 'ratelimit_zone api key=$arg_k limit=2 window=10s;';

# [title, http_config, server config, directive, bad value (regex),
#  text of the offending line (its line number is expected), or undef]
my @bad = (
    ['unknown ratelimit_redis parameter',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT foo=1;\n$zone", '',
        'ratelimit_redis', qr/"foo="/, 'foo=1'],
    ['ratelimit_redis parameter without value',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT pool_size;\n$zone", '',
        'ratelimit_redis', qr/pool_size/, 'pool_size;'],
    ['bad timeout',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT timeout=abc;\n$zone", '',
        'ratelimit_redis', qr/abc/, 'timeout=abc'],
    ['pool_size=0',
        "ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT pool_size=0;\n$zone", '',
        'ratelimit_redis', qr/pool_size=0|"0"/, 'pool_size=0'],
    ['bad port',
        "ratelimit_redis 127.0.0.1:99999;\n$zone", '',
        'ratelimit_redis', qr/99999/, '99999'],
    ['ratelimit_redis twice',
        "$redis\nratelimit_redis 127.0.0.1:6380;\n$zone", '',
        'ratelimit_redis', qr/duplicate/, '127.0.0.1:6380'],
    ['limit=0',
        "$redis\nratelimit_zone api key=\$arg_k limit=0 window=10s;", '',
        'ratelimit_zone', qr/limit=0|"0"/, 'limit=0'],
    ['limit=abc',
        "$redis\nratelimit_zone api key=\$arg_k limit=abc window=10s;", '',
        'ratelimit_zone', qr/abc/, 'limit=abc'],
    ['window=5x',
        "$redis\nratelimit_zone api key=\$arg_k limit=2 window=5x;", '',
        'ratelimit_zone', qr/5x/, 'window=5x'],
    ['window=0',
        "$redis\nratelimit_zone api key=\$arg_k limit=2 window=0;", '',
        'ratelimit_zone', qr/window=0|"0"/, 'window=0'],
    ['unknown clock',
        "$redis\nratelimit_zone api key=\$arg_k limit=2 window=10s clock=sundial;", '',
        'ratelimit_zone', qr/sundial/, 'clock=sundial'],
    ['unknown zone parameter',
        "$redis\nratelimit_zone api key=\$arg_k limit=2 window=10s burst=5;", '',
        'ratelimit_zone', qr/burst/, 'burst=5'],
    ['zone without key',
        "$redis\nratelimit_zone api limit=2 window=10s;", '',
        'ratelimit_zone', qr/key/, 'ratelimit_zone api limit'],
    ['zone without limit',
        "$redis\nratelimit_zone api key=\$arg_k window=10s;", '',
        'ratelimit_zone', qr/limit/, 'ratelimit_zone api key'],
    ['zone defined twice',
        "$redis\n$zone\nratelimit_zone api key=\$arg_x limit=5 window=1m;", '',
        'ratelimit_zone', qr/"api"|api/, 'key=$arg_x'],
    ['ratelimit_zone in server context',
        "$redis\n$zone", "ratelimit_zone other key=\$arg_k limit=2 window=10s;",
        'ratelimit_zone', qr/not allowed here/, 'ratelimit_zone other'],
    ['unknown zone',
        "$redis\n$zone", "location /t { ratelimit nope; }",
        'ratelimit', qr/nope/, 'ratelimit nope'],
    ['ratelimit without ratelimit_redis',
        $zone, "location /t { ratelimit api; }",
        'ratelimit_redis', qr/ratelimit_redis/, 'ratelimit api;'],
    ['ratelimit_status 200',
        "$redis\n$zone", "ratelimit_status 200;",
        'ratelimit_status', qr/200/, 'ratelimit_status 200'],
    ['ratelimit_status 600',
        "$redis\n$zone", "ratelimit_status 600;",
        'ratelimit_status', qr/600/, 'ratelimit_status 600'],
    ['ratelimit_status abc',
        "$redis\n$zone", "ratelimit_status abc;",
        'ratelimit_status', qr/abc/, 'ratelimit_status abc'],
    ['ratelimit_fail maybe',
        "$redis\n$zone", "ratelimit_fail maybe;",
        'ratelimit_fail', qr/maybe/, 'ratelimit_fail maybe'],
    ['ratelimit_headers fancy',
        "$redis\n$zone", "ratelimit_headers fancy;",
        'ratelimit_headers', qr/fancy/, 'ratelimit_headers fancy'],
    ['ratelimit_log_level debug',
        "$redis\n$zone", "ratelimit_log_level debug;",
        'ratelimit_log_level', qr/debug/, 'ratelimit_log_level debug'],
);

for my $case (@bad) {
    my ($title, $http, $server, $directive, $value, $line_text) = @$case;
    my ($rc, $out, $n) = nginx_t(http_config => "    $http", config => "        $server");
    isnt($rc, 0, "$title: nginx -t fails");
    like($out, qr/\[emerg\]/, "$title: [emerg]");
    like($out, qr/\Q$directive\E/, "$title: names the directive $directive");
    like($out, $value, "$title: names the bad value");
    if (defined $line_text) {
        my $line = $n->line_of($line_text);
        like($out, qr/nginx\.conf:$line\b/, "$title: points at nginx.conf:$line");
    }
    diag("nginx -t said: $out") unless $out =~ /\Q$directive\E/ && $out =~ $value;
}

# Everything the issue lists, in every context it is allowed in.
my ($rc, $out) = nginx_t(
    http_config => <<'EOF',
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT pool_size=4 timeout=200ms
                    connect_timeout=100ms keepalive_timeout=60s prefix=test:;
    ratelimit_zone api    key=$http_x_consumer_id limit=100 window=1m;
    ratelimit_zone ip     key=$binary_remote_addr limit=10 window=1500ms clock=nginx;
    ratelimit_zone hostk  "key=$host:$arg_k" limit=1 window=1h clock=redis;
    ratelimit api;
    ratelimit_fail closed;
    ratelimit_status 503;
    ratelimit_headers draft;
    ratelimit_log_level notice;
EOF
    config => <<'EOF',
        ratelimit ip;
        ratelimit_fail open;
        ratelimit_status 429;
        ratelimit_headers legacy;
        ratelimit_log_level warn;
        location /a { ratelimit hostk; ratelimit_headers off; ratelimit_log_level info;
                      ratelimit_fail closed; ratelimit_status 599; }
        location /b { ratelimit off; }
        location /c { ratelimit_log_level error; ratelimit_status 400; }
EOF
);
is($rc, 0, 'a config with every directive passes nginx -t') or diag($out);
like($out, qr/test is successful/, 'nginx -t reports success');

# Zones may be declared after their first use, as with limit_req.
($rc, $out) = nginx_t(
    http_config => "    ratelimit api;\n    $redis\n    $zone",
    config => '        location /t { }',
);
is($rc, 0, 'a zone may be used before it is declared') or diag($out);

done_testing();

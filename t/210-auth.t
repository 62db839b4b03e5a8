# password= and user= on ratelimit_redis: AUTH on every new connection, a
# wrong password follows the fail policy and opens the breaker, and the
# secret never reaches the error log, not even at debug level.
use lib 't/lib';
use RLTest;

sub rl { header($_[0], 'X-RL') // '(none)' }

my $config = <<'EOF';
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
EOF
sub http_conf {
    my ($auth) = @_;
    return <<"EOF";
    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT $auth fail_threshold=2 fail_backoff=30s;
    ratelimit_zone api key=\$arg_k limit=2 window=10s;
EOF
}

redis_cmd('ACL', 'SETUSER', 'limiter', 'on', '>acl-S3cret', '~rl:*', '+@all');
redis_cmd('CONFIG', 'SET', 'requirepass', 'default-S3cret');

for my $case (['password=default-S3cret', 'default user'],
              ['user=limiter password=acl-S3cret', 'ACL user']) {
    my ($auth, $what) = @$case;
    start_nginx(http_config => http_conf($auth), config => $config, log_level => 'debug');
    my @st = map { rl(http_get('/t?k=' . $what =~ s/ /_/r)) } 1 .. 3;
    is("@st", 'PASSED PASSED REJECTED', "$what: limits as usual");
    ok(stop_nginx(), "$what: nginx quits gracefully");
    my $log = error_log_text();
    check_no_alerts($log, $what);
    unlike($log, qr/S3cret/, "$what: the password is not in the debug log");
}

start_nginx(http_config => http_conf('password=wrong-S3cret'), config => $config,
    log_level => 'debug');
my @st = map { rl(http_get("/t?k=w")) } 1 .. 6;
is("@st", join(' ', ('FAILED_OPEN') x 6), 'a wrong password: every request follows ratelimit_fail');
ok(stop_nginx(), 'nginx quits gracefully');
my $log = error_log_text();
like($log, qr/ratelimit: redis "127\.0\.0\.1:\d+" replied "WRONGPASS/, 'the refusal is logged');
like($log, qr/failed 2 times in a row, not asked until it answers a probe \(every 30000ms at most\)/, 'and opens the breaker');
unlike($log, qr/S3cret/, 'the wrong password is not logged either');
check_no_alerts($log, 'wrong password');

my ($rc, $out) = nginx_t(http_config => http_conf('user=limiter'), config => $config);
isnt($rc, 0, 'user= without password= fails nginx -t');
like($out, qr/"user=" of the "ratelimit_redis" directive needs "password=" in .*nginx\.conf:\d+/,
    'and says why, with file:line');
($rc, $out) = nginx_t(http_config => http_conf('password='), config => $config);
like($out, qr/invalid empty parameter "password" in "ratelimit_redis" directive/,
    'an empty password= is refused without echoing anything');

redis_cmd('CONFIG', 'SET', 'requirepass', '');
done_testing();

# db=N: SELECT on every new connection, right after AUTH and before anything
# else; its refusal (a number beyond Redis' `databases`) fails the
# connection, is logged and follows ratelimit_fail; nginx -t checks the range.
use lib 't/lib';
use RLTest;

sub rl { header($_[0], 'X-RL') // '(none)' }

my $config = <<'EOF';
    add_header X-RL $ratelimit_status always;
    location /t { ratelimit api; }
    location /u { ratelimit other; }
EOF
sub http_conf {
    my ($params) = @_;
    return <<"EOF";
    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT $params fail_threshold=2 fail_backoff=30s;
    ratelimit_zone api key=\$arg_k limit=2 window=10s;
    ratelimit_zone other key=\$arg_k limit=1 window=10s;
EOF
}
sub keys_in {
    my ($db) = @_;
    my $c = redis_client(name => 'rltest');
    $c->cmd('SELECT', $db);
    return join ' ', sort @{ $c->cmd('KEYS', '*') };
}

for my $case (['db=3', 3, 'db=3'], ['', 0, 'no db='],
              ['db=3 password=db-S3cret', 3, 'db=3 after AUTH']) {
    my ($params, $db, $what) = @$case;
    redis_cmd('FLUSHALL');
    redis_cmd('CONFIG', 'SET', 'requirepass', 'db-S3cret') if $params =~ /password/;
    start_nginx(http_config => http_conf($params), config => $config);
    my @st = (map({ rl(http_get('/t?k=a')) } 1 .. 3), map({ rl(http_get('/u?k=a')) } 1 .. 2));
    is("@st", 'PASSED PASSED REJECTED PASSED REJECTED', "$what: limits as usual");
    ok(stop_nginx(), "$what: nginx quits gracefully");
    if ($params =~ /password/) {
        redis_cmd('AUTH', 'db-S3cret');
        redis_cmd('CONFIG', 'SET', 'requirepass', '');
    }
    is(keys_in($db), 'rl:api:a rl:other:a', "$what: both zones' keys are in db $db");
    is(keys_in($db ? 0 : 3), '', "$what: and nowhere else");
    check_no_alerts(error_log_text(), $what);
}

# 16 passes nginx -t (Redis' own `databases` is the limit), but not SELECT.
start_nginx(http_config => http_conf('db=16'), config => $config);
my @st = map { rl(http_get('/t?k=b')) } 1 .. 4;
is("@st", join(' ', ('FAILED_OPEN') x 4), 'db=16 of 16 databases: requests follow ratelimit_fail');
ok(stop_nginx(), 'nginx quits gracefully');
my $log = error_log_text();
like($log, qr/ratelimit: redis "127\.0\.0\.1:\d+" replied "ERR DB index is out of range"/,
    'the refusal is logged');
like($log, qr/failed 2 times in a row/, 'and opens the breaker');
check_no_alerts($log, 'db=16');

for my $bad ('db=x', 'db=-1', 'db=65536', 'db=') {
    my ($rc, $out) = nginx_t(http_config => http_conf($bad), config => $config);
    isnt($rc, 0, "$bad fails nginx -t");
    like($out, qr/invalid value "\Q$bad\E" in "ratelimit_redis" directive, it must be 0\.\.65535 .* in .*nginx\.conf:\d+/,
        "$bad: and says why, with the range and file:line");
}
my ($rc) = nginx_t(http_config => http_conf('db=65535'), config => $config);
is($rc, 0, 'db=65535 passes nginx -t');
done_testing();

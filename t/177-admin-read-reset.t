# ratelimit_admin on every algorithm: GET answers the zone's figures for a
# key without changing them (a rejected consumer stays rejected), DELETE
# removes the key and the consumer is admitted again; a variable limit is
# given as limit=; the key is built as requests build it.
use lib 't/lib';
use RLTest;

sub rl { header($_[0], 'X-RL') // '(none)' }
sub admin {
    my ($method, $path) = @_;
    my $r = http_request(port => server_port(), request => "$method $path");
    return ($r->{status}, $r->{body} // '');
}

my %zones = (
    log     => 'window=1m',
    packed  => 'window=1m algorithm=sliding_log_packed',
    counter => 'window=1m algorithm=sliding_counter',
    gcra    => 'window=1m algorithm=gcra burst=2',
    quota   => 'period=month',
    rid     => 'window=1m member=request_id',
);
my @names = sort keys %zones;
my $http = "    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT;\n"
    . join('', map { "    ratelimit_zone $_ key=\$arg_k limit=2 $zones{$_};\n" } @names)
    . "    ratelimit_zone var key=u:\$arg_k limit=\$arg_l window=1m;\n";
my $config = "    add_header X-RL \$ratelimit_status always;\n    ratelimit_deny_cache off;\n"
    . join('', map { "    location = /$_ { ratelimit $_; try_files /t =404; }\n"
                   . "    location = /admin/$_ { ratelimit_admin $_; }\n" } @names, 'var');
start_nginx(http_config => $http, config => $config);

for my $z (@names) {
    my ($st, $body) = admin(GET => "/admin/$z?key=bob");
    is($st, 200, "$z: GET of an unknown key");
    # A calendar quota's reset is always its period's end.
    my $reset = $z eq 'quota' ? '\d+' : '0';
    like($body, qr/^\{"zone":"$z","key":"bob","limit":2,"remaining":2,"reset_ms":$reset,/, "$z: all of it left");
    my @st = map { rl(http_get("/$z?k=bob")) } 1 .. 3;
    is("@st", 'PASSED PASSED REJECTED', "$z: the consumer is rejected");
    ($st, $body) = admin(GET => "/admin/$z?key=bob");
    like($body, qr/"remaining":0,"reset_ms":[1-9]\d*,/, "$z: GET says none left, and when");
    if ($z eq 'quota') {
        like($body, qr/"period":"month","period_ms":(2419200000|2505600000|2592000000|2678400000)\}/, "$z: and its period");
    } else {
        like($body, qr/"window_ms":60000\}$/, "$z: and its window");
    }
    is(rl(http_get("/$z?k=bob")), 'REJECTED', "$z: GET changed nothing");
    ($st, $body) = admin(DELETE => "/admin/$z?key=bob");
    is("$st $body", qq(200 {"zone":"$z","key":"bob","deleted":true}\n), "$z: DELETE removes the key");
    is(rl(http_get("/$z?k=bob")), 'PASSED', "$z: the consumer is admitted again");
    ($st, $body) = admin(DELETE => "/admin/$z?key=nobody");
    like($body, qr/"deleted":false/, "$z: DELETE of an unknown key says so");
    ($st, $body) = admin(POST => "/admin/$z?key=bob&set=5");
    is($st, 400, "$z: set= is for balances only");
}

# A limit from a variable: the caller gives it.
http_get("/var?k=v&l=3") for 1 .. 2;
my ($st, $body) = admin(GET => '/admin/var?key=v');
is($st, 400, 'a variable limit without limit=: 400');
like($body, qr/give limit= and window=/, 'saying what to give');
($st, $body) = admin(GET => '/admin/var?key=v&limit=3');
like($body, qr/"key":"v","limit":3,"remaining":1,/, 'with limit=: the figures under that limit');
is(redis_cmd('ZCARD', 'rl:var:u:v'), 2, 'the key requests use');

($st, $body) = admin(PATCH => '/admin/log?key=bob');
is($st, 405, 'other methods: 405');
ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'admin');
done_testing();

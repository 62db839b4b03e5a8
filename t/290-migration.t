# Migrating from the article's access_by_lua_block one gateway at a time: a
# gateway running the article's block verbatim (bench/article_limiter.conf) and
# one running the module with exact_key=on count in the same Redis keys, so 500
# requests for one consumer fired at once, split across both, limit 100, admit
# exactly 100; the module counts the block's string members scored in ms, and
# the block counts the module's. The Lua gateway needs OpenResty's Lua module:
# in the system pass of make test the nginx under test has it; otherwise that
# gateway runs Debian's /usr/sbin/nginx with libnginx-mod-http-lua (and without
# this module), beside the module gateway on the nginx under test.
use lib 't/lib';
use RLTest;
use FindBin;

my $N     = $ENV{TEST_RL_CONCURRENCY} || 500;
my $LIMIT = 100;

my $SYS_MODS = '/usr/lib/nginx/modules';
my @lua_modules = ("$SYS_MODS/ndk_http_module.so", "$SYS_MODS/ngx_http_lua_module.so");
my $own_lua = nginx_has('ngx_http_lua_module');
unless (-e '/usr/share/lua/5.1/nginx/redis.lua'
        && ($own_lua || (-x '/usr/sbin/nginx' && !grep { !-e } @lua_modules))) {
    plan(skip_all => 'needs lua-nginx-redis and the Lua module (Debian: libnginx-mod-http-lua)');
}

open my $fh, '<', "$FindBin::Bin/../bench/article_limiter.conf" or die "article_limiter.conf: $!";
my $article = do { local $/; <$fh> };
$article =~ s/\@REDIS_PORT\@/\$TEST_NGINX_REDIS_PORT/g;
# The block fails open after its 200 ms Redis timeout, admitting without writing a member: on a
# loaded machine (prove -j2 beside the cluster suites) that made 500 at once admit 324. Its
# timeout is not what this test is about, so it gets the module gateway's 10 s.
$article =~ s/set_timeout\(200\)/set_timeout(10000)/ or die 'no set_timeout(200) in the block';

# The article's key is "rl:sw:" .. (X-Consumer-Id or the client address), limit 100 per 60 s.
my $module_http = <<'EOF';
    map $http_x_consumer_id $rl_id { "" $remote_addr; default $http_x_consumer_id; }
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=10s;
    ratelimit_zone sw  key=rl:sw:$rl_id limit=100 window=1m exact_key=on;
    ratelimit_zone swn key=rl:sw:$rl_id limit=100 window=1m exact_key=on clock=nginx;
EOF
my $module_config = <<'EOF';
    ratelimit_fail closed;
    location /t { ratelimit sw;  add_header X-RL $ratelimit_status always; }
    location /u { ratelimit swn; add_header X-RL $ratelimit_status always; }
EOF
my $lua_config = "    location /t {\n$article\n    }\n    location /u {\n$article\n    }\n";

my $lua = do {
    # Debian's nginx with its Lua module, when the nginx under test has none.
    no warnings 'redefine';
    local *RLTest::Nginx::binary = sub { '/usr/sbin/nginx' } unless $own_lua;
    local $ENV{TEST_NGINX_NO_MODULE} = 1 unless $own_lua;
    local $ENV{TEST_NGINX_LOAD_MODULES} = "@lua_modules" unless $own_lua;
    # The block is not under test, and under valgrind it would exceed its own 200 ms Redis
    # timeout and fail open.
    local *RLTest::Nginx::valgrind_cmd = sub { () };
    start_nginx(name => 'lua', workers => 2, config => $lua_config);
};
my $mod = start_nginx(name => 'mod', workers => 2, http_config => $module_http,
    config => $module_config);

sub fire {
    my ($path, $consumer) = @_;
    my @gw = ($lua, $mod);
    my @specs = map { { port => $gw[$_ % 2]->port, request => "GET $path",
        headers => { 'X-Consumer-Id' => $consumer } } } 0 .. $N - 1;
    my $res = http_parallel(\@specs, timeout => 60);
    my (%by, %admitted_by);
    for my $i (0 .. $#$res) {
        my $st = $res->[$i]{status} // "error: $res->[$i]{error}";
        $by{$st}++;
        $admitted_by{$i % 2 ? 'module' : 'lua'}++ if $st eq '200';
    }
    return (\%by, \%admitted_by);
}

for my $r (['/t', 'clock=redis'], ['/u', 'clock=nginx']) {
    my ($path, $what) = @$r;
    my $consumer = "consumer-" . substr($path, 1);
    my ($by, $gw) = fire($path, $consumer);
    is($by->{200} // 0, $LIMIT, "$what: exactly $LIMIT of $N admitted across both gateways")
        or diag(explain $by);
    is($by->{429} // 0, $N - $LIMIT, "$what: the others rejected");
    note("$what: admitted by the Lua block: " . ($gw->{lua} // 0)
        . ", by the module: " . ($gw->{module} // 0));
    my $members = redis_cmd('ZRANGE', "rl:sw:$consumer", 0, -1);
    is(scalar @$members, $LIMIT, "$what: one key, exactly $LIMIT members");
    my $strings = grep { /^\d{13}-[0-9a-f]{32}$/ } @$members;
    my $ints = grep { /^\d{16}$/ } @$members;
    is($strings + $ints, $LIMIT, "$what: the article's members and the module's, nothing else");
    is($strings, $gw->{lua} // 0, "$what: the block wrote one member per request it admitted");
    is(redis_cmd('DBSIZE'), $path eq '/t' ? 1 : 2, "$what: no other key");

    # Both go on rejecting that consumer, whoever asks.
    is(http_get($path, 'X-Consumer-Id' => $consumer, -port => $_->port)->{status}, 429,
        "$what: still rejected on " . ($_ == $lua ? 'the Lua gateway' : 'the module gateway'))
        for $lua, $mod;
}

# The module's headers on a key the block filled: the same limit and remaining.
redis_cmd('DEL', 'rl:sw:h');
http_get('/t', 'X-Consumer-Id' => 'h', -port => $lua->port) for 1 .. 3;
my $r = http_get('/t', 'X-Consumer-Id' => 'h', -port => $mod->port);
is($r->{status}, 200, 'module admits the 4th request of a key the block counted 3 in');
is(header($r, 'RateLimit-Remaining'), 96, 'and counts them: 96 remaining');
$r = http_get('/t', 'X-Consumer-Id' => 'h', -port => $lua->port);
is(header($r, 'RateLimit-Remaining'), 95, 'the block counts the module\'s entry too');

stop_nginx('lua');
stop_nginx('mod');
check_no_alerts(nginx('lua')->error_log_text, 'lua gateway');
check_no_alerts(nginx('mod')->error_log_text, 'module gateway');
done_testing();

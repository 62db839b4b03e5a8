# Key-format stability across an upgrade: the keys the previous release (aac85e4) wrote,
# recorded in t/fixtures/upgrade-aac85e4.tsv by t/fixtures/make-upgrade-fixture.pl run against
# its build, are loaded into Redis as they were, and this release's script reads and keeps
# counting them (for every algorithm, at an injected clock 60 s after they were written), and
# this release's module names the keys exactly as the previous one did.
use lib 't/lib';
use RLTest;
use RLTest::Script qw(:all);
use RLTest::UpgradeZones qw(upgrade_zones upgrade_config upgrade_html @UPGRADE_ZONES);
use Digest::SHA qw(sha1_hex);

my $repo = RLTest::Nginx::repo_root();
my $file = "$repo/t/fixtures/upgrade-aac85e4.tsv";
open my $fh, '<', $file or die "$file: $!";
my ($written, %strings, %zsets);
while (<$fh>) {
    chomp;
    my ($kind, @f) = split /\t/;
    if ($kind eq 'now') { $written = $f[1] }
    elsif ($kind eq 'string') { $strings{ pack 'H*', $f[0] } = pack 'H*', $f[1] }
    elsif ($kind eq 'zset') { push @{ $zsets{ pack 'H*', $f[0] } }, $f[2], pack('H*', $f[1]) }
    else { die "$file: line $.: $kind\n" }
}
ok($written, 'the fixture says when it was written');

sub load {
    redis_cmd('FLUSHALL');
    redis_cmd('SET', $_, $strings{$_}, 'PX', 86_400_000) for keys %strings;
    for (keys %zsets) {
        redis_cmd('ZADD', $_, @{ $zsets{$_} });
        redis_cmd('PEXPIRE', $_, 86_400_000);
    }
}
load();

# The zones of make-upgrade-fixture.pl, as the script gets them: [key, algorithm, limit,
# window (for "q" the period: month, UTC), burst (gcra), else the balance of a missing key].
my $long = 'rl:log:' . sha1_hex('L' x 5000);
my @zones = (
    ['log',     'rl:log:a',     'l', 10,  3_600_000, 0,  7],
    ['packed',  'rl:packed:a',  'p', 10,  3_600_000, 0,  7],
    ['counter', 'rl:counter:a', 'c', 10,  3_600_000, 0,  7],
    # 3 at once with burst 5, one unit back every 6 min: 60 s later, floor(5 - 2.83).
    ['gcra',    'rl:gcra:a',    'g', 10,  3_600_000, 5,  2],
    ['monthly', 'rl:monthly:a', 'q', 100, 14_404,    0,  97],
    ['credits', 'rl:credits:a', 'b', 50,  1,         20, 17],
    ['long key', $long,         'l', 10,  3_600_000, 0,  9],
);
my $now = $written + 60_000;
for my $z (@zones) {
    my ($name, $key, $alg, $limit, $window, $burst, $left) = @$z;
    isnt(redis_cmd('TYPE', $key), 'none', "$name: the old release wrote $key");
    my $read = decide($now, [$key, $alg, $limit, $window, 0, $burst]);
    is($read->{zones}[0]{remaining}, $left, "$name: read as $left remaining") or diag(verdict($read));
    my $take = decide($now, [$key, $alg, $limit, $window, 1, $burst]);
    is(verdict($take) =~ s/ \d+$//r, "1 | 1 " . ($left - 1), "$name: one more admitted, $left - 1 left")
        or diag(verdict($take));
}

# Names: this module, given the same zones and keys on an empty Redis, writes the same keys.
redis_cmd('FLUSHALL');
my @names = @UPGRADE_ZONES;
upgrade_html(html_dir());
start_nginx(http_config => upgrade_zones(), config => upgrade_config());
is(http_get("/$_?k=a")->{status}, 200, "/$_: admitted") for @names;
is(http_get('/log?k=' . ('L' x 5000))->{status}, 200, 'a 5,000-byte key: admitted');
is(join(' ', sort @{ redis_cmd('KEYS', '*') }), join(' ', sort(keys %strings, keys %zsets)),
    'the same key names as the previous release');

# The module itself on the old keys: a balance has no clock, so the old value reads as it is.
load();
my $r = http_get('/credits?k=a');
is(header($r, 'RateLimit-Remaining'), 16, 'the module draws from the balance the old release left (17)');
ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'upgrade');

# A zone changed on live keys (docs/upgrades.md): another algorithm finds data it cannot read,
# answers WRONGTYPE naming the key, and the request follows ratelimit_fail; a lower limit
# counts what the key holds against the new limit, a higher one admits the difference.
redis_cmd('FLUSHALL');
sub api {
    my ($params) = @_;
    return (http_config => <<"EOF", config => <<'EOF');
    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=\$arg_k window=1h $params;
EOF
    location /t { ratelimit api; add_header X-RL "$ratelimit_status $ratelimit_remaining" always; }
EOF
}
# Restarted rather than reloaded: a reload's old workers may still answer a request or two.
my $log = '';
sub restart {
    ok(stop_nginx(), 'nginx quits gracefully');
    $log .= error_log_text();
    start_nginx(api(@_));
}
sub rl { header($_[0], 'X-RL') // '(none)' }
start_nginx(api('limit=5'));
is(join(', ', map { rl(http_get('/t?k=a')) } 1 .. 3), 'PASSED 4, PASSED 3, PASSED 2',
    'sliding_log, limit 5: three admitted');
restart('limit=5 algorithm=gcra');
is(rl(http_get('/t?k=a')), 'FAILED_OPEN', 'the sliding_log key under gcra: ratelimit_fail');
restart('limit=2');
is(rl(http_get('/t?k=a')), 'REJECTED 0', 'a lower limit: the 3 entries are over 2, rejected');
restart('limit=10');
my @more = map { rl(http_get('/t?k=a')) } 1 .. 8;
is("@more", 'PASSED 6 PASSED 5 PASSED 4 PASSED 3 PASSED 2 PASSED 1 PASSED 0 REJECTED 0',
    'a higher limit: 3 counted under 10, 7 more admitted (docs/upgrades.md), then rejected');
ok(stop_nginx(), 'nginx quits gracefully');
$log .= error_log_text();
like($log, qr/ratelimit: redis replied WRONGTYPE: one of the keys "rl:api:a" holds other data, request passed by ratelimit_fail/,
    'the log names the key');
check_no_alerts($log, 'algorithm change');
done_testing();

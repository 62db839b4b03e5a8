# member=request_id: the sliding log stores each admitted request's $request_id
# as its sorted-set member (cost N: <id>:1 .. <id>:N), so ZRANGE lists the
# requests that used the window, each findable in the access log; never a
# rejected one; unique across gateways. Decisions are those of the integer log.
use lib 't/lib';
use RLTest;

my $http = <<'EOF';
    log_format audit '$request_id $ratelimit_status $arg_k';
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=10s;
    ratelimit_zone api  key=$arg_k limit=3 window=1m member=request_id;
    ratelimit_zone ints key=$arg_k limit=3 window=1m member=integer;
EOF
my $config = <<'EOF';
    access_log logs/audit.log audit;
    add_header X-RL $ratelimit_status always;
    location /t { ratelimit api; }
    location /u { ratelimit api cost=2; }
    location /index.html { ratelimit ints; }
EOF

sub audit {
    my ($n) = @_;
    open my $fh, '<', $n->prefix . '/logs/audit.log' or return ();
    return map { [split ' '] } <$fh>;
}

my @gw = map { start_nginx(name => $_, workers => 2, http_config => $http, config => $config) }
    qw(a b);

# Five requests for one key through one gateway: three admitted, two rejected.
my @st = map { http_get('/t?k=a', -port => $gw[0]->port) } 1 .. 5;
is(join(' ', map { $_->{status} } @st), '200 200 200 429 429', 'decided as the integer log');
my @zset = @{ redis_cmd('ZRANGE', 'rl:api:a', 0, -1) };
wait_until(5, sub { grep({ $_->[2] eq 'a' } audit($gw[0])) == 5 });
my @log = grep { $_->[2] eq 'a' } audit($gw[0]);
my @passed = sort map { $_->[0] } grep { $_->[1] eq 'PASSED' } @log;
my @rejected = map { $_->[0] } grep { $_->[1] =~ /^REJECTED/ } @log;
is(scalar @passed, 3, 'three admitted in the access log');
is_deeply([sort @zset], \@passed, 'the members are the $request_id of the admitted requests');
my %in = map { $_ => 1 } @zset;
is(scalar(grep { $in{$_} } @rejected), 0, 'no rejected request among them');
like($_, qr/^[0-9a-f]{32}$/, "member $_ is a request id") for @zset;
like(redis_cmd('ZSCORE', 'rl:api:a', $zset[0]), qr/^\d{13}$/, 'scored by the ms of admission');

# A cost of 2: two members derived from the one id.
http_get('/u?k=c', -port => $gw[0]->port);
my @c = sort @{ redis_cmd('ZRANGE', 'rl:api:c', 0, -1) };
wait_until(5, sub { grep({ $_->[2] eq 'c' } audit($gw[0])) == 1 });
my ($id) = map { $_->[0] } grep { $_->[2] eq 'c' } audit($gw[0]);
is_deeply(\@c, ["$id:1", "$id:2"], 'cost 2: <id>:1 and <id>:2');

# Two gateways, two workers each, one key: every admitted request has its own member.
my @specs = map { { port => $gw[$_ % 2]->port, request => 'GET /t?k=many' } } 1 .. 60;
redis_cmd('DEL', 'rl:api:many');
my $res = http_parallel(\@specs, timeout => 30);
is(scalar(grep { ($_->{status} // 0) == 200 } @$res), 3, 'limit 3 across gateways');
$res = http_parallel([map { { port => $gw[$_ % 2]->port, request => "GET /t?k=u$_" } } 1 .. 60],
    timeout => 30);
my @all = map { @{ redis_cmd('ZRANGE', "rl:api:u$_", 0, -1) } } 1 .. 60;
my %uniq = map { $_ => 1 } @all;
is(scalar @all, 60, '60 keys, one member each');
is(scalar keys %uniq, 60, 'request ids unique across gateways and workers');

# member=integer is the compact default.
http_get('/index.html?k=d', -port => $gw[1]->port);
like(join(' ', @{ redis_cmd('ZRANGE', 'rl:ints:d', 0, -1) }), qr/^\d{16}$/, 'integer members');

stop_nginx($_) for qw(a b);
check_no_alerts(nginx($_)->error_log_text, "gateway $_") for qw(a b);
done_testing();

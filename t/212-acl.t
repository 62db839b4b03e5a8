# Redis ACL users: the lines of docs/redis-acl.md, pasted as an operator
# would, on one server (with db=), a Sentinel group and a Cluster: every
# algorithm and ratelimit_admin decide exactly, and ACL LOG records no refused
# command.  A key the ACL refuses (NOPERM) fails its own decision only: it
# never counts for the breaker, and decisions that shared its script call are
# sent again and decided as usual.  A 5,000-byte exact key keeps its literal
# head, so it stays inside ~rl:*.
use lib 't/lib';
use RLTest;
use RLTest::Sentinel;
use RLTest::Cluster;
use Time::HiRes ();

sub rl { header($_[0], 'X-RL') // '(none)' }

# The doc's ACL line and the additions of its table, as written there.
setup();
open my $fh, "<", "$ENV{TEST_NGINX_REPO}/docs/redis-acl.md" or die "docs/redis-acl.md: $!";
my $doc = do { local $/; <$fh> };
my ($line) = $doc =~ /^(ACL SETUSER limiter .*)$/m or die 'no ACL line in docs/redis-acl.md';
my %add = $doc =~ /^\| `(db=N|sentinel=NAME|cluster=on)`[^|]*\| `([^`]+)` \|/mg;
is(scalar keys %add, 3, 'the doc lists what db=, sentinel= and cluster= add');
sub acl {
    my (@more) = @_;
    my @args = split ' ', $line;
    shift @args;    # ACL
    s/^>CHANGE-ME$/>acl-pw/ for @args;
    return (ACL => @args, map { split ' ', s/\\\|/|/gr } @add{@more});
}

my $algos = <<'EOF';
    ratelimit_zone log key=$arg_k limit=2 window=1m;
    ratelimit_zone rid key=$arg_k limit=2 window=1m member=request_id;
    ratelimit_zone packed key=$arg_k limit=2 window=1m algorithm=sliding_log_packed;
    ratelimit_zone counter key=$arg_k limit=2 window=1m algorithm=sliding_counter;
    ratelimit_zone gcra key=$arg_k limit=2 window=1m algorithm=gcra burst=2;
    ratelimit_zone quota key=$arg_k limit=2 period=day;
    ratelimit_zone credits key=$arg_k limit=1 algorithm=balance missing=2;
    ratelimit_zone conc key=$arg_k limit=3 algorithm=concurrency;
EOF
my @zones = qw(log rid packed counter gcra quota credits conc);
my $locations = join '', map { "    location /$_ { ratelimit $_; }\n" } @zones;
my $config = <<"EOF";
    add_header X-RL \$ratelimit_status always;
$locations    location = /admin { ratelimit_admin credits; }
EOF

sub every_algorithm {
    my ($what, $port) = @_;
    for my $z (@zones) {
        my @st = map { rl(http_get("/$z?k=$what")) } 1 .. 3;
        # A concurrency slot is released when its request ends (limit 3: even were both releases
        # still on their way, the third has room): one after the other, all pass.
        my $want = $z eq 'conc' ? 'PASSED PASSED PASSED' : 'PASSED PASSED REJECTED';
        is("@st", $want, "$what: $z decides exactly");
    }
    my $r = http_request(port => $port, request => "POST /admin?key=$what&add=5");
    is($r->{status}, 200, "$what: ratelimit_admin adds credits");
    is(rl(http_get("/credits?k=$what")), 'PASSED', "$what: and they are drawn");
}

# One server, with db=1.
redis_cmd(acl('db=N'));
# timeout=1s, as for the sentinel group and the cluster below: under valgrind a worker's first
# decision (connect, AUTH, SELECT, SCRIPT LOAD) outlasted the 200 ms default and failed open.
start_nginx(http_config => "    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT user=limiter "
    . "password=acl-pw db=1 timeout=1s;\n$algos", config => $config);
redis_cmd('ACL', 'LOG', 'RESET');
every_algorithm('single', server_port());
ok(stop_nginx(), 'single: nginx quits gracefully');
is_deeply(redis_cmd('ACL', 'LOG'), [], 'single: ACL LOG is empty');
my $single = error_log_text();
check_no_alerts($single, 'single');
unlike($single, qr/refused client tracking/, 'single: the deny cache is told of changes');
redis_cmd('ACL', 'DELUSER', 'limiter');

# The review's case: a client sending a 5,000-byte id to an exact-key zone got NOPERM for the
# whole call (its SHA-1 left ~rl:*), which opened the breaker for every other client.
redis_cmd('ACL', 'SETUSER', 'lim', 'on', '>pw2', '~rl:*', '+@all');
my $exact = <<'EOF';
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT user=lim password=pw2 fail_threshold=3 fail_backoff=5s;
    ratelimit_zone sw key=rl:sw:$arg_id limit=100 window=1m exact_key=on;
    ratelimit_zone api key=$arg_k limit=2 window=1m;
    ratelimit_zone outside key=other:$arg_k limit=1000 window=1m exact_key=on;
EOF
start_nginx(http_config => $exact, config => <<'EOF');
    add_header X-RL $ratelimit_status always;
    location /sw { ratelimit sw; }
    location /t { ratelimit api; }
    location /o { ratelimit outside; }
EOF
my $long = 'a' x 5000;
my @sw = map { rl(http_get("/sw?id=$long")) } 1 .. 3;
is("@sw", 'PASSED PASSED PASSED', 'a 5,000-byte exact key is decided');
my $keys = redis_cmd('KEYS', 'rl:sw:*');
is(scalar @$keys, 1, 'under one key');
like($keys->[0] // '', qr/^rl:sw:[0-9a-f]{40}$/, 'its literal head, then the SHA-1');
my @t = map { rl(http_get("/t?k=fresh")) =~ s/_CACHED$//r } 1 .. 5;
is("@t", 'PASSED PASSED REJECTED REJECTED REJECTED', 'other clients are limited exactly');

# Keys outside ~rl:* in the same calls as keys inside: only the refused ones fail.
my @specs = map { { port => server_port(), request => $_ % 2 ? "GET /o?k=x$_" : 'GET /t?k=mixed' } } 1 .. 80;
my $res = http_parallel(\@specs, timeout => 30);
my %seen;
$seen{ ($specs[$_]{request} =~ m{^GET /o} ? 'o' : 't') . ' ' . rl($res->[$_]) =~ s/_CACHED$//r }++
    for 0 .. $#$res;
is($seen{'t PASSED'} // 0, 2, '40 requests inside the ACL: 2 admitted');
is($seen{'t REJECTED'} // 0, 38, 'the other 38 rejected, none failed');
is($seen{'o FAILED_OPEN'} // 0, 40, 'the 40 refused keys follow ratelimit_fail');
ok(stop_nginx(), 'nginx quits gracefully');
my $log = error_log_text();
like($log, qr/ratelimit: redis replied "NOPERM/, 'the refusal is logged');
unlike($log, qr/failed \d+ times in a row/, 'and never opened the breaker');
check_no_alerts($log, 'exact keys');
redis_cmd('ACL', 'DELUSER', 'lim');

# Without what client tracking needs, the deny cache remembers a rejection 100 ms at most, and
# says so once.
{
    my @base = grep { !/^(\+client\|id|\+client\|tracking|\+subscribe|\+exists|&__redis__:invalidate)$/ } acl();
    redis_cmd(@base);
    start_nginx(http_config => "    ratelimit_redis 127.0.0.1:\$TEST_NGINX_REDIS_PORT user=limiter "
        . "password=acl-pw;\n$algos", config => $config);
    my @st = map { rl(http_get('/log?k=untracked')) =~ s/_CACHED$//r } 1 .. 3;
    is("@st", 'PASSED PASSED REJECTED', 'no tracking: still exact');
    Time::HiRes::sleep(0.3);
    is(rl(http_get('/log?k=untracked')), 'REJECTED', 'no tracking: after 300 ms Redis is asked again');
    # A top-up through ratelimit_admin is heard at once by the worker that made it, within the
    # 100 ms its rejection is remembered (Redis's notice would never come here).
    @st = map { rl(http_get('/credits?k=untracked')) } 1 .. 3;
    is("@st", 'PASSED PASSED REJECTED', 'no tracking: a balance used up');
    my $r = http_request(port => server_port(), request => 'POST /admin?key=untracked&add=5');
    is($r->{status}, 200, 'no tracking: ratelimit_admin adds credits');
    is(rl(http_get('/credits?k=untracked')), 'PASSED', 'no tracking: the next request draws from them');
    ok(stop_nginx(), 'no tracking: nginx quits gracefully');
    my $log = error_log_text();
    my @lines = $log =~ /(ratelimit: redis "[^"]+" refused client tracking \(NOPERM[^\n]*)/g;
    is(scalar @lines, 1, 'the refusal is logged once') or diag(join "\n", @lines);
    redis_cmd('ACL', 'DELUSER', 'limiter');
}

# A Sentinel group: the user on the primary and the replica.
{
    my $bed = RLTest::Sentinel->new(dir => servroot() . '/sentinel', name => 'rlacl')->start;
    $bed->cmd($_, acl('sentinel=NAME')) for $bed->data_ports;
    my ($p) = $bed->data_ports;
    my $addrs = join ' ', map { "127.0.0.1:$_" } $bed->sentinel_ports;
    start_nginx(http_config => "    ratelimit_redis $addrs sentinel=rlacl user=limiter "
        . "password=acl-pw timeout=1s;\n$algos", config => $config);
    ok(wait_until(10, sub { rl(http_get('/log?k=warm')) eq 'PASSED' }, 0.05), 'sentinel: decided');
    every_algorithm('sentinel', server_port());
    ok(stop_nginx(), 'sentinel: nginx quits gracefully');
    is_deeply($bed->cmd($p, 'ACL', 'LOG'), [], 'sentinel: ACL LOG of the primary is empty');
    check_no_alerts(error_log_text(), 'sentinel');
    $bed->stop;
}

# A Cluster: the user on every node; a slot held migrating makes a decision follow ASK.
{
    my $c = RLTest::Cluster->new(dir => servroot() . '/cluster', primaries => 3, replicas => 0)->start;
    $c->cmd($_, acl('cluster=on')) for $c->ports;
    my @p = $c->primaries;
    start_nginx(http_config => "    ratelimit_redis 127.0.0.1:$p[0] cluster=on user=limiter "
        . "password=acl-pw timeout=1s;\n$algos", config => $config);
    every_algorithm('cluster', server_port());
    # ASK: the key's slot migrating to another primary, the key already moved.
    my $slot = $c->keyslot('rl:log:asked');
    my $from = $c->primary_of_slot($slot);
    my ($to) = grep { $_ != $from } @p;
    $c->migrate_slot_begin($slot, $from, $to);
    my @st = map { rl(http_get('/log?k=asked')) } 1 .. 3;
    is("@st", 'PASSED PASSED REJECTED', 'cluster: exact while the slot migrates (ASKING allowed)');
    ok(stop_nginx(), 'cluster: nginx quits gracefully');
    is_deeply($c->cmd($_, 'ACL', 'LOG'), [], "cluster: ACL LOG of $_ is empty") for @p;
    check_no_alerts(error_log_text(), 'cluster');
    $c->stop;
}

done_testing();

# Reservations through resets (issue 27): a reservation belongs to the life of
# its key it was granted in, so after a reset (ratelimit_admin DELETE, a
# redis-cli DEL, FLUSHALL, expiry) and the key's re-creation by another gateway,
# nothing of the old life is spent, given back into the new one, or drops the
# new life's reservations; and a gcra key alternating between gateways loses
# no reservation.  Two gateways A and B, one worker each, share one Redis.
# Each case counts admissions (the X-RL header of each response) after the
# reset: never more than the limit, and Redis agrees once every reservation
# has gone back.  The figures before the fix are in the issue.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(sleep time);

sub rl { header($_[0], 'X-RL') // '(none)' }

my $http = <<'EOF';
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=500ms;
    ratelimit_deny_cache off;
    ratelimit_zone quota key=$arg_k limit=100 period=day lease=20 lease_time=10s;
    ratelimit_zone quota1 key=$arg_k limit=100 period=day lease=20 lease_time=1s;
    ratelimit_zone counter1 key=$arg_k limit=100 window=1h algorithm=sliding_counter lease=20 lease_time=1s;
    ratelimit_zone balance1 key=$arg_k limit=100 algorithm=balance missing=100 lease=20 lease_time=1s;
    ratelimit_zone counter key=$arg_k limit=100 window=1h algorithm=sliding_counter lease=20 lease_time=10s;
    ratelimit_zone balance key=$arg_k limit=100 algorithm=balance missing=100 lease=20 lease_time=10s;
    ratelimit_zone log key=$arg_k limit=40 window=1m lease=10 lease_time=10s;
    ratelimit_zone short key=$arg_k limit=40 window=1m lease=10 lease_time=3s;
    ratelimit_zone tat key=$arg_k limit=100 window=1h algorithm=gcra burst=100 lease=20 lease_time=10s;
    ratelimit_zone api key=$arg_k limit=1000 window=1m lease=auto;
    ratelimit_zone ip key=$arg_k limit=1000 window=1m;
    ratelimit_zone both key=$arg_k limit=1000 window=1m lease=10 lease_time=10s;
EOF
my $config = <<'EOF';
    add_header X-RL $ratelimit_status always;
    location /quota { ratelimit quota; }
    location /quota1 { ratelimit quota1; }
    location /counter1 { ratelimit counter1; }
    location /balance1 { ratelimit balance1; }
    location /counter { ratelimit counter; }
    location /balance { ratelimit balance; }
    location /log { ratelimit log; }
    location /short { ratelimit short; }
    location /tat { ratelimit tat; }
    location /mixed { ratelimit api; ratelimit ip; }
    location /both { ratelimit both; }
    location /bothmixed { ratelimit both; ratelimit ip; }
    location = /admin/quota { ratelimit_admin quota; }
    location = /admin/counter { ratelimit_admin counter; }
    location = /admin/balance { ratelimit_admin balance; }
    location = /admin/log { ratelimit_admin log; }
EOF
nginx()->write_html({ map { $_ => "ok\n" } qw(quota quota1 counter1 balance1 counter balance log short tat mixed both bothmixed) });
# Gateway C's Redis user may not track keys (a managed service, an ACL without
# CLIENT): its reservations live 100 ms, and a reset goes unheard by it.
redis_cmd('ACL', 'SETUSER', 'untracked', 'on', '>pw', '~rl:*', '+@all', '-client');
my %gw = map { $_ => start_nginx(name => "gw$_", http_config => $http, config => $config) } qw(A B);
$gw{C} = start_nginx(name => 'gwC', config => $config,
    http_config => $http =~ s/(timeout=500ms)/$1 user=untracked password=pw/r);

# A request of key $k to $zone's location on gateway $g; its X-RL.
sub req { my ($g, $zone, $k) = @_; rl(http_get("/$zone?k=$k", -port => $gw{$g}->port)) }
sub admitted { scalar grep { /^PASSED/ } @_ }

# A worker's first grant starts its tracker, which connects within a second; until then its
# reservations live 100 ms (and under valgrind a cold worker's first decisions may take their
# whole timeout). Each gateway is warmed first.
for my $g (sort keys %gw) {
    wait_until(20, sub { (join ' ', map { req($g, 'log', 'warm') } 1 .. 2) =~ /PASSED_LEASE/ });
}
sleep 1.5;

my %reset = (
    'admin DELETE' => sub { my ($zone, $k) = @_;
        http_request(port => $gw{B}->port, request => "DELETE /admin/$zone?key=$k") },
    'redis-cli DEL' => sub { redis_cmd('DEL', "rl:$_[0]:$_[1]") },
    'FLUSHALL' => sub { redis_cmd('FLUSHALL') },
);

# Finding 1: an old reservation's give-back must not land on the re-created key
# (quota, counter, balance).  A holds 19 of a 20-unit reservation; the key is
# reset; A and B alternate 160 requests: at most 100 admitted (was 119).
for my $zone (qw(quota counter balance)) {
    for my $how (sort keys %reset) {
        my $k = "f1-$how" =~ s/\W+/-/gr;
        my @first = map { req('A', $zone, $k) } 1 .. 2;
        is("@first", 'PASSED PASSED_LEASE', "$zone/$how: A holds a reservation");
        $reset{$how}->($zone, $k);
        sleep 0.2;
        my @after = map { req($_ % 2 ? 'A' : 'B', $zone, $k) } 1 .. 160;
        my $n = admitted(@after);
        ok($n <= 100, "$zone/$how: after the reset, $n of 160 admitted (limit 100)");
        ok($n >= 60, "$zone/$how: at most the two gateways' reservations (2 x 20) unspent ($n)");
    }
}

# Finding 5: a DEL of the key alone leaves its ledger until the key's next decision.  A
# hears it first at another key's request, so its check of the old reservation reaches Redis
# before that decision: the check must not find the old rid and take it for the key's life
# (it did: 102 of 160 admitted, A's old units spent in the new life).
for my $zone (qw(quota counter balance)) {
    my $k = 'f5-heard-elsewhere';
    my @first = map { req('A', $zone, $k) } 1 .. 2;
    is("@first", 'PASSED PASSED_LEASE', "$zone/heard elsewhere: A holds a reservation");
    redis_cmd('DEL', "rl:$zone:$k");
    sleep 0.2;
    req('A', $zone, "$k-other");
    sleep 0.1;
    my $n = admitted(map { req($_ % 2 ? 'A' : 'B', $zone, $k) } 1 .. 160);
    ok($n <= 100, "$zone/heard elsewhere: after the DEL, $n of 160 admitted (limit 100)");
}

# Finding 1, where the reset goes unheard: C's reservation (100 ms) is given
# back at its end, after the key was reset and re-created by B.  Once B's units
# are back too (lease_time 1 s), Redis counts exactly what was admitted since
# the reset: the old units were not returned into the new life (before the fix:
# 19 units short, so 19 more admitted than the limit allows).
for my $zone (qw(quota1 counter1 balance1)) {
    my $k = 'f1-untracked';
    my @first = map { req('C', $zone, $k) } 1 .. 2;
    is("@first", 'PASSED PASSED_LEASE', "$zone/unheard: C holds a reservation");
    redis_cmd('DEL', "rl:$zone:$k");
    my $n = admitted(map { req('B', $zone, $k) } 1 .. 30);
    sleep 1.5;
    my $v = redis_cmd('GET', "rl:$zone:$k");
    my $counted = $zone eq 'balance1' ? 100 - $v
        : $zone eq 'quota1' ? unpack('x6 V', $v) : do { my ($c, $p) = unpack('x1 V V', $v); $c + $p };
    is($counted, $n, "$zone/unheard: Redis counts the $n admitted since the reset, nothing returned into it");
}

# Finding 2: pre-reset units spent after the key is re-created by another
# gateway.  A holds 9; DEL; B takes the fresh window (40); A's 30 requests:
# none admitted (was 8 PASSED_LEASE, 48 in the minute for a limit of 40).
for my $how (sort keys %reset) {
    my $k = "f2-$how" =~ s/\W+/-/gr;
    is(join(' ', map { req('A', 'log', $k) } 1 .. 2), 'PASSED PASSED_LEASE', "log/$how: A holds 9");
    $reset{$how}->('log', $k);
    my $b = admitted(map { req('B', 'log', $k) } 1 .. 60);
    my $a = admitted(map { req('A', 'log', $k) } 1 .. 30);
    ok($b <= 40, "log/$how: B admitted $b of 60 in the new life");
    is($a + $b <= 40 ? 'within' : "over: A $a + B $b", 'within', "log/$how: A spends nothing of the old life");
}

# Finding 3: a stale "gone" must not drop the reservation granted right after
# the reset without giving it back.  One gateway; the requests follow the DEL at
# once, so the decision after the reset races the check of the old reservation.
# Once the new reservations are given back (lease_time 3 s), Redis counts
# exactly what was admitted (was: 9 units held for a minute).
for my $round (1 .. 3) {
    my $k = "f3-$round";
    req('A', 'short', $k) for 1 .. 2;
    redis_cmd('DEL', "rl:short:$k");
    my $n = admitted(map { req('A', 'short', $k) } 1 .. 12);
    my $counted;
    wait_until(6, sub { ($counted = redis_cmd('ZCARD', "rl:short:$k")) == $n });
    is($counted, $n, "stale gone $round: Redis counts the $n admitted after the reset, nothing held");
}

# Finding 4: gcra alternating between gateways.  Each side's reservation used to
# replace the other's, whose give-back then found the TAT moved: 17 of 160
# admitted for a burst of 100.  Now neither is replaced while it holds units.
{
    my @r = map { req($_ % 2 ? 'A' : 'B', 'tat', 'f4') } 1 .. 160;
    my $n = admitted(@r);
    ok($n <= 100, "gcra alternating: $n of 160 admitted (burst 100)");
    ok($n >= 60, "gcra alternating: at most the two reservations unspent ($n)");
}

# Finding 5: a location with a leased and a plain zone never admits from
# reservations, so it must not reserve: one script call per request, no units.
{
    my $before = redis_calls('evalsha');
    my @r = map { req('A', 'mixed', 'f5') } 1 .. 60;
    is(admitted(@r), 60, 'mixed: 60 admitted');
    is(redis_calls('evalsha') - $before, 60, 'mixed: one script call per request');
    is(redis_cmd('ZCARD', 'rl:api:f5'), 60, 'mixed: exactly the 60 admissions counted, nothing reserved');
    is(redis_cmd('EXISTS', 'rl:api:f5|lease{rl:api:f5}'), 0, 'mixed: no reservation was granted');
}
# A zone that leases in one location and not in another: the plain decision
# must not cut the key's TTL (the window) below the reserved units' end plus
# the window, or units spent late would leave the count early.
{
    is(join(' ', map { req('A', 'both', 'f5ttl') } 1 .. 2), 'PASSED PASSED_LEASE', 'mixed TTL: A holds 9 for 10 s');
    req('B', 'bothmixed', 'f5ttl');
    my $ttl = redis_cmd('PTTL', 'rl:both:f5ttl');
    ok($ttl > 65_000, "mixed TTL: a decision in the mixed location keeps the key past the reservation's end and a window ($ttl ms)");
}

# Expiry: the key lapses in Redis (a quota's period, a key's TTL) while A holds
# units; B re-creates it; A's units are not spent in the new life.
{
    my $k = 'expiry';
    is(join(' ', map { req('A', 'log', $k) } 1 .. 2), 'PASSED PASSED_LEASE', 'expiry: A holds 9');
    redis_cmd('PEXPIRE', "rl:log:$k", 1);
    sleep 0.2;
    my $b = admitted(map { req('B', 'log', $k) } 1 .. 60);
    my $a = admitted(map { req('A', 'log', $k) } 1 .. 30);
    is($a + $b <= 40 ? 'within' : "over: A $a + B $b", 'within', 'expiry: within the limit in the new life');
}

redis_cmd('ACL', 'DELUSER', 'untracked');
for my $g (sort keys %gw) {
    ok(stop_nginx("gw$g"), "gateway $g quits gracefully");
    check_no_alerts(error_log_text("gw$g"), "gateway $g");
}
done_testing();

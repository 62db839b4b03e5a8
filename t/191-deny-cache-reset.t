# A reset resets: a consumer rejected on two gateways of two workers each,
# answered from their deny caches, is decided by Redis again on every worker
# right after an admin DELETE, a redis-cli DEL, a FLUSHALL or a new balance
# (Redis client tracking tells each worker its remembered key changed), while
# the hammering itself costs a few script calls, not one per request.
use lib 't/lib';
use RLTest;
use Time::HiRes qw(time sleep);

sub rl { header($_[0], 'X-RL') // '(none)' }

my $http = <<'EOF';
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone api key=$arg_k limit=100 window=1h;
    ratelimit_zone credits key=$arg_k limit=1 algorithm=balance status=402;
EOF
my $config = <<'EOF';
    add_header X-RL $ratelimit_status always;
    add_header X-Pid $pid always;
    add_header X-RL-Time $ratelimit_time always;
    location /t { ratelimit api cost=$arg_c; }
    location /c { ratelimit credits; try_files /t =404; }
    location = /admin { ratelimit_admin api; }
EOF
my @gw = map { start_nginx(name => "gw$_", workers => 2, http_config => $http, config => $config) } 1, 2;
my @workers = map { $_->worker_pids } @gw;
is(scalar @workers, 4, 'two gateways of two workers');

# Requests spread over both gateways, many at once so that every worker takes some.
sub hammer {
    my ($path, $n) = @_;
    my @specs = map { my $g = $_; map { { port => $g->port, request => "GET $path" } } 1 .. $n } @gw;
    return http_parallel(\@specs, timeout => 10);
}
sub cached_by_worker {
    my ($res) = @_;
    my %w;
    $w{ header($_, 'X-Pid') // '?' } = 1 for grep { rl($_) eq 'REJECTED_CACHED' } @$res;
    return scalar keys %w;
}
sub calls { my %c = redis_cmd('INFO', 'commandstats') =~ /cmdstat_(\w+):calls=(\d+)/g; \%c }

# A reset by $how, then every worker is polled: after it, none answers from memory.
sub after_reset {
    my ($what, $path, $reject, $how) = @_;
    my $res;
    ok(wait_until(10, sub { $res = hammer($path, 24); cached_by_worker($res) == 4 }, 0.05),
        "$what: every worker answers the rejected consumer from memory");
    is(scalar(grep { rl($_) !~ /^REJECTED/ } @$res), 0, "$what: and nothing else") or diag(explain([map { rl($_) } @$res]));
    $how->();
    # The reset is done when $how returns; an answer is timed by its decision's own instant
    # ($ratelimit_time), not by when its response reached this loaded client.
    my $t0 = time;
    my (%seen, @answers);
    # For 300 ms at least (3 s under valgrind), and until every worker has answered.
    while ((keys %seen < 4 || time - $t0 < 0.3 * $RLTest::Nginx::SLOW) && time - $t0 < 50) {
        for my $r (@{ hammer($path, 4) }) {
            my ($pid, $st) = (header($r, 'X-Pid') // '?', rl($r));
            $seen{$pid} //= $st;
            push @answers, [$pid, (header($r, 'X-RL-Time') // 0) - $t0, $st];
        }
    }
    # Answers from memory count until Redis rejects again (the limit, 100, used up): from then
    # on they are right.  Decision instants are the worker's clock, to the millisecond.
    my ($full) = sort { $a <=> $b } map { $_->[2] eq 'REJECTED' ? $_->[1] : () } @answers;
    my @before = grep { !defined $full || $_->[1] < $full } @answers;
    my (%asked, $last_cached);
    for (grep { $_->[2] ne 'REJECTED_CACHED' } @before) {
        $asked{ $_->[0] } = $_->[1] if !defined $asked{ $_->[0] } || $_->[1] < $asked{ $_->[0] };
    }
    for (grep { $_->[2] eq 'REJECTED_CACHED' } @before) {
        $last_cached = $_->[1] if !defined $last_cached || $_->[1] > $last_cached;
    }
    # A worker that asked Redis again has forgotten the rejection for good (nothing since
    # rejected it again): no answer from its memory may follow.
    my @late = grep { $_->[2] eq 'REJECTED_CACHED' && defined $asked{ $_->[0] } && $_->[1] > $asked{ $_->[0] } } @before;
    is(scalar @late, 0, "$what: no worker answered from memory after it asked Redis again")
        or diag(explain([sort { $a->[1] <=> $b->[1] } @before]));
    is(scalar keys %seen, 4, "$what: every worker answered after the reset");
    # Each worker hears of the change a round trip after it; a request just before that may
    # still be answered from memory.  The promise is 1 s (measured idle: 20 ms); the bound
    # leaves room for a machine loaded by other suites, where one trip took 221 ms.
    # Under valgrind everything takes ten times as long, the invalidation's trip too.
    cmp_ok($last_cached // 0, '<', 0.5 * $RLTest::Nginx::SLOW, sprintf("$what: no answer from memory later than 500 ms "
        . "after the reset (the last: %s)", defined $last_cached ? sprintf('%.1f ms', 1000 * $last_cached) : 'none'));
}

# Exhausted by one request of the whole limit, then rejected at cost 1.
my $exhaust = sub {
    my $k = shift;
    is(rl(http_get("/t?k=$k&c=100", -port => $gw[0]->port)), 'PASSED', "$k: the whole limit at once");
};

$exhaust->('a');
after_reset('admin DELETE', '/t?k=a&c=1', 'REJECTED', sub {
    my $r = http_request(port => $gw[1]->port, request => 'DELETE /admin?key=a');
    is($r->{status}, 200, 'admin DELETE: answered');
});
$exhaust->('b');
after_reset('redis-cli DEL', '/t?k=b&c=1', 'REJECTED', sub { redis_cmd('DEL', 'rl:api:b') });
$exhaust->('f');
after_reset('FLUSHALL', '/t?k=f&c=1', 'REJECTED', sub { redis_cmd('FLUSHALL') });
# An empty balance has no time at which it refills: its rejection is remembered like any other
# until Redis says the key changed, so a top-up counts at once.
redis_cmd('SET', 'rl:credits:m', 0);
after_reset('a top-up of an empty balance', '/c?k=m', 'REJECTED',
    sub { redis_cmd('SET', 'rl:credits:m', 100_000_000) });
is(rl(http_get('/c?k=m', -port => $gw[1]->port)), 'PASSED', 'a new balance: admitted');

# What a client hammering an empty balance costs Redis: the first rejection of each worker.
redis_cmd('SET', 'rl:credits:e', 0);
ok(wait_until(10, sub { cached_by_worker(hammer('/c?k=e', 24)) == 4 }, 0.05),
    'an empty balance: every worker remembers its rejection');
redis_cmd('CONFIG', 'RESETSTAT');
my $empty_t0 = time;
my @empty;
while (time - $empty_t0 < 1) { push @empty, @{ hammer('/c?k=e', 24) } }
my $empty_calls = calls()->{evalsha} // 0;
note(sprintf 'an empty balance hammered: %d requests in %.1f s, %d script calls',
    scalar @empty, time - $empty_t0, $empty_calls);
is(scalar(grep { $_->{status} != 402 } @empty), 0, 'an empty balance: every answer 402');
cmp_ok($empty_calls, '<', 5, 'an empty balance hammered costs a few script calls, not one per request');

# The cost of a client hammering past its limit: script calls and all commands per second.
$exhaust->('h');
# Every worker first learns of the rejection, as for the empty balance: a worker that took no
# request of one warm-up round sends each request of its first burst to Redis, concurrently,
# before the first answer is remembered (24 script calls of one worker in a loaded run).
ok(wait_until(10, sub { cached_by_worker(hammer('/t?k=h&c=1', 24)) == 4 }, 0.05),
    'a hammered consumer: every worker remembers its rejection');
redis_cmd('CONFIG', 'RESETSTAT');
my ($n, $t0) = (0, time);
while (time - $t0 < 2) { $n += @{ hammer('/t?k=h&c=1', 24) } }
my $secs = time - $t0;
my $c = calls();
my $evalsha = ($c->{evalsha} // 0) / $secs;
my $all = 0;
$all += $c->{$_} for grep { !/^(info|config)$/ } keys %$c;
note(sprintf 'hammering: %d requests in %.1f s; Redis: %.1f script calls/s, %.1f commands/s (%s)',
    $n, $secs, $evalsha, $all / $secs, join ' ', map { "$_=$c->{$_}" } sort keys %$c);
cmp_ok($evalsha, '<', 5, 'a hammering client costs a few script calls per second');
ok(stop_nginx("gw$_"), 'nginx quits gracefully') for 1, 2;
check_no_alerts(error_log_text("gw$_"), "gw$_") for 1, 2;
done_testing();

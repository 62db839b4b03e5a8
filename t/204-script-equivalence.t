# Reply equivalence: the batch script (lua/decide.lua) against the script it
# replaced (t/ref/decide-v1.lua, one call per decision), on thousands of random
# decisions: random keys shared across decisions, costs 0-12, 1-3 zones of
# every algorithm, plan changes, clocks that jump, stand still and run behind,
# batches of 1-64.  Both run in the same Redis call on their own copy of the
# keys ("o:" and "n:"), so that they see the same clock, and every reply and
# the whole state after each call must be identical.  The same again with
# every sliding_log zone sent to the new script as sliding_log_packed: the same
# replies, and the same entries (scores) in the same order.
#
# The call is a test wrapper around the two texts, unchanged, each as a Lua
# function whose `redis` is a proxy: TIME answers the test's clock, and the TTL
# of every SET PX / PEXPIRE is recorded (and compared) instead of applied, so
# that keys do not expire on the real clock at slightly different moments for
# the two copies.  With clock=redis the sorted-set members (unique ids) differ
# by design (one TIME per batch: the new script numbers them); their scores,
# and everything else, must not.
use lib 't/lib';
use RLTest;
use RLTest::Script qw(:all);

my $old_text = RLTest::Script::slurp(RLTest::Nginx::repo_root() . '/t/ref/decide-v1.lua');
my $wrapper = <<"LUA";
local real, fake_time, ttl = redis, { ARGV[1], ARGV[2] }, {}
local function intercept(f)
  return function(cmd, ...)
    local c, args = string.upper(cmd), { ... }
    if c == 'TIME' then
      return { fake_time[1], fake_time[2] }
    elseif c == 'PEXPIRE' then
      ttl[args[1]] = args[2]
      return 1
    elseif c == 'SET' and args[3] == 'PX' then
      ttl[args[1]] = args[4]
      return f('SET', args[1], args[2])
    end
    return f(cmd, ...)
  end
end
local proxy = setmetatable({ call = intercept(real.call), pcall = intercept(real.pcall) },
  { __index = real })

local function old_decide(KEYS, ARGV, redis)
$old_text
end

local function new_decide(KEYS, ARGV, redis)
@{[ script_text() ]}
end

local function run(f, keys, argv)
  local ok, r = pcall(f, keys, argv, proxy)
  if ok then return r end
  return type(r) == 'table' and r or { err = tostring(r) }
end
local function ttls()
  local out = {}
  for key, v in pairs(ttl) do out[#out + 1] = string.sub(key, 3) .. '=' .. tostring(v) end
  table.sort(out)
  ttl = {}
  return out
end

-- ARGV: TIME's two figures, the number of decisions n, each one's zone count, then the batch.
local n = tonumber(ARGV[3])
local nkeys, argv = {}, {}
for i = 1, #KEYS do nkeys[i] = 'n:' .. KEYS[i] end
for i = 4 + n, #ARGV do argv[#argv + 1] = ARGV[i] end
local olds, a, k = {}, 1, 0
for d = 1, n do
  local nz, dk, dv = tonumber(ARGV[3 + d]), {}, {}
  for i = 1, nz do dk[i] = 'o:' .. KEYS[k + i] end
  for i = a, a + 5 * nz do dv[#dv + 1] = argv[i] end
  -- The packed log answers for the old log.
  for z = 1, nz do
    if dv[2 + 5 * (z - 1)] == 'p' then dv[2 + 5 * (z - 1)] = 'l' end
  end
  olds[#olds + 1] = run(old_decide, dk, dv)
  a, k = a + 1 + 5 * nz, k + nz
end
local old_ttl = ttls()
local new = run(new_decide, nkeys, argv)
return { olds, { new }, old_ttl, ttls() }
LUA

my $wsha = redis_cmd('SCRIPT', 'LOAD', $wrapper);
die 'wrapper: ' . $wsha->message if is_error($wsha);

srand($ENV{RL_SEED} // 20261130);
note('RL_SEED=' . ($ENV{RL_SEED} // 20261130));

# A pool of keys, each with its algorithm and its usual plan.
my @pool;
for my $alg (qw(l c g)) {
    for my $i (1 .. 6) {
        my $limit = (1, 3, 5, 10, 20, 40)[$i - 1];
        push @pool, { key => "k:$alg$i", alg => $alg, limit => $limit,
            window => (50, 500, 5000)[int rand 3], burst => 1 + int rand($limit + 2) };
    }
}

sub rand_cost {
    my $r = rand;
    return $r < 0.6 ? 1 : $r < 0.7 ? 0 : 2 + int rand 11;
}

sub rand_decision {
    my ($now, $packed) = @_;
    my $nz = rand() < 0.5 ? 1 : 2 + int rand 2;
    my %seen;
    my @z = grep { !$seen{$_->{key}}++ } map { $pool[int rand @pool] } 1 .. $nz;
    my @argv = ($now);
    for my $z (@z) {
        my $limit = rand() < 0.1 ? 1 + int rand 25 : $z->{limit};    # a plan change
        push @argv, $packed && $z->{alg} eq 'l' ? 'p' : $z->{alg}, $limit, $z->{window}, rand_cost(),
            $z->{alg} eq 'g' ? $z->{burst} : 0;
    }
    return [[map { $_->{key} } @z], @argv];
}

sub show { RLTest::Redis::format_reply($_[0]) }

# Each key of the pool in both copies, for comparison: type and content (sorted-set
# members only when $members).  With $packed, a log is its scores, whether a sorted
# set or packed.
sub state_of {
    my ($prefix, $members, $packed) = @_;
    my @out;
    for my $p (@pool) {
        my $k = "$prefix$p->{key}";
        my $type = redis_cmd('TYPE', $k);
        my $v = '';
        if ($type eq 'zset') {
            my $e = redis_cmd('ZRANGE', $k, 0, -1, 'WITHSCORES');
            $v = join ',', map { $members ? "$e->[2*$_]\@$e->[2*$_+1]" : $e->[2*$_+1] } 0 .. $#$e / 2;
        } elsif ($type eq 'string' && $packed && $p->{alg} eq 'l') {
            my $s = redis_cmd('GET', $k);
            $v = join ',', map { unpack 'Q<', substr($s, 6 * $_, 6) . "\0\0" } 0 .. length($s) / 6 - 1;
        } elsif ($type eq 'string') {
            $v = unpack 'H*', redis_cmd('GET', $k);
        }
        $type = 'log' if $packed && $p->{alg} eq 'l';
        push @out, "$p->{key}=$type:$v";
    }
    return join "\n", @out;
}

# $redis_clock: the share of decisions that read (the fake) Redis TIME; $packed: the new
# script's log zones are packed.
sub run_calls {
    my ($name, $calls, $redis_clock, $packed) = @_;
    redis_cmd('FLUSHALL');
    my ($decisions, $bad_replies, $bad_state, $rejections) = (0, 0, 0, 0);
    my %n_by_size;
    my $now = 1_700_000_000_000;
    for my $call (1 .. $calls) {
        # The clock: mostly small steps, sometimes standing still, sometimes a jump
        # past every window.
        my $r = rand;
        $now += $r < 0.2 ? 0 : $r < 0.9 ? int rand 150 : $r < 0.97 ? int rand 3000 : 70_000;
        my $n = (1, 1, 2, 3, 5, 16, 31, 64)[int rand 8];
        $n_by_size{$n}++;
        my @batch = map {
            my $t = rand() < $redis_clock ? ''
                : $now - (rand() < 0.1 ? int rand 30 : 0);    # a gateway behind the others
            rand_decision($t, $packed);
        } 1 .. $n;
        my ($keys, @argv) = batch_argv(@batch);
        my $res = redis_cmd('EVALSHA', $wsha, scalar @$keys, @$keys,
            int($now / 1000), ($now % 1000) * 1000 + int rand 1000,
            $n, (map { scalar @{ $_->[0] } } @batch), @argv);
        die "$name: wrapper failed: " . show($res) if is_error($res);
        my ($olds, $new, $old_ttl, $new_ttl) = @$res;
        $new = $n == 1 ? $new : $new->[0];
        for my $i (0 .. $n - 1) {
            $decisions++;
            my ($o, $w) = (show($olds->[$i]), show($new->[$i]));
            $rejections++ if ref $olds->[$i] eq 'ARRAY' && !$olds->[$i][0];
            next if $o eq $w;
            $bad_replies++;
            diag("$name call $call decision $i of $n: old [$o] new [$w]") if $bad_replies <= 5;
        }
        my ($so, $sn) = (state_of('o:', !$redis_clock && !$packed, $packed),
            state_of('n:', !$redis_clock && !$packed, $packed));
        my ($to, $tn) = ("@$old_ttl", "@$new_ttl");
        if ($so ne $sn || $to ne $tn) {
            $bad_state++;
            diag("$name call $call: state differs\nold: $so\nnew: $sn\nold TTLs: $to\nnew TTLs: $tn")
                if $bad_state <= 2;
        }
    }
    cmp_ok($decisions, '>=', 1000, "$name: $decisions decisions");
    cmp_ok($rejections, '>', $decisions / 10, "$name: $rejections of them rejections");
    cmp_ok($decisions - $rejections, '>', $decisions / 10, "$name: the others admitted");
    is($bad_replies, 0, "$name: every reply identical to the old script's");
    is($bad_state, 0, "$name: identical state after every call (values, scores, TTLs)");
    note("$name: calls by size: " . join ', ', map { "$_: $n_by_size{$_}" } sort { $a <=> $b } keys %n_by_size);
}

run_calls('gateway clock', 250, 0);
run_calls('mixed clocks', 250, 0.5);
run_calls('redis clock', 150, 1);
run_calls('packed log, gateway clock', 200, 0, 1);
run_calls('packed log, mixed clocks', 200, 0.5, 1);

done_testing();

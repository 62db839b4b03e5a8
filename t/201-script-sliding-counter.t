# The decision script's sliding_counter algorithm ("c"), run directly against
# a real redis-server with an injected clock (no nginx).  Expectations are
# literals worked out by hand from the definition:
#   window index i = floor(now / w), elapsed e = now - i*w
#   estimate      = prev * (w - e) / w + cur
#   a request of cost c fits while estimate + c <= limit
#   remaining     = floor(limit - estimate)   (after this decision)
#   reset_ms      = ms until the estimate is low enough for this request
#                   (rejected) or for one unit more than `remaining` (admitted)
#   value         = struct.pack('<BI4I4', i % 256, cur, prev): 9 bytes, read
#                   back by counter_value() as "<i % 256>:<cur>:<prev>"; PX 2w - e
#   a stored index one ahead of i (another gateway's clock is ahead) is counted
#   in: the decision is taken in that window (e = 0), never overwriting it
# Each table runs at a small clock and at a realistic epoch clock; both are
# multiples of the window, so t below is also the offset in the window.
use lib 't/lib';
use RLTest;
use RLTest::Script qw(:all);

for my $T0 (10_000_000, 1_700_000_000_000) {
    my $tag = "T0=$T0";
    my $I = $T0 / 1000;    # window index at t = 0
    my $S = $I % 256;      # ... as stored
    my $key = "rl:ctr:a$T0";
    my @z = ([$key, 'c', 10, 1000]);

    # limit 10, window 1000: ten at t=0, then the previous window's weight
    # falls from 1 (t=1000) through 1/2 (t=1500) to 0 (t=2000).
    steps("$tag fill", $T0, \@z,
        [0, '1 | 1 9 2000'],   # one unit more (10) once the estimate is <= 0: t=2000
        [0, '1 | 1 8 1500'],   # estimate <= 1: 2*(1000-e)/1000 <= 1 at e=500 of the next window
        [0, '1 | 1 7 1334'],   # 3*(1000-e)/1000 <= 2: e >= 333.3
        [0, '1 | 1 6 1250'],
        [0, '1 | 1 5 1200'],
        [0, '1 | 1 4 1167'],   # 6*(1000-e)/1000 <= 5: e >= 166.7
        [0, '1 | 1 3 1143'],   # e >= 142.9
        [0, '1 | 1 2 1125'],
        [0, '1 | 1 1 1112'],   # e >= 111.1
        [0, '1 | 1 0 1100'],
        [0, '0 | 0 0 1100'],   # 11th: fits when 10*(1000-e)/1000 <= 9, e >= 100 of the next window
    );
    is(counter_value($key), "$S:10:0", "$tag: value is <window % 256>:<current>:<previous>");
    is(length(redis_cmd('GET', $key)), 9, "$tag: the value is 9 bytes");
    steps("$tag slide", $T0, \@z,
        [999,  '0 | 0 0 101'],
        [1000, '0 | 0 0 100'],  # previous weight 1: estimate 10
        [1099, '0 | 0 0 1'],    # estimate 9.01
        [1100, '1 | 1 0 100'],  # estimate 9: fits; then 10 again until e=200
    );
    is(counter_value($key), ($S + 1) . ":1:10", "$tag: the count rolled to previous");
    steps("$tag half", $T0, \@z,
        [1500, '1 | 1 3 100'],               # previous weight 1/2: estimate 5 + 1, then + 1
        [1500, { cost => 0 }, '1 | 1 3 100'],  # a read: estimate 7, nothing stored
        [1500, { cost => 4 }, '0 | 0 3 100'],  # 7 + 4 > 10; fits when 10*(1000-e)/1000 + 2 <= 6
        [1500, { cost => 3 }, '1 | 1 0 100'],  # 7 + 3 = 10 fits exactly
        [1999, '1 | 1 3 1'],                 # estimate 0.01 + 5 + 1 = 6.01
    );
    is(counter_value($key), ($S + 1) . ":6:10", "$tag: cost 3 counted 3, cost 0 nothing");
    steps("$tag next", $T0, \@z,
        [2000, '1 | 1 3 167'],   # previous = 6 (weight 1) + 1; 6*(1000-e)/1000 + 1 <= 5 at e=166.7
    );
    is(counter_value($key), ($S + 2) . ":1:6", "$tag: new window, previous = 6");
    my $pttl = redis_cmd('PTTL', $key);
    ok($pttl <= 2000 && $pttl > 1900, "$tag TTL at e=0: PTTL $pttl <= 2w - e = 2000");

    # A gap of two windows forgets everything.
    steps("$tag gap", $T0, \@z,
        [4000, '1 | 1 9 2000'],
        [4250, '1 | 1 8 1250'],  # 2 - 1 = 1 more when 2*(1000-e)/1000 <= 1 in the next window
    );
    is(counter_value($key), ($S + 4) . ":2:0", "$tag: after a 2-window gap: fresh count");
    $pttl = redis_cmd('PTTL', $key);
    ok($pttl <= 1750 && $pttl > 1650, "$tag TTL at e=250: PTTL $pttl <= 2w - e = 1750");
    steps("$tag one window gap", $T0, \@z,
        [5100, '1 | 1 7 400'],   # estimate 2*0.9 + 1 = 2.8; 2*(1000-e)/1000 + 1 <= 2 at e=500
    );
    is(counter_value($key), ($S + 5) . ":1:2", "$tag: previous = the count of window 4");
    $pttl = redis_cmd('PTTL', $key);
    ok($pttl <= 1900 && $pttl > 1800, "$tag TTL at e=100: PTTL $pttl <= 1900");

    # A denial stores nothing and leaves the TTL alone.
    redis_cmd('PEXPIRE', $key, 30000);
    my $before = snapshot($key);
    steps("$tag deny", $T0, \@z, [5100, { cost => 8 }, '0 | 0 7 400']);
    is(snapshot($key), $before, "$tag: a denial changes nothing");
    $pttl = redis_cmd('PTTL', $key);
    ok($pttl <= 30000 && $pttl > 29000, "$tag: a denial does not touch the TTL ($pttl)");

    # The estimate read at several points (cost 0 only reads).
    my $rk = "rl:ctr:read$T0";
    my @r = ([$rk, 'c', 10, 1000]);
    steps("$tag estimate", $T0, \@r,
        [0,    { cost => 10 }, '1 | 1 0 1100'],
        [500,  { cost => 0 },  '1 | 1 0 600'],   # estimate 10
        [1000, { cost => 0 },  '1 | 1 0 100'],   # 10 * 1
        [1250, { cost => 0 },  '1 | 1 2 50'],    # 10 * 3/4 = 7.5
        [1500, { cost => 0 },  '1 | 1 5 100'],   # 10 * 1/2 = 5
        [1500, { cost => 10 }, '0 | 0 5 500'],   # 5 + 10 > 10; fits at estimate 0 (t=2000)
        [1900, { cost => 0 },  '1 | 1 9 100'],   # 10 * 1/10 = 1
        [1999, { cost => 0 },  '1 | 1 9 1'],     # 0.01
        [2000, { cost => 0 },  '1 | 1 10 0'],    # window 0 is two windows back: empty
    );
    is(counter_value($rk), "$S:10:0", "$tag: reads and the denial stored nothing");

    steps("$tag empty", $T0, [["rl:ctr:none$T0", 'c', 10, 1000]],
        [0, { cost => 0 }, '1 | 1 10 0'],
        [0, { cost => 11 }, '0 | 0 10 1000'],   # more than the limit: never fits
    );
    is(redis_cmd('EXISTS', "rl:ctr:none$T0"), 0, "$tag: a read and a denial create no key");

    # A window that is not a divisor of the clock: 60 per 60 s at e = 30 s.
    my $mk = "rl:ctr:min$T0";
    my $m0 = int($T0 / 60000) * 60000 + 60000;    # a window start
    steps("$tag minute", $m0, [[$mk, 'c', 60, 60000]],
        [0,     { cost => 40 }, '1 | 1 20 61500'],  # 41st unit: 40*(60000-e)/60000 <= 39 at e=1500 of the next window
        [90000, { cost => 0 },  '1 | 1 40 1500'],   # 40 * 1/2 = 20; 40*(60000-e)/60000 <= 19 at e = 31500
    );
    is(counter_value($mk), ($m0 / 60000 % 256) . ":40:0", "$tag minute: value");
}

# Two gateways whose clocks differ by a few ms (clock=nginx): a request
# stamped in window i after a gateway wrote window i+1 finds the stored index
# one ahead (age 255 modulo 256).  It is decided in that newer window (e = 0,
# the previous count weighed fully) and counted there; the newer window is
# never overwritten by an older one.  (Before the fix the value was treated
# as empty: t=999 was admitted, 3 in 2 ms, and overwrote the key with window
# i: 1, so that t=1001 was admitted too, 4 in 3 ms.)  reset_ms is then
# counted from the start of the newer window, 1 ms short for a gateway 1 ms
# behind.
{
    my $T0 = 10_000_000;
    my $S = $T0 / 1000 % 256;
    my $k = 'rl:ctr:skew';
    my @z = ([$k, 'c', 2, 1000]);
    steps('skew', $T0, \@z, [1000, '1 | 1 1 2000'], [1000, '1 | 1 0 1500']);
    my $before = snapshot($k);
    # t=999 is decided in window i+1 at e=0: 0 + 2 + 1 > 2; fits when
    # 2*(1000-e)/1000 + 1 <= 2 in the window after: e=500, 1500 from its start.
    steps('skew', $T0, \@z, [999, '0 | 0 0 1500']);
    is(snapshot($k), $before, 'skew: and the newer window\'s count is kept');
    steps('skew', $T0, \@z, [1001, '0 | 0 0 1499']);   # 2 already admitted at t=1000
    is(counter_value($k), ($S + 1) . ':2:0', 'skew: the newer window still holds 2');

    # Admitted from behind: counted in the newer window, with its previous count.
    # Limit 4: two at t=500 (window i), one at t=1000 (window i+1: previous 2).
    my $k4 = 'rl:ctr:skew4';
    my @z4 = ([$k4, 'c', 4, 1000]);
    steps('skew behind', $T0, \@z4,
        [500,  '1 | 1 3 1500'],
        [500,  '1 | 1 2 1000'],
        [1000, '1 | 1 1 500'],   # 2*(1000-e)/1000 + 1: one more when 2*(1000-e)/1000 <= 1, e=500
    );
    is(counter_value($k4), ($S + 1) . ':1:2', 'skew behind: window i+1: 1, previous 2');
    steps('skew behind', $T0, \@z4,
        [999, '1 | 1 0 500'],    # in window i+1 at e=0: 2 + 1 + 1 = 4 fits exactly
    );
    is(counter_value($k4), ($S + 1) . ':2:2', 'skew behind: counted in window i+1, previous kept');
    my $pttl = redis_cmd('PTTL', $k4);
    ok($pttl <= 2000 && $pttl > 1900, "skew behind: PTTL $pttl <= 2w - 0 = 2000");
    $before = snapshot($k4);
    steps('skew behind', $T0, \@z4,
        [999,  '0 | 0 0 500'],   # 2 + 2 + 1 > 4; fits when 2*(1000-e)/1000 + 2 <= 3, e=500
        [1000, '0 | 0 0 500'],
    );
    is(snapshot($k4), $before, 'skew behind: the denials changed nothing');
}

# The stored window index wraps at 256: window 256k + 255 is followed by
# 256k + 256, stored as 0, and still read as the previous window.
{
    my $w0 = (int(10_000_000 / 256_000) * 256 + 255) * 1000;    # a window whose index % 256 is 255
    my $k = 'rl:ctr:wrap';
    my @z = ([$k, 'c', 10, 1000]);
    steps('wrap', $w0, \@z, [0, { cost => 4 }, '1 | 1 6 1250']);   # 4*(1000-e)/1000 <= 3: e=250
    is(counter_value($k), '255:4:0', 'wrap: window index % 256 = 255');
    steps('wrap', $w0, \@z,
        [1500, '1 | 1 7 250'],   # 4 * 1/2 + 1 = 3; one more when 4*(1000-e)/1000 + 1 <= 2: e=750
    );
    is(counter_value($k), '0:1:4', 'wrap: the next window is stored as 0, the previous count kept');
    steps('wrap', $w0, \@z, [2000, '1 | 1 8 1000']);   # previous 1 (index 0), current 1 (index 1)
    is(counter_value($k), '1:1:1', 'wrap: and the one after as 1');
}

done_testing();

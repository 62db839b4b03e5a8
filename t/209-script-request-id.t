# The log with request-id members ("r"), run directly against Redis with an
# injected clock: the same decisions as the integer log ("l") at every step,
# the members are the ids passed in the burst field (<id>:<n> per unit of a
# costlier request), a rejected request leaves none, and a missing id is a bad
# argument.
use lib 't/lib';
use RLTest;
use RLTest::Script qw(:all);

my $T0 = 1_700_000_000_000;
my ($n, $same) = (0, 0);
srand(13);
for my $step (1 .. 400) {
    my $dt = $step * 7 + int(rand(40));
    my $cost = (0, 1, 1, 1, 2, 3)[int rand 6];
    my $l = decide($T0 + $dt, ['rl:eq:l', 'l', 5, 1000, $cost, 0]);
    my $r = decide($T0 + $dt, ['rl:eq:r', 'r', 5, 1000, $cost, sprintf('id%04d', $step)]);
    $n++;
    $same++ if verdict($l) eq verdict($r);
}
is($same, $n, "$n random decisions: the same verdicts as the integer log");
is(redis_cmd('ZCARD', 'rl:eq:r'), redis_cmd('ZCARD', 'rl:eq:l'), 'the same number of entries');
is(redis_cmd('PTTL', 'rl:eq:r') > 0 ? 1 : 0, 1, 'the key expires');

my $key = 'rl:audit:a';
is(verdict(decide($T0, [$key, 'r', 3, 1000, 1, 'aaaa'])), '1 | 1 2 1000', 'admitted');
is(verdict(decide($T0 + 10, [$key, 'r', 3, 1000, 2, 'bbbb'])), '1 | 1 0 990', 'cost 2 admitted');
is(verdict(decide($T0 + 20, [$key, 'r', 3, 1000, 1, 'cccc'])), '0 | 0 0 980', 'rejected');
is_deeply(redis_cmd('ZRANGE', $key, 0, -1, 'WITHSCORES'),
    ['aaaa', $T0, 'bbbb:1', $T0 + 10, 'bbbb:2', $T0 + 10],
    'members: the ids, <id>:<n> per unit, scored by the ms; none for the rejection');
like(verdict(decide($T0, ['rl:audit:b', 'r', 3, 1000, 1, ''])), qr/^ERR:.*bad arguments for zone 1/,
    'an empty id is a bad argument');
is(redis_cmd('EXISTS', 'rl:audit:b'), 0, 'and writes nothing');

done_testing();

# Leases on a Redis Cluster (issue 20): a key's reservations live on its node.
# Two workers with cluster=on hammer keys spread over three primaries with
# lease=auto: the access log (the decision's own time, $ratelimit_time) holds
# no window over the limit (RLTest::Audit), most admissions come from
# reservations, and a graceful stop gives every unspent unit back to the node
# that holds its key, so that each key then counts exactly what was admitted.
use lib 't/lib';
use RLTest;
use RLTest::Cluster;
use RLTest::Audit qw(check parse_log admissions_by_key log_format);

my $cluster = RLTest::Cluster->new(dir => servroot() . '/cluster', primaries => 3, replicas => 0)->start;
my @primaries = $cluster->primaries;
$ENV{TEST_NGINX_CLUSTER_PORT} = $primaries[0];

# Keys on every primary.
my (%on, @keys);
for my $i (1 .. 200) {
    my $node = $cluster->primary_of_slot($cluster->keyslot("rl:log:k$i"));
    next if ($on{$node} // 0) >= 2;
    $on{$node}++;
    push @keys, "k$i";
    last if @keys == 2 * @primaries;
}
is(scalar keys %on, scalar @primaries, 'hammered keys on every primary');

my $http = "    ratelimit_redis 127.0.0.1:\$TEST_NGINX_CLUSTER_PORT cluster=on timeout=2s;\n"
    . "    ratelimit_zone log  key=\$arg_k limit=40 window=2s lease=auto;\n"
    . "    ratelimit_zone long key=\$arg_k limit=100000 window=1h lease=auto;\n"
    . '    log_format audit "' . log_format('$ratelimit_time') . "\";\n"
    . "    access_log logs/audit.log audit;\n";
my $config = "    ratelimit_fail closed;\n    ratelimit_log_level info;\n"
    . "    location = /log  { ratelimit log; }\n"
    . "    location = /long { ratelimit long; }\n";
nginx()->write_html({ log => "ok\n", long => "ok\n" });
start_nginx(workers => 2, log_level => 'notice', http_config => $http, config => $config);

# Rounds of requests at once, every key in each, for about 5 s.
my $until = time + 5;
while (time < $until) {
    my @specs = map { my $k = $_; map { { port => server_port(), request => "GET /$_?k=$k&c=1" } } qw(log long) } (@keys) x 8;
    http_parallel(\@specs, timeout => 10);
}
ok(stop_nginx(), 'nginx quits gracefully, giving back what it holds');

open my $fh, '<', servroot() . '/logs/audit.log' or die "audit.log: $!";
my $bad = 0;
my $records = parse_log(do { local $/; <$fh> }, \$bad);
is($bad, 0, 'every access log line has the audit\'s shape');
my %status;
$status{"$_->{zone} $_->{rl_status}"}++ for @$records;
my $by = admissions_by_key($records,
    admitted => sub { $_[0]{status} == 200 && $_[0]{rl_status} =~ /^PASSED(_LEASE)?$/ },
    interval => sub { ($_[0]{time}, $_[0]{rl_status} eq 'PASSED' ? $_[0]{msec} + 10 : $_[0]{time}) });
for my $k (@keys) {
    my $res = check('sliding_log', $by->{log}{$k} || [], limit => 40, window => 2000);
    ok($res->{ok}, "log $k: never over 40 in 2 s ($res->{admissions} admitted, worst $res->{worst})")
        or diag(join "\n", @{ $res->{examples} || [] });
}
ok(($status{'log PASSED_LEASE'} // 0) > 0 && ($status{'long PASSED_LEASE'} // 0) > 0,
    'requests admitted from reservations in both zones')
    or diag(explain \%status);

# Each key's node counts what was admitted: the units left unspent were given back to it.
for my $k (@keys) {
    my $admitted = @{ $by->{long}{$k} || [] };
    my $node = $cluster->primary_of_slot($cluster->keyslot("rl:long:$k"));
    is($cluster->cmd($node, 'ZCARD', "rl:long:$k"), $admitted, "long $k: its node counts the $admitted admitted");
}
my $log = error_log_text();
check_no_alerts($log, 'lease cluster');
unlike($log, qr/\[error\]/, 'no decision failed');
$cluster->stop;
done_testing();

# docs/prometheus/ratelimit-rules.yml, the alerting and dashboard rules of docs/metrics.md:
# `promtool check rules` and `promtool test rules` pass, and every metric name and label value
# that its expressions (and the PromQL of docs/metrics.md) name is on a real metrics page of
# the module, so a renamed metric cannot leave an alert that never fires.
use lib 't/lib';
use RLTest;

my $repo = RLTest::Nginx::repo_root();
my $dir = "$repo/docs/prometheus";
my ($promtool) = grep { -x } map { "$_/promtool" } split /:/, $ENV{PATH};

SKIP: {
    skip 'promtool not installed (Debian: prometheus)', 2 unless $promtool;
    my $out = `cd $dir && $promtool check rules ratelimit-rules.yml 2>&1`;
    is($? >> 8, 0, 'promtool check rules') or diag($out);
    $out = `cd $dir && $promtool test rules ratelimit-rules.test.yml 2>&1`;
    is($? >> 8, 0, 'promtool test rules: the alerts fire when they should') or diag($out);
}

# The expressions: `expr:` values of the rules file (plain or `|` blocks), and the promql
# blocks of docs/metrics.md.
sub slurp { open my $fh, '<', $_[0] or die "$_[0]: $!"; local $/; <$fh> }
my @exprs;
my @lines = split /\n/, slurp("$dir/ratelimit-rules.yml");
for (my $i = 0; $i < @lines; $i++) {
    my ($indent, $v) = $lines[$i] =~ /^(\s*)(?:- )?expr:\s*(.*)$/ or next;
    if ($v eq '|') {
        $v = '';
        $v .= $lines[++$i] . "\n" while $i + 1 < @lines && $lines[$i + 1] =~ /^$indent\s+\S/;
    }
    push @exprs, $v;
}
cmp_ok(scalar @exprs, '>=', 9, 'the rules file has its expressions');
my $doc = slurp("$repo/docs/metrics.md");
push @exprs, grep { !/^\s*#/ && /\S/ } split /\n/, $_ for $doc =~ /```promql\n(.*?)```/gs;

start_nginx(http_config => <<'EOF', config => <<'EOF');
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_metrics_zone 64k;
    ratelimit_zone api key=$arg_k limit=1 window=1m;
EOF
    location /t { ratelimit api; }
    location = /metrics { ratelimit_metrics; }
EOF
http_get('/t?k=a') for 1 .. 2;
my $page = http_get('/metrics')->{body};
ok(stop_nginx(), 'nginx quits gracefully');
my (%names, %values);
for (split /\n/, $page) {
    next if /^#/;
    my ($name, $labels) = /^([a-z_]+)(?:\{(.*)\})? \S+$/ or next;
    $names{$name} = 1;
    $values{"$1=$2"} = 1 while ($labels // '') =~ /(\w+)="([^"]*)"/g;
}
ok($names{ratelimit_decisions_total}, 'the page has samples');

for my $e (@exprs) {
    (my $short = $e) =~ s/\s+/ /g;
    for my $m ($e =~ /\b(ratelimit_[a-z_]+)/g) {
        ok($names{$m}, "metric $m is on the page: $short");
    }
    while ($e =~ /\b(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"/g) {
        my ($label, $want) = ($1, $3);
        for my $v (split /\|/, $want) {
            ok($values{"$label=$v"}, "$label=\"$v\" is a label value on the page: $short");
        }
    }
}
check_no_alerts(error_log_text(), 'alert rules');
done_testing();

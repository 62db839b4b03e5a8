package RLTest::UpgradeZones;

# The zones whose keys t/fixtures/make-upgrade-fixture.pl records from an old release and
# t/295-upgrade-keys.t reads with this one: one list, so that the two can never disagree.

use strict;
use warnings;
use Exporter 'import';

our @EXPORT_OK = qw(upgrade_zones upgrade_config upgrade_html @UPGRADE_ZONES);

our @UPGRADE_ZONES = qw(log packed counter gcra monthly credits);

# http{} lines: the Redis server and the zones.
sub upgrade_zones {
    return <<'EOF';
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT;
    ratelimit_zone log     key=$arg_k limit=10  window=1h clock=nginx;
    ratelimit_zone packed  key=$arg_k limit=10  window=1h clock=nginx algorithm=sliding_log_packed;
    ratelimit_zone counter key=$arg_k limit=10  window=1h clock=nginx algorithm=sliding_counter;
    ratelimit_zone gcra    key=$arg_k limit=10  window=1h clock=nginx algorithm=gcra burst=5;
    ratelimit_zone monthly key=$arg_k limit=100 period=month clock=nginx;
    ratelimit_zone credits key=$arg_k limit=50  algorithm=balance missing=20 clock=nginx;
EOF
}

# server{} lines: a location per zone.
sub upgrade_config {
    return join '', map { "    location /$_ { ratelimit $_; }\n" } @UPGRADE_ZONES;
}

# A file for each location to serve, in the servroot's html directory.
sub upgrade_html {
    my ($dir) = @_;
    for my $zone (@UPGRADE_ZONES) {
        open my $f, '>', "$dir/$zone" or die "$dir/$zone: $!";
        print $f "ok\n";
    }
}

1;

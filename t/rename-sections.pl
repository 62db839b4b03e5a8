#!/usr/bin/perl
# Renames this harness's own sections in t/*.t files to their rl_ names, so
# that none can be taken for a Test::Nginx::Socket section (t/README.md):
#
#   --- redis        -> --- rl_redis_setup
#   --- redis_check  -> --- rl_redis_check
#   --- workers      -> --- rl_workers
#
#   perl t/rename-sections.pl t/*.t      (rewrites the files in place)
#
# The harness refuses the old names with a message naming the new one.
# Sections shared with Test::Nginx keep their names but take its meaning;
# t/README.md says what a block may need to change for that.
use strict;
use warnings;

my %new = (redis => 'rl_redis_setup', redis_check => 'rl_redis_check', workers => 'rl_workers');
for my $f (@ARGV) {
    open my $in, '<', $f or die "$f: $!\n";
    my $text = do { local $/; <$in> };
    close $in;
    my ($head, $data) = split /^(?=__DATA__\n)/m, $text, 2;
    next unless defined $data;
    my $n = ($data =~ s/^--- (redis|redis_check|workers)\b(?=[ :\n])/--- $new{$1}/mg);
    next unless $n;
    open my $out, '>', $f or die "$f: $!\n";
    print $out $head, $data;
    close $out;
    print "$f: $n section(s) renamed\n";
}

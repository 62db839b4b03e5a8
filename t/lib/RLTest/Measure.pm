package RLTest::Measure;

# Readings that suites compare against bounds: Redis' commandstats, a sample of
# the metrics page, a /proc/<pid>/status field.  Each one dies when it cannot
# read what it measures (no reply, a format it does not know, a missing
# sample), because a default of 0, -1 or undef makes `<=` bounds hold
# vacuously and the suite could never fail.  The parsers take text, so that
# t/002-measure.t checks them without servers; RLTest wraps them
# (`redis_calls`, `metric`, `proc_kb`).

use strict;
use warnings;
use Exporter 'import';
our @EXPORT_OK = qw(cmdstat_calls metric_value proc_status_kb);

# `INFO commandstats` text -> calls of $cmd (as Redis names it: `evalsha`,
# `script|load`).  A command not called since CONFIG RESETSTAT has no line, so
# 0 is an answer only when the reply is a readable commandstats section;
# `called => 1` says the caller knows it was called, and its absence dies too.
sub cmdstat_calls {
    my ($info, $cmd, %o) = @_;
    # INFO names commands in lower case: a name asked in upper case would read 0, never fail.
    $cmd = lc $cmd;
    die "commandstats: no text (got " . (defined $info ? ref $info : 'undef') . ")\n"
        if !defined $info || ref $info;
    $info =~ /^# Commandstats\r?$/m
        or die "commandstats: not an INFO commandstats reply:\n$info\n";
    my %calls;
    for (split /\r?\n/, $info) {
        next if /^#/ || !/\S/;
        /^cmdstat_([^:\s]+):calls=(\d+),/ or die "commandstats: unreadable line \"$_\"\n";
        $calls{$1} = $2;
    }
    return $calls{$cmd} if defined $calls{$cmd};
    die "commandstats: no line for $cmd, which was called\n" if $o{called};
    return 0;
}

# Prometheus text exposition -> the value of the one sample named $series:
# `name` (whatever its labels) or `name{labels as the page writes them}`.
# None or several such samples die: the figure would be a guess.
sub metric_value {
    my ($text, $series) = @_;
    die "metrics: no text\n" if !defined $text || ref $text;
    my @found;
    for (split /\n/, $text) {
        next if /^#/ || !/\S/;
        my ($name, $labels, $v) = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$/
            or die "metrics: unreadable line \"$_\"\n";
        my $full = $name . ($labels // '');
        push @found, $v if $series =~ /\{/ ? $full eq $series : $name eq $series;
    }
    die "metrics: no sample $series in:\n$text\n" unless @found;
    die "metrics: " . @found . " samples $series, not one\n" if @found > 1;
    die "metrics: $series is \"$found[0]\", not a number\n"
        unless $found[0] =~ /^-?\d+(\.\d+)?(e[-+]?\d+)?$/i;
    return $found[0];
}

# A `kB` field of /proc/<pid>/status (VmRSS, VmHWM ...), in kB.
sub proc_status_kb {
    my ($pid, $field, $file) = @_;
    $file //= "/proc/$pid/status";
    open my $fh, '<', $file or die "cannot read $file: $!\n";
    while (<$fh>) { return $1 if /^\Q$field\E:\s+(\d+)\s+kB$/ }
    die "no \"$field: <n> kB\" line in $file\n";
}

1;

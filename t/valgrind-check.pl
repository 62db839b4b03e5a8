#!/usr/bin/env perl
# Reads the memcheck logs of a valgrind run of t/ (t/valgrind.sh, or
# TEST_NGINX_VALGRIND=1 prove ...) and fails if any error record has a frame
# of this module.
#
#   t/valgrind-check.pl [-v] [DIR...]     (default: t/servroot)
#
# Every valgrind.*.log under the DIRs is read.  An error record is what
# memcheck reports between blank lines: invalid read/write, uninitialised
# value (conditional jump, use of, syscall param), invalid or mismatched
# free, overlapping memcpy, fishy argument, invalid jump, a fatal signal, and
# (with --leak-check=full) "definitely lost" blocks.  The record is the
# module's when one of its frames (or, for a bad address, one of the frames
# of the block's "alloc'd"/"free'd" stacks) is
#   - a function of the crate (ngx_http_ratelimit::..., mangled or not),
#   - code of the module's shared object (ngx_http_ratelimit_module.so,
#     libngx_http_ratelimit.so: the crate and the Rust code linked into it,
#     ngx, std), seen as "(in ...so)" without debug info, or
#   - a Rust source file (*.rs): nginx, glibc and OpenSSL are C.
# Those records are printed whole and make the exit status 1.
#
# Leaks: only "definitely lost" is reported (the harness passes
# --show-leak-kinds=definite).  nginx frees its cycle pool when a worker or
# the master exits and leaves the rest to exit(), so what is still pointed
# to (from globals, from the live cycle) is "still reachable" or "possibly
# lost" and is not a leak.  A block is "definitely lost" only when nothing
# points to it any more: request-time memory nobody freed, or heap memory
# owned by pool-allocated configuration whose pool was destroyed without
# running its Drop (which in the master also happens at every reload).
# Both are module defects, so every definitely-lost record allocated under a
# module frame counts.  nginx's own (the environment copy and the connection
# arrays of each worker, the cycle pools nginx -t leaves to exit) have no
# module frame; t/valgrind.supp hides them.  Memory of the module reachable
# only through such an nginx block is "indirectly lost" and not counted.
#
# A process killed by a signal it did not handle ("Process terminating with
# default action of signal N") fails the check wherever it happened.
#
# The summary also names logs without an ERROR SUMMARY line: processes that
# were SIGKILLed (a hung stop) or are still running; their errors up to that
# point are in the log and are counted.

use strict;
use warnings;
use File::Find;

my $verbose = 0;
@ARGV = grep { $_ eq '-v' ? (($verbose = 1), 0) : 1 } @ARGV;
my @dirs = @ARGV ? @ARGV : ('t/servroot');

my @files;
find({ no_chdir => 1, wanted => sub {
    push @files, $File::Find::name if -f $_ && m{/valgrind\.[^/]*\.log$};
} }, grep { -d } @dirs);
@files = sort @files;

my $error_re = join '|', map { "(?:$_)" } (
    'Invalid (?:read|write|free|jump|alignment|size)', 'Mismatched (?:free|delete)',
    'Conditional jump or move depends on uninitialised', 'Use of uninitialised value',
    'Syscall param .* (?:uninitialised|unaddressable)', 'Source and destination overlap',
    "Argument '.*' of function .* has a fishy", 'Jump to the invalid address',
    'Process terminating with default action', '.*realloc\\(\\) with size 0',
    '[\\d,]+ (?:\\([^)]*\\) )?bytes in [\\d,]+ blocks are definitely lost');
$error_re = qr/^(?:$error_re)/;
my $module_re = qr/ngx_http_ratelimit|\.rs:\d+\)|\(in [^)]*ratelimit[^)]*\.so\)/;

my (%kind, @mine, @incomplete, @crashes);
my ($records, $mine_lost_bytes, $lost_bytes, $summary_errors, $suppressed) = (0, 0, 0, 0, 0);
for my $file (@files) {
    open my $fh, '<', $file or do { warn "$file: $!\n"; next };
    my ($cur, @recs, $complete);
    while (my $line = <$fh>) {
        next unless $line =~ /^==(\d+)== ?(.*)$/;
        my $text = $2;
        if ($text =~ /^ERROR SUMMARY: (\d+) errors .*suppressed: (\d+)/) {
            $complete = 1; $summary_errors += $1; $suppressed += $2;
        }
        if ($text eq '') { undef $cur; next }
        if (!$cur) {
            $cur = { head => $text, lines => [] };
            push @recs, $cur;
        }
        push @{ $cur->{lines} }, $line;
    }
    push @incomplete, $file unless $complete;
    for my $r (@recs) {
        next unless $r->{head} =~ $error_re;
        # "at"/"by" lines of the record and of its "Address ... alloc'd/free'd" stacks.
        my @frames = grep { /^==\d+==\s+(?:at|by) 0x/ } @{ $r->{lines} };
        next unless @frames;    # e.g. "Process terminating" without a stack
        $records++;
        (my $k = $r->{head}) =~ s/\d[\d,]*/N/g;
        $k =~ s/ in loss record N of N//;
        $k =~ s/ \(N direct, N indirect\)//;
        $kind{$k}++;
        my ($bytes) = $r->{head} =~ /^([\d,]+) (?:\(.*\) )?bytes in .*definitely lost/;
        $bytes =~ tr/,//d if defined $bytes;
        $lost_bytes += $bytes if defined $bytes;
        push @crashes, $file if $r->{head} =~ /^Process terminating/;
        if (grep { $_ =~ $module_re } @frames) {
            $mine_lost_bytes += $bytes if defined $bytes;
            push @mine, [$file, $r];
        }
    }
}

for my $m (@mine) {
    my ($file, $r) = @$m;
    print "=== module error in $file\n", @{ $r->{lines} }, "\n";
}
print "valgrind-check: error kinds (all frames):\n" if %kind && $verbose;
if ($verbose) { printf "  %5d  %s\n", $kind{$_}, $_ for sort { $kind{$b} <=> $kind{$a} } keys %kind }
printf "valgrind-check: %d log files in %s\n", scalar @files, join(' ', @dirs);
printf "valgrind-check: %d error records (ERROR SUMMARY total %d, suppressed %d), %d definitely lost bytes in all\n",
    $records, $summary_errors, $suppressed, $lost_bytes;
printf "valgrind-check: %d records in module frames, %d definitely lost bytes in module frames\n",
    scalar @mine, $mine_lost_bytes;
printf "valgrind-check: %d processes ended on a fatal signal: %s\n",
    scalar @crashes, join(' ', @crashes) if @crashes;
printf "valgrind-check: %d logs without ERROR SUMMARY (killed or still running)%s\n",
    scalar @incomplete, $verbose ? ': ' . join(' ', @incomplete) : '' if @incomplete;
if (!@files) { print "valgrind-check: FAIL (no valgrind logs: was TEST_NGINX_VALGRIND set?)\n"; exit 2 }
print 'valgrind-check: ', (@mine || @crashes ? 'FAIL' : 'PASS'), "\n";
exit(@mine || @crashes ? 1 : 0);

package RLTest::Audit;

# The offline audit of the limiter's promise, "never over the limit", from
# what the gateways' access logs say was admitted (t/410-lease-guarantee.t).
# Pure Perl: parse_log() reads log text, the checks take one key's admissions
# and say whether the promise held for them and how close they came to the
# limit.  No Redis, no nginx: the suite unit-tests every check with small
# hand-made sequences that must pass and must fail.
#
# An admission is [lo, hi, cost]: a request of `cost` units that was admitted
# at some instant in [lo, hi], integer ms since the epoch (>= 0).  lo == hi
# when the log holds the decision's own time; when the log's time only trails
# the decision (nginx's $msec is taken in the log phase), the caller widens
# each admission to the interval the decision is known to lie in (see
# t/410-lease-guarantee.t).  A check reports only what certainly happened: a
# set of admissions whose intervals lie wholly inside one window (one period,
# one GCRA span, one counter bucket up to an instant) and that exceed what the
# promise allows there.  With lo == hi every check is exact: it flags a
# sequence if and only if the promise is broken.
#
# The promises, per algorithm (the script is lua/decide.lua; W = window,
# L = limit, all arithmetic on integers, exact while products stay < 2^63):
#
#   sliding_log, sliding_log_packed: at most L units admitted in any interval
#     (t - W, t].
#   sliding_counter: the counter's own estimate never exceeds L (a rolling
#     window can hold more, by design).  For an admission at t in bucket
#     b = floor(t / W), elapsed e = t - b*W:
#       ceil(prev * (W - e) / W) + cur <= L
#     prev = units admitted in bucket b - 1, cur = units admitted in bucket b
#     up to t, this admission and any other at the same ms included (the last
#     of them to run saw them all).  The script rounds the weighted part up,
#     and so does the audit.
#   gcra: the admissions are GCRA-conforming with T = W / L and `burst`:
#     virtual scheduling TAT := max(TAT, t) + cost*T, and TAT - t <= burst*T
#     after every admission; kept in units of 1/L ms (T is W of them), so
#     exact.  Equivalently: for any admissions i..j (time order), their units
#     * W <= (t_j - t_i) * L + burst * W; with intervals, the units certainly
#     inside [x, y] * W <= (y - x) * L + burst * W.
#   quota: at most L units admitted in one calendar period (hour or day, UTC
#     plus an offset in minutes).
#   balance: the units admitted in all never exceed what was credited.
#
# Each check returns { ok, admissions, units, worst, bound, worst_at,
# violations, examples }: worst is the largest figure compared with bound
# (window count, estimate, units ahead, period count, total drawn), worst_at
# says where, violations counts the instants (periods) over the bound and
# examples describes the first five.

use strict;
use warnings;
use Exporter 'import';

our @EXPORT_OK = qw(check sliding_log sliding_counter gcra quota balance
    log_format parse_log to_ms admissions_by_key summary @LOG_FIELDS);

# --- the access log

# What each line of the suite's access log holds, in order, space-separated.
# The first field is the decision's time: $ratelimit_time once the module sets
# it, $msec (log phase) until then; the second is always $msec, the third
# $request_time (ms since the request's first bytes were read), from which the
# caller bounds the decision when the first field is $msec.
our @LOG_FIELDS = qw(time msec request_time status rl_status uri key cost pid);
my @LOG_VARS = qw($msec $request_time $status $ratelimit_status $uri $arg_k $arg_c $pid);

# The log_format body for nginx.conf, given the decision-time variable.
sub log_format {
    my ($time_var) = @_;
    return join ' ', $time_var, @LOG_VARS;
}

# "1733060000.123" (the format of $msec, $request_time and $ratelimit_time) as
# integer ms; undef for anything else ("-" or empty: not set).
sub to_ms {
    my ($s) = @_;
    return undef unless defined $s && $s =~ /^(\d+)\.(\d{3})$/;
    return $1 * 1000 + $2;
}

# Log text -> [ { time, msec, request_time (ms, or undef), status, rl_status,
# uri, zone (the uri without its slash), key, cost, pid } ].  Lines of another
# shape are counted in $bad (a reference), never silently used.
sub parse_log {
    my ($text, $bad) = @_;
    my @out;
    for my $line (split /\n/, $text) {
        my @f = split / /, $line, -1;
        my %r;
        @r{@LOG_FIELDS} = @f;
        if (@f != @LOG_FIELDS || $r{status} !~ /^\d{3}$/ || !defined to_ms($r{msec})) {
            $$bad++ if $bad;
            next;
        }
        $r{$_} = to_ms($r{$_}) for qw(time msec request_time);
        ($r{zone} = $r{uri}) =~ s{^/}{};
        push @out, \%r;
    }
    return \@out;
}

# Records -> { zone => { key => [[lo, hi, cost], ...] } } for the records
# $admitted->($r) says were admitted, each with the interval $interval->($r)
# returns.  A record with no interval or a cost that is not a whole number
# dies: an admission the audit cannot place must not be dropped.
sub admissions_by_key {
    my ($records, %o) = @_;
    my $admitted = $o{admitted} || sub { $_[0]{status} == 200 };
    my %by;
    for my $r (@$records) {
        next unless $admitted->($r);
        my ($lo, $hi) = $o{interval}->($r);
        die "audit: an admission without a time: @$r{@LOG_FIELDS}\n" unless defined $lo && defined $hi;
        die "audit: an admission without a cost: @$r{@LOG_FIELDS}\n" unless $r->{cost} =~ /^\d+$/;
        push @{ $by{ $r->{zone} }{ $r->{key} } }, [$lo, $hi, $r->{cost}];
    }
    return \%by;
}

# --- helpers

# Integer floor(a / b) and ceil(a / b) for a >= 0, b > 0, exactly.
sub fdiv { my ($x, $y) = @_; use integer; return $x / $y }
sub cdiv { my ($x, $y) = @_; use integer; return ($x + $y - 1) / $y }

sub ms_text {
    my ($t) = @_;
    return sprintf '%d.%03d', fdiv($t, 1000), $t % 1000;
}

sub result {
    my ($adm, $bound) = @_;
    my $units = 0;
    $units += $_->[2] for @$adm;
    return { ok => 1, admissions => scalar @$adm, units => $units, worst => 0,
        worst_at => '', bound => $bound, violations => 0, examples => [] };
}

# Record a figure: the worst so far, and a violation when it exceeds $over
# (a number, or a code for figures that are not plain numbers).
sub observe {
    my ($res, $figure, $bad, $text) = @_;
    if ($figure > $res->{worst} || $res->{worst_at} eq '') {
        $res->{worst} = $figure;
        $res->{worst_at} = $text;
    }
    return unless $bad;
    $res->{ok} = 0;
    $res->{violations}++;
    push @{ $res->{examples} }, $text if @{ $res->{examples} } < 5;
}

sub points_only { !grep { $_->[0] != $_->[1] } @{ $_[0] } }

sub need {
    my ($o, @names) = @_;
    for (@names) {
        die "audit: $_ must be a positive integer\n" unless defined $o->{$_} && $o->{$_} =~ /^\d+$/ && $o->{$_} > 0;
    }
}

# --- the checks

# sliding_log: for each instant u that ends some admission's interval, the
# units certainly in (u - W, u] (lo > u - W and hi <= u).  The worst window
# ends at an admission's hi, so these instants cover every window.
sub sliding_log {
    my ($adm, %o) = @_;
    need(\%o, qw(limit window));
    my ($limit, $w) = @o{qw(limit window)};
    my @a = sort { $a->[1] <=> $b->[1] || $a->[0] <=> $b->[0] } @$adm;
    my $res = result(\@a, $limit);
    my $first = 0;
    for my $j (0 .. $#a) {
        next if $j < $#a && $a[$j + 1][1] == $a[$j][1];
        my $u = $a[$j][1];
        # An interval ending at or before u - W cannot lie inside the window.
        $first++ while $a[$first][1] <= $u - $w;
        my ($sum, $n) = (0, 0);
        for my $i ($first .. $j) {
            next unless $a[$i][0] > $u - $w;
            $sum += $a[$i][2];
            $n++;
        }
        observe($res, $sum, $sum > $limit, sprintf('%d units (%d admissions) in (%s, %s]',
            $sum, $n, ms_text($u - $w), ms_text($u)));
    }
    return $res;
}

# sliding_counter: per bucket b, the admissions certainly in b (lo and hi in
# b) in order of hi; at each hi y, cur = the units certainly in b ending by y,
# prev = the units certainly in b - 1, the estimate taken at elapsed y - b*W
# (the latest the decision can have been: the smallest weight).  Admissions
# whose interval straddles a bucket's edge are left out of both counts, which
# only lowers the estimate (counted in `straddling`).
sub sliding_counter {
    my ($adm, %o) = @_;
    need(\%o, qw(limit window));
    my ($limit, $w) = @o{qw(limit window)};
    my $res = result($adm, $limit);
    my %in;
    $res->{straddling} = 0;
    for my $r (@$adm) {
        my $bucket = fdiv($r->[0], $w);
        if ($bucket == fdiv($r->[1], $w)) { push @{ $in{$bucket} }, $r } else { $res->{straddling}++ }
    }
    for my $bucket (sort { $a <=> $b } keys %in) {
        my $prev = 0;
        $prev += $_->[2] for @{ $in{ $bucket - 1 } || [] };
        my @r = sort { $a->[1] <=> $b->[1] } @{ $in{$bucket} };
        my $cur = 0;
        for my $j (0 .. $#r) {
            $cur += $r[$j][2];
            next if $j < $#r && $r[$j + 1][1] == $r[$j][1];
            my $e = $r[$j][1] - $bucket * $w;
            my $weighted = cdiv($prev * ($w - $e), $w);
            my $est = $weighted + $cur;
            observe($res, $est, $est > $limit, sprintf('estimate %d = ceil(%d x %d/%d) + %d at %s',
                $est, $prev, $w - $e, $w, $cur, ms_text($r[$j][1])));
        }
    }
    return $res;
}

# gcra: virtual scheduling on exact instants; with intervals, every span
# [x, y] between an admission's lo and another's hi against the units certainly
# inside it.  worst is in units of T: how far the TAT ran ahead (<= burst).
sub gcra {
    my ($adm, %o) = @_;
    need(\%o, qw(limit window burst));
    my ($limit, $w, $burst) = @o{qw(limit window burst)};
    my $res = result($adm, $burst);
    my $bound = $burst * $w;    # burst * T in 1/limit ms
    my @a = sort { $a->[1] <=> $b->[1] } @$adm;
    if (points_only(\@a) && !$o{intervals}) {
        my $tat;
        for my $r (@a) {
            my $t = $r->[1] * $limit;
            $tat = $t if !defined $tat || $tat < $t;
            $tat += $r->[2] * $w;
            my $ahead = $tat - $t;
            observe($res, $ahead / $w, $ahead > $bound, sprintf('TAT %.3f T ahead at %s (cost %d)',
                $ahead / $w, ms_text($r->[1]), $r->[2]));
        }
        return $res;
    }
    # [lo, cost] of the admissions ending by y, by lo descending.
    my @los;
    for my $j (0 .. $#a) {
        my $p = 0;
        $p++ while $p < @los && $los[$p][0] > $a[$j][0];
        splice @los, $p, 0, [$a[$j][0], $a[$j][2]];
        next if $j < $#a && $a[$j + 1][1] == $a[$j][1];
        my $y = $a[$j][1];
        my ($units, $worst, $worst_x) = (0, undef, undef);
        for my $k (0 .. $#los) {
            $units += $los[$k][1];
            next if $k < $#los && $los[$k + 1][0] == $los[$k][0];
            my $x = $los[$k][0];
            my $ahead = $units * $w - ($y - $x) * $limit;
            ($worst, $worst_x) = ($ahead, $x) if !defined $worst || $ahead > $worst;
            observe($res, $ahead / $w, 1, sprintf('%d units in [%s, %s]: %.3f T over',
                $units, ms_text($x), ms_text($y), ($ahead - $bound) / $w)) if $ahead > $bound;
        }
        observe($res, $worst / $w, 0, sprintf('TAT %.3f T ahead at %s (span from %s)',
            $worst / $w, ms_text($y), ms_text($worst_x)));
    }
    return $res;
}

# quota: units per calendar period; admissions whose interval straddles a
# period's edge are left out (counted in `straddling`).
sub quota {
    my ($adm, %o) = @_;
    need(\%o, qw(limit));
    my $len = { hour => 3_600_000, day => 86_400_000 }->{ $o{period} // '' }
        or die "audit: quota period must be hour or day\n";
    my $off = ($o{utc_offset_min} // 0) * 60_000;
    my $res = result($adm, $o{limit});
    my %sum;
    $res->{straddling} = 0;
    for my $r (@$adm) {
        my $p = fdiv($r->[0] + $off, $len);
        if ($p == fdiv($r->[1] + $off, $len)) { $sum{$p} += $r->[2] } else { $res->{straddling}++ }
    }
    for my $p (sort { $a <=> $b } keys %sum) {
        observe($res, $sum{$p}, $sum{$p} > $o{limit}, sprintf('%d units in the %s from %s',
            $sum{$p}, $o{period}, ms_text($p * $len - $off)));
    }
    return $res;
}

# balance: everything drawn against everything credited.
sub balance {
    my ($adm, %o) = @_;
    die "audit: balance needs credited => N\n" unless defined $o{credited} && $o{credited} =~ /^\d+$/;
    my $res = result($adm, $o{credited});
    observe($res, $res->{units}, $res->{units} > $o{credited},
        sprintf('%d units drawn of %d credited', $res->{units}, $o{credited}));
    return $res;
}

# By the name nginx.conf uses for the algorithm.
sub check {
    my ($algorithm, $adm, %o) = @_;
    my %by = (sliding_log => \&sliding_log, sliding_log_packed => \&sliding_log,
        sliding_counter => \&sliding_counter, gcra => \&gcra, quota => \&quota, balance => \&balance);
    my $f = $by{$algorithm} or die "audit: no check for algorithm $algorithm\n";
    return $f->($adm, %o);
}

# One line for a test name or a note.
sub summary {
    my ($res) = @_;
    my $w = $res->{worst} == int($res->{worst}) ? $res->{worst} : sprintf('%.3f', $res->{worst});
    return sprintf '%d admissions (%d units), worst %s of %s%s', $res->{admissions},
        $res->{units}, $w, $res->{bound}, $res->{ok} ? '' : ", $res->{violations} over";
}

1;

package RLTest::Script;

# The decision script, run directly against the harness's real redis-server
# (no nginx).  script_text() assembles it exactly as src/decide/script/mod.rs does:
# the files named by the include_str!("../../../lua/X.lua") entries of
# `pub const SCRIPT: &str = concat!(...)`, in that order, with nothing
# between them.  So the tests run precisely the text the module sends.
#
#   use lib 't/lib';
#   use RLTest;                       # gives redis_cmd etc. (plain Test::More style)
#   use RLTest::Script qw(:all);
#
#   my $d = decide(1000, ['rl:z:a', 'l', 10, 1000], ['rl:y:a', 'g', 10, 1000, 1, 5]);
#   $d->{allowed}; $d->{zones}[0]{ok}, {remaining}, {reset}
#   verdict($d)                       # "1 | 1 9 1000 | 1 4 100": allowed | ok remaining reset ...
#   zone_fields($raw, [7, 3], \&rid)  # the same of a decide_raw reply with 7-field zones
#   decide_raw(\@keys, @argv)         # the reply as Redis gave it (array, or an Error object)
#   batch_raw([\@keys, @argv], ...)   # several decisions in one call: the reply as Redis gave it
#   batch_argv([\@keys, @argv], ...)  # (\@keys, @argv) of that call, for EVAL or a wrapper
#   steps($name, $t0, \@zones, [$dt, $expected], [$dt, {cost => 3}, $expected], ...)
#                                     # a literal table: decision at $t0 + $dt must be $expected
#   snapshot(@keys)                   # every key's type, value and whether it has a TTL, as one string
#   counter_value($key)               # a sliding_counter key decoded: "<window index % 256>:<current>:<previous>"
#   gcra_value($key, $limit)          # a gcra key decoded: "<ms>+<r>/<limit>", the TAT ms + r/limit exactly
#
# A zone is [key, algorithm letter, limit, window_ms, cost (default 1),
# burst (default 0)] or { key, alg, limit, window, cost, burst }.  $now_ms
# undef or '' sends "" (the script then reads Redis TIME).

use strict;
use warnings;
use Exporter 'import';
use File::Basename qw(dirname);
use Cwd qw(abs_path);
use Digest::SHA qw(sha1_hex);
use Time::HiRes ();
use RLTest ();

our @EXPORT_OK = qw(script_text script_parts script_sha load_script decide decide_raw batch_raw batch_argv
    verdict zone_fields redis_error is_error steps snapshot counter_value gcra_value);
our %EXPORT_TAGS = (all => \@EXPORT_OK);

my $repo = abs_path(dirname(__FILE__) . '/../../..');
# Where `SCRIPT` is, relative to the repo.
my $SCRIPT_RS = 'src/decide/script/mod.rs';

sub slurp {
    my ($path) = @_;
    open my $fh, '<:raw', $path or die "RLTest::Script: $path: $!\n";
    local $/;
    my $s = <$fh>;
    return $s;
}

# The lua/ files of SCRIPT, in concat! order, as paths relative to the repo.
sub script_parts {
    my $rs = slurp("$repo/$SCRIPT_RS");
    my ($body) = $rs =~ /\bconst\s+SCRIPT\s*:\s*&(?:'static\s+)?str\s*=\s*concat!\s*\((.*?)\)\s*;/s
        or die "RLTest::Script: no `const SCRIPT: &str = concat!(...);` in $SCRIPT_RS\n";
    # Rust comments inside the list are not part of it.
    $body =~ s{//[^\n]*}{}g;
    $body =~ s{/\*.*?\*/}{}gs;
    my @parts;
    while ($body =~ /\G\s*include_str!\s*\(\s*"([^"]+)"\s*\)\s*(?:,|\z)/gc) {
        push @parts, $1;
    }
    $body =~ /\G\s*\z/gc
        or die "RLTest::Script: SCRIPT holds something other than include_str! entries: "
            . substr($body, pos($body) // 0) . "\n";
    die "RLTest::Script: SCRIPT includes no file\n" unless @parts;
    # include_str! paths are relative to the file's directory.
    (my $dir = $SCRIPT_RS) =~ s{/[^/]*\z}{};
    return map {
        my @path = split m{/}, "$dir/$_";
        my @out;
        for (@path) { $_ eq '..' ? pop @out : push @out, $_ }
        join '/', @out;
    } @parts;
}

my $text;
sub script_text {
    return $text //= join '', map { slurp("$repo/$_") } script_parts();
}

sub script_sha { sha1_hex(script_text()) }

sub is_error { ref $_[0] eq 'RLTest::Redis::Error' }

# The message of an error reply, or undef when the reply is not an error.
sub redis_error { is_error($_[0]) ? $_[0]->message : undef }

sub load_script {
    my $r = RLTest::redis_cmd('SCRIPT', 'LOAD', script_text());
    die "RLTest::Script: SCRIPT LOAD failed: " . $r->message . "\n" if is_error($r);
    die "RLTest::Script: SCRIPT LOAD answered $r, expected " . script_sha() . "\n"
        unless $r eq script_sha();
    return $r;
}

# EVALSHA, and after NOSCRIPT (a flushed or restarted Redis) SCRIPT LOAD and
# EVALSHA again: the reply as Redis gave it.
sub evalsha {
    my ($keys, @argv) = @_;
    my @cmd = (scalar @$keys, @$keys, @argv);
    my $r = RLTest::redis_cmd('EVALSHA', script_sha(), @cmd);
    if (is_error($r) && $r->message =~ /^NOSCRIPT/) {
        load_script();
        $r = RLTest::redis_cmd('EVALSHA', script_sha(), @cmd);
    }
    return $r;
}

# The keys and arguments of one call deciding each [\@keys, @argv] in order:
# every decision's keys, then every decision's @argv.
sub batch_argv {
    my (@keys, @argv);
    for my $d (@_) {
        my ($keys, @a) = @$d;
        push @keys, @$keys;
        push @argv, @a;
    }
    return (\@keys, @argv);
}

sub batch_raw { evalsha(batch_argv(@_)) }

sub decide_raw { evalsha(@_) }

sub zone_spec {
    my ($z) = @_;
    if (ref $z eq 'HASH') {
        return { key => $z->{key}, alg => $z->{alg}, limit => $z->{limit},
            window => $z->{window}, cost => $z->{cost} // 1, burst => $z->{burst} // 0 };
    }
    my ($key, $alg, $limit, $window, $cost, $burst) = @$z;
    return { key => $key, alg => $alg, limit => $limit, window => $window,
        cost => $cost // 1, burst => $burst // 0 };
}

# One decision: { allowed, zones => [{ ok, remaining, reset }, ...], raw }, or
# the RLTest::Redis::Error of an error reply.  Dies on a reply of the wrong shape.
sub decide {
    my ($now, @zones) = @_;
    my @z = map { zone_spec($_) } @zones;
    return decision_of(decide_raw(decision_argv($now, @z)), @z);
}

# The keys and arguments of one decision over zone specs.
sub decision_argv {
    my ($now, @z) = @_;
    return ([map { $_->{key} } @z], $now // '', map { @$_{qw(alg limit window cost burst)} } @z);
}

# A decision's reply read as decide() returns it.
sub decision_of {
    my ($r, @z) = @_;
    return $r if is_error($r);
    die "RLTest::Script: reply is not an array of 1 + 3 x " . @z . " integers: "
        . RLTest::Redis::format_reply($r) . "\n"
        unless ref $r eq 'ARRAY' && @$r == 1 + 3 * @z && !grep { !defined || /\D/ } @$r;
    my @v;
    for my $i (0 .. $#z) {
        push @v, { ok => $r->[1 + 3 * $i], remaining => $r->[2 + 3 * $i],
            reset => $r->[3 + 3 * $i] };
    }
    return { allowed => $r->[0], zones => \@v, raw => $r };
}

# A decision as one line, for literal expectation tables:
# "allowed | ok remaining reset | ..." or "ERR:<message>" (or "RAW:<reply>" for
# a decide_raw reply that is not an error).
sub verdict {
    my ($d) = @_;
    return 'ERR:' . $d->message if is_error($d);
    return 'RAW:' . RLTest::Redis::format_reply($d) if ref $d ne 'HASH';    # decide_raw's reply
    return join ' | ', $d->{allowed}, map { "$_->{ok} $_->{remaining} $_->{reset}" } @{ $d->{zones} };
}

# A decide_raw reply as one line, "allowed | fields of zone 1 | ...", zone i answering
# $n->[i] fields: 3, or 7 for a zone with a reservation, a delay or a placement (ok remaining
# reset granted lease_ms token rid), whose rid is not shown but handed to $rid->(i, rid); "BAD
# RID" when a grant and its rid disagree, "ERR:" and "RAW:" as verdict's.
sub zone_fields {
    my ($r, $n, $rid) = @_;
    return 'ERR:' . $r->message if is_error($r);
    return 'RAW:' . RLTest::Redis::format_reply($r) if ref $r ne 'ARRAY';
    my @v = @$r;
    my @out = (shift @v);
    for my $i (0 .. $#$n) {
        my @z = splice(@v, 0, $n->[$i]);
        return 'RAW:' . RLTest::Redis::format_reply($r) if @z < $n->[$i];
        if ($n->[$i] == 7) {
            my $id = pop @z;
            return "BAD RID $id for @z" if ($z[3] > 0) != ($id > 0);
            $rid->($i, $id) if $id && $rid;
        }
        push @out, join ' ', @z;
    }
    return 'RAW:' . RLTest::Redis::format_reply($r) if @v;
    return join ' | ', @out;
}

# Runs a table of decisions against literal expectations.  A step is
# [$dt, $expected] or [$dt, \%o, $expected] with %o: cost => N (every zone),
# costs => [N, ...] (per zone), note => text for the test name.
sub steps {
    my ($name, $t0, $zones, @steps) = @_;
    # Keys expire on Redis's real clock (PX is relative), whatever the injected one says: a
    # machine stalled between two steps for longer than a short TTL (a quota's last ms: 1 ms)
    # lost a key.  Redis (7.0+) freezes its clock for expiry within a transaction, so the whole
    # table is one MULTI ... EXEC and no real time passes between its steps.
    load_script();
    my @checks;
    RLTest::redis_cmd('MULTI');
    for my $s (@steps) {
        my ($dt, $o, $want) = @$s == 2 ? ($s->[0], {}, $s->[1]) : @$s;
        my @z = map { zone_spec($_) } @$zones;
        for my $i (0 .. $#z) {
            $z[$i]{cost} = $o->{cost} if defined $o->{cost};
            $z[$i]{cost} = $o->{costs}[$i] if $o->{costs};
        }
        my $costs = join ',', map { $_->{cost} } @z;
        my ($keys, @argv) = decision_argv($t0 + $dt, @z);
        RLTest::redis_cmd('EVALSHA', script_sha(), scalar @$keys, @$keys, @argv);
        push @checks, [\@z, $want, "$name: t=$dt cost=$costs" . ($o->{note} ? " ($o->{note})" : '')];
    }
    my $replies = RLTest::redis_cmd('EXEC');
    die "RLTest::Script: EXEC failed: " . RLTest::Redis::format_reply($replies) . "\n"
        unless ref $replies eq 'ARRAY' && @$replies == @checks;
    for my $i (0 .. $#checks) {
        my ($z, $want, $test) = @{ $checks[$i] };
        Test::More::is(verdict(decision_of($replies->[$i], @$z)), $want, $test);
    }
}

# A string value as text: as it is when printable, else "hex:<bytes in hex>"
# (the counter and gcra values are packed binary).
sub show_bytes {
    my ($v) = @_;
    return $v if !defined $v || ref $v || $v =~ /\A[\x20-\x7e]*\z/;
    return 'hex:' . unpack('H*', $v);
}

# The stored values of sliding_counter and gcra, decoded.  Both are strings of a
# fixed length packed by the script with Lua's struct.pack; a key that does not
# exist gives undef, another reply (an error) or a string of another length a
# "BAD:..." text that no expectation matches.
sub packed_value {
    my ($key, $len) = @_;
    my $v = RLTest::redis_cmd('GET', $key);
    return undef unless defined $v;
    return 'BAD:' . RLTest::Redis::format_reply($v) if ref $v;
    return sprintf('BAD:%d bytes, not %d:%s', length $v, $len, show_bytes($v)) if length $v != $len;
    return $v;
}

# sliding_counter: struct.pack('<BI4I4', window index % 256, current, previous),
# 9 bytes; as "<window index % 256>:<current>:<previous>".
sub counter_value {
    my ($key) = @_;
    my $v = packed_value($key, 9);
    return $v if !defined $v || $v =~ /^BAD:/;
    return join ':', unpack('C V V', $v);
}

# gcra: struct.pack('<dI4', ms, r), 12 bytes, the TAT being exactly ms + r/limit
# (ms a whole number of ms held in a double, 0 <= r < limit); as "<ms>+<r>/<limit>",
# $limit being the zone's limit (only shown, and checked against r).  A ms that is
# not a whole number shows with its fraction, so it never matches an expectation.
sub gcra_value {
    my ($key, $limit) = @_;
    my $v = packed_value($key, 12);
    return $v if !defined $v || $v =~ /^BAD:/;
    my ($ms, $r) = unpack('d< V', $v);
    my $m = $ms == int($ms) ? sprintf('%.0f', $ms) : sprintf('%.17g', $ms);
    return "BAD:r=$r >= limit $limit (ms $m)" if defined $limit && $r >= $limit;
    return "$m+$r/" . ($limit // '?');
}

# What the keys hold, for "nothing changed" checks: type, content, and whether
# a TTL is set.  Sorted sets with scores, strings as they are (in hex when not
# printable: the packed counter and gcra values).
sub snapshot {
    my @out;
    for my $k (@_) {
        my $type = RLTest::redis_cmd('TYPE', $k);
        my $v = $type eq 'zset'   ? RLTest::redis_cmd('ZRANGE', $k, 0, -1, 'WITHSCORES')
              : $type eq 'string' ? show_bytes(RLTest::redis_cmd('GET', $k))
              : $type eq 'list'   ? RLTest::redis_cmd('LRANGE', $k, 0, -1)
              : $type eq 'hash'   ? RLTest::redis_cmd('HGETALL', $k)
              : undef;
        my $ttl = RLTest::redis_cmd('PTTL', $k);
        push @out, "$k=$type:" . RLTest::Redis::format_reply($v)
            . ($ttl == -1 ? ':persist' : $ttl >= 0 ? ':ttl' : '');
    }
    return join ' ; ', @out;
}

1;

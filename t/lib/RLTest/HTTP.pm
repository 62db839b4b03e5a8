package RLTest::HTTP;

# Minimal HTTP/1.1 client: enough to see status, headers and body exactly as
# nginx sent them, one at a time or many in flight at once.

use strict;
use warnings;
use Exporter 'import';
use IO::Socket::INET;
use IO::Select;
use Time::HiRes qw(time);

our @EXPORT_OK = qw(http_request http_start http_finish http_parallel http_pipelined header);

# Build the request bytes.  $req is "GET /path" (HTTP/1.1 added), optionally
# followed by a body after the first line, as in Test::Nginx's --- request.
sub build_request {
    my (%o) = @_;
    my ($line, $body) = split /\n/, $o{request}, 2;
    $line =~ s/\s+$//;
    $line .= ' HTTP/1.1' unless $line =~ m{ HTTP/\d\.\d$};
    $body = $o{body} if defined $o{body};
    my @h = @{ $o{headers} || [] };
    my %has = map { lc $_->[0] => 1 } @h;
    unshift @h, ['Host', 'localhost'] unless $has{host};
    push @h, ['Connection', $o{keepalive} ? 'keep-alive' : 'close'] unless $has{connection};
    push @h, ['Content-Length', length $body]
        if defined $body && length $body && !$has{'content-length'};
    my $s = "$line\r\n";
    $s .= "$_->[0]: $_->[1]\r\n" for @h;
    return $s . "\r\n" . ($body // '');
}

# Headers as [name, value] pairs from "Name: value" lines, a hash or pairs.
sub header_pairs {
    my ($h) = @_;
    return [] unless defined $h;
    return $h if ref $h eq 'ARRAY';
    return [map { [$_, $h->{$_}] } sort keys %$h] if ref $h eq 'HASH';
    return [map { /^\s*([^:\s]+)\s*:\s*(.*?)\s*$/ ? [$1, $2] : () } split /\n/, $h];
}

# Returns a parsed response once $buf holds a complete one, else undef.
# $eof says the peer closed, which completes a close-delimited body.
sub parse_response {
    my ($buf, $eof, $head_only) = @_;
    my $end = index $buf, "\r\n\r\n";
    return if $end < 0;
    my ($status_line, @lines) = split /\r\n/, substr($buf, 0, $end);
    my ($proto, $status, $reason) = $status_line =~ m{^(HTTP/\d\.\d) (\d{3}) ?(.*)$}
        or return { error => "bad status line: $status_line", raw => $buf };
    my (%headers, @order);
    for (@lines) {
        my ($n, $v) = /^([^:]+):\s*(.*?)\s*$/ or next;
        push @{ $headers{lc $n} }, $v;
        push @order, [$n, $v];
    }
    my $rest = substr $buf, $end + 4;
    my $res = { status => $status + 0, reason => $reason, proto => $proto,
        headers => \%headers, header_list => \@order };
    my $cl = $headers{'content-length'};
    my $te = $headers{'transfer-encoding'};
    my $body;
    if ($head_only || $status == 204 || $status == 304 || $status < 200) {
        $body = '';
        $res->{consumed} = $end + 4;
    } elsif ($te && $te->[0] =~ /chunked/i) {
        $body = '';
        my $p = 0;
        while (1) {
            my $e = index $rest, "\r\n", $p;
            return if $e < 0;
            my $size = hex substr($rest, $p, $e - $p);
            if ($size == 0) {
                my $t = index $rest, "\r\n\r\n", $e;
                return if $t < 0;
                $res->{consumed} = $end + 4 + $t + 4;
                last;
            }
            return if length($rest) < $e + 2 + $size + 2;
            $body .= substr $rest, $e + 2, $size;
            $p = $e + 2 + $size + 2;
        }
    } elsif ($cl) {
        return if length($rest) < $cl->[0];
        $body = substr $rest, 0, $cl->[0];
        $res->{consumed} = $end + 4 + $cl->[0];
    } else {
        return unless $eof;
        $body = $rest;
        $res->{consumed} = length $buf;
    }
    $res->{body} = $body;
    return $res;
}

sub header {
    my ($res, $name) = @_;
    my $v = $res->{headers}{lc $name};
    return $v ? join(', ', @$v) : undef;
}

# $port may be "host:port" (an nginx in a network namespace, RLTest::Netns).
sub connect_to {
    my ($port, $timeout) = @_;
    my $host = $port =~ s/^(.+):(\d+)$/$2/ ? $1 : '127.0.0.1';
    return IO::Socket::INET->new(PeerAddr => $host, PeerPort => $port,
        Proto => 'tcp', Timeout => $timeout || 5);
}

# One request.  Options: port, request ("GET /x"), headers, body, timeout,
# keepalive + sock (reuse a connection), abort_after (close the socket after
# that many seconds without waiting for the answer).
sub http_request {
    my (%o) = @_;
    my $h = http_start(%o);
    return $h if $h->{error};
    return http_finish($h, $o{abort_after} // $o{timeout}, defined $o{abort_after});
}

# Send a request and return at once; http_finish collects the answer.  Lets
# a test hold a request in flight while it does something else.
sub http_start {
    my (%o) = @_;
    my $start = time;
    my $sock = $o{sock} || connect_to($o{port}, $o{timeout})
        or return { error => "connect: $!", elapsed => time - $start };
    my $data = $o{raw} // build_request(%o, headers => header_pairs($o{headers}));
    while (length $data) {
        my $n = syswrite $sock, $data;
        return { error => "write: $!", elapsed => time - $start } unless defined $n;
        substr($data, 0, $n, '');
    }
    return { sock => $sock, start => $start, keepalive => $o{keepalive},
        head => scalar((($o{request} // '') =~ /^HEAD /)), buf => '' };
}

# Wait up to $timeout seconds for the answer.  With $abort the socket is
# closed at the deadline and { aborted => 1 } returned.
sub http_finish {
    my ($h, $timeout, $abort) = @_;
    my $sock = $h->{sock};
    my $sel = IO::Select->new($sock);
    my $deadline = time + ($timeout || 10);
    while (1) {
        my $left = $deadline - time;
        if ($left <= 0 || !$sel->can_read($left)) {
            next if time < $deadline;
            close $sock;
            return { aborted => 1, elapsed => time - $h->{start}, raw => $h->{buf} } if $abort;
            return { error => 'timeout', elapsed => time - $h->{start}, raw => $h->{buf} };
        }
        my $n = sysread $sock, $h->{buf}, 65536, length $h->{buf};
        my $res = parse_response($h->{buf}, !$n, $h->{head});
        if ($res) {
            $res->{elapsed} = time - $h->{start};
            $res->{raw} = $h->{buf};
            if ($h->{keepalive}) { $res->{sock} = $sock } else { close $sock }
            return $res;
        }
        unless ($n) {
            close $sock;
            return { error => defined $n ? 'connection closed' : "read: $!",
                elapsed => time - $h->{start}, raw => $h->{buf} };
        }
    }
}

# Several requests written at once on one keep-alive connection (HTTP
# pipelining); the answers come back in order.  Returns them as a list.
sub http_pipelined {
    my ($port, $requests, %o) = @_;
    my $raw = join '', map {
        build_request(request => $requests->[$_], headers => [],
            keepalive => $_ < $#$requests)
    } 0 .. $#$requests;
    my $h = http_start(port => $port, raw => $raw);
    return ($h) if $h->{error};
    my $sel = IO::Select->new($h->{sock});
    my $deadline = time + ($o{timeout} || 10);
    my (@res, $eof);
    while (@res < @$requests && time < $deadline) {
        my $head = $requests->[@res] =~ /^HEAD /;
        if (my $r = parse_response($h->{buf}, $eof, $head)) {
            substr($h->{buf}, 0, $r->{consumed}, '');
            push @res, $r;
            next;
        }
        last if $eof;
        next unless $sel->can_read($deadline - time);
        my $n = sysread $h->{sock}, $h->{buf}, 65536, length $h->{buf};
        $eof = 1 unless $n;
    }
    close $h->{sock};
    push @res, { error => 'no answer' } while @res < @$requests;
    return @res;
}

# Many requests in flight at once from one process: connect all, then write
# all, then collect.  Each spec is a hash of http_request options (port,
# request, headers).  Returns responses in the order of the specs.
sub http_parallel {
    my ($specs, %o) = @_;
    my $timeout = $o{timeout} || 30;
    my $start = time;
    my (@socks, @res, %idx, %buf);
    for my $i (0 .. $#$specs) {
        my $s = connect_to($specs->[$i]{port}, 5);
        unless ($s) { $res[$i] = { error => "connect: $!" }; next }
        $s->blocking(0);
        $socks[$i] = $s;
        $idx{fileno $s} = $i;
        $buf{$i} = '';
    }
    my @pending = grep { $socks[$_] } 0 .. $#$specs;
    my @out = map { build_request(%{ $specs->[$_] },
        headers => header_pairs($specs->[$_]{headers})) } 0 .. $#$specs;
    my $wsel = IO::Select->new(map { $socks[$_] } @pending);
    my $rsel = IO::Select->new(map { $socks[$_] } @pending);
    my $left = @pending;
    while ($left && time < $start + $timeout) {
        my ($r, $w) = IO::Select->select($rsel, $wsel->count ? $wsel : undef, undef,
            $start + $timeout - time);
        for my $s (@{ $w || [] }) {
            my $i = $idx{fileno $s};
            my $n = syswrite $s, $out[$i];
            substr($out[$i], 0, $n, '') if $n;
            $wsel->remove($s) unless length $out[$i];
        }
        for my $s (@{ $r || [] }) {
            my $i = $idx{fileno $s};
            my $n = sysread $s, $buf{$i}, 65536, length $buf{$i};
            next if !defined $n && $!{EAGAIN};
            my $res = parse_response($buf{$i}, !$n);
            if ($res || !$n) {
                $res[$i] = $res || { error => 'connection closed', raw => $buf{$i} };
                $res[$i]{elapsed} = time - $start;
                $rsel->remove($s);
                $wsel->remove($s);
                close $s;
                $left--;
            }
        }
    }
    for my $i (0 .. $#$specs) {
        next if $res[$i];
        $res[$i] = { error => 'timeout', raw => $buf{$i} };
        close $socks[$i] if $socks[$i];
    }
    return \@res;
}

1;

package RLTest::H2;

# A minimal HTTP/2 client (cleartext, prior knowledge), in core Perl, for the
# suites that need what curl cannot do: several streams on ONE connection and
# an RST_STREAM on one of them while the connection and the others go on.
#
#   my $c = RLTest::H2->connect(port => $port) or die $RLTest::H2::error;
#   my $s = $c->get('/path?x=1', ['x-name' => 'value']);   # HEADERS, END_STREAM
#   $c->wait_until(5, sub { defined $c->status($s) });     # reads frames meanwhile
#   $c->status($s);          # :status of the response (undef before its HEADERS)
#   $c->body($s);            # DATA bytes so far;  $c->ended($s): END_STREAM seen
#   $c->reset($s);           # RST_STREAM, CANCEL (8) unless another code is given
#   $c->peer_reset($s);      # the error code of an RST_STREAM from the server
#   $c->goaway;              # the server's GOAWAY error code, undef without one
#   $c->write_error;         # why a write failed (the server closed), undef if none
#   $c->pump(0.2);           # read and answer frames for up to 0.2 s
#   $c->cork; ...; $c->uncork;   # frames between them leave in one write: nginx reads
#                                # them, and runs their requests, in one event
#   $c->close;
#
# Requests are encoded with HPACK literals only (no Huffman, no dynamic
# table). Of a response's header block only :status is decoded: nginx sends
# it first, either indexed in the static table or as a raw literal (a
# Huffman-coded value would be returned as 'huffman'). SETTINGS and PING are
# acknowledged, DATA is credited back with WINDOW_UPDATE.

use strict;
use warnings;
use IO::Socket::INET;
use IO::Select;
use Time::HiRes qw(time);

our $error;

use constant {
    DATA => 0, HEADERS => 1, PRIORITY => 2, RST_STREAM => 3, SETTINGS => 4,
    PUSH_PROMISE => 5, PING => 6, GOAWAY => 7, WINDOW_UPDATE => 8, CONTINUATION => 9,
    END_STREAM => 0x1, ACK => 0x1, END_HEADERS => 0x4, PADDED => 0x8, PRIORITY_FLAG => 0x20,
    CANCEL => 0x8,
};

my %STATIC_STATUS = (8 => 200, 9 => 204, 10 => 206, 11 => 304, 12 => 400, 13 => 404, 14 => 500);

sub connect {
    my ($class, %o) = @_;
    my $sock = IO::Socket::INET->new(PeerAddr => $o{host} // '127.0.0.1', PeerPort => $o{port},
        Proto => 'tcp', Timeout => $o{timeout} // 5);
    unless ($sock) { $error = "connect: $!"; return }
    binmode $sock;
    my $self = bless { sock => $sock, sel => IO::Select->new($sock), next_id => 1, buf => '',
        streams => {}, authority => $o{authority} // 'localhost', eof => 0 }, $class;
    # The preface, our SETTINGS (none changed), and room for 16 MiB more on the connection.
    $self->write("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    $self->frame(SETTINGS, 0, 0, '');
    $self->frame(WINDOW_UPDATE, 0, 0, pack('N', 16 << 20));
    return $self;
}

sub cork { $_[0]{corked} = '' }

sub uncork {
    my ($self) = @_;
    my $data = delete $self->{corked} // '';
    $self->write($data);
}

sub write {
    my ($self, $data) = @_;
    return $self->{corked} .= $data if defined $self->{corked};
    # A server that closed: the write error is kept (write_error), the test goes on reading.
    local $SIG{PIPE} = 'IGNORE';
    while (length $data && $self->{sock}) {
        my $n = syswrite $self->{sock}, $data;
        unless (defined $n) { $self->{write_error} = "$!"; return }
        substr($data, 0, $n, '');
    }
}

sub frame {
    my ($self, $type, $flags, $sid, $payload) = @_;
    my $len = length $payload;
    $self->write(pack('CnCCN', $len >> 16, $len & 0xffff, $type, $flags, $sid) . $payload);
}

sub hpack_int {
    my ($prefix_bits, $first, $n) = @_;
    my $max = (1 << $prefix_bits) - 1;
    return chr($first | $n) if $n < $max;
    my $s = chr($first | $max);
    $n -= $max;
    while ($n >= 128) { $s .= chr(($n & 0x7f) | 0x80); $n >>= 7 }
    return $s . chr($n);
}

sub hpack_str { hpack_int(7, 0, length $_[0]) . $_[0] }

# A request's header block: :method and :scheme indexed, the rest literal
# without indexing.
sub encode_request {
    my ($self, $method, $path, $headers) = @_;
    my $block = $method eq 'GET' ? "\x82" : $method eq 'POST' ? "\x83"
        : hpack_int(4, 0, 2) . hpack_str($method);
    $block .= "\x86";                                        # :scheme http
    $block .= hpack_int(4, 0, 4) . hpack_str($path);         # :path
    $block .= hpack_int(4, 0, 1) . hpack_str($self->{authority});
    my @h = @{ $headers || [] };
    while (my ($n, $v) = splice @h, 0, 2) {
        $block .= "\x00" . hpack_str(lc $n) . hpack_str($v);
    }
    return $block;
}

# Opens a stream: HEADERS with END_STREAM. Returns the stream id.
sub get {
    my ($self, $path, $headers, $method) = @_;
    my $sid = $self->{next_id};
    $self->{next_id} += 2;
    $self->{streams}{$sid} = { body => '', opened => time };
    $self->frame(HEADERS, END_HEADERS | END_STREAM, $sid,
        $self->encode_request($method // 'GET', $path, $headers));
    return $sid;
}

sub reset {
    my ($self, $sid, $code) = @_;
    $self->frame(RST_STREAM, 0, $sid, pack('N', $code // CANCEL));
    $self->{streams}{$sid}{reset_sent} = time;
}

sub ping {
    my ($self, $data) = @_;
    $self->frame(PING, 0, 0, substr(($data // '') . "\0" x 8, 0, 8));
}

sub stream     { $_[0]{streams}{$_[1]} || {} }
sub status     { $_[0]->stream($_[1])->{status} }
sub body       { $_[0]->stream($_[1])->{body} }
sub ended      { $_[0]->stream($_[1])->{ended} }
sub peer_reset { $_[0]->stream($_[1])->{peer_reset} }
sub goaway     { $_[0]{goaway} }
sub write_error { $_[0]{write_error} }
sub eof        { $_[0]{eof} }
sub pings      { $_[0]{pings_acked} // 0 }

sub close {
    my ($self) = @_;
    close $self->{sock} if $self->{sock};
    delete $self->{sock};
}

# Reads whatever arrives for up to $secs seconds (at least one select).
sub pump {
    my ($self, $secs) = @_;
    my $deadline = time + ($secs // 0);
    while (1) {
        last if $self->{eof} || !$self->{sock};
        my $left = $deadline - time;
        $left = 0 if $left < 0;
        if ($self->{sel}->can_read($left)) {
            my $n = sysread $self->{sock}, $self->{buf}, 65536, length $self->{buf};
            if (!$n) { $self->{eof} = 1; last }
            $self->process;
        }
        last if time >= $deadline;
    }
}

# Pumps until $code returns true or $timeout passes; returns $code's value.
sub wait_until {
    my ($self, $timeout, $code) = @_;
    my $deadline = time + $timeout;
    while (1) {
        my $v = $code->();
        return $v if $v;
        last if time >= $deadline || $self->{eof};
        $self->pump(0.05);
    }
    return $code->();
}

sub process {
    my ($self) = @_;
    while (length $self->{buf} >= 9) {
        my ($l1, $l2, $type, $flags, $sid) = unpack 'CnCCN', $self->{buf};
        my $len = ($l1 << 16) | $l2;
        last if length $self->{buf} < 9 + $len;
        my $payload = substr $self->{buf}, 9, $len;
        substr($self->{buf}, 0, 9 + $len, '');
        $sid &= 0x7fffffff;
        $self->handle($type, $flags, $sid, $payload);
    }
}

sub handle {
    my ($self, $type, $flags, $sid, $p) = @_;
    if ($type == SETTINGS) {
        $self->frame(SETTINGS, ACK, 0, '') unless $flags & ACK;
    } elsif ($type == PING) {
        if ($flags & ACK) { $self->{pings_acked}++ } else { $self->frame(PING, ACK, 0, $p) }
    } elsif ($type == GOAWAY) {
        my ($last, $code) = unpack 'NN', $p;
        $self->{goaway} = $code;
        $self->{goaway_last} = $last & 0x7fffffff;
    } elsif ($type == RST_STREAM) {
        $self->{streams}{$sid}{peer_reset} = unpack 'N', $p;
    } elsif ($type == HEADERS || $type == CONTINUATION) {
        my $s = $self->{streams}{$sid} ||= { body => '' };
        if ($type == HEADERS) {
            my $pad = 0;
            if ($flags & PADDED) { $pad = ord $p; $p = substr $p, 1 }
            $p = substr $p, 5 if $flags & PRIORITY_FLAG;
            $p = substr $p, 0, length($p) - $pad;
            $s->{block} = $p;
        } else {
            $s->{block} .= $p;
        }
        if ($flags & END_HEADERS) {
            my $status = decode_status(delete $s->{block});
            # A second block is the trailers: the status is the first one's.
            $s->{status} //= $status;
            $s->{headers_at} //= time;
        }
        $s->{ended} = time if $type == HEADERS && $flags & END_STREAM;
    } elsif ($type == DATA) {
        my $s = $self->{streams}{$sid} ||= { body => '' };
        my $data = $p;
        if ($flags & PADDED) { my $pad = ord $data; $data = substr $data, 1, length($data) - 1 - $pad }
        $s->{body} .= $data;
        $s->{ended} = time if $flags & END_STREAM;
        if (my $credit = length $p) {
            $self->frame(WINDOW_UPDATE, 0, 0, pack('N', $credit));
            $self->frame(WINDOW_UPDATE, 0, $sid, pack('N', $credit))
                unless $s->{ended} || $s->{reset_sent} || defined $s->{peer_reset};
        }
    }
}

# :status from the first representation of a response header block.
sub decode_status {
    my ($block) = @_;
    return undef unless defined $block && length $block;
    my $b = ord $block;
    # A dynamic table size update may come first.
    while (($b & 0xe0) == 0x20) {
        my $i = 1;
        if (($b & 0x1f) == 0x1f) { $i++ while ord(substr $block, $i, 1) & 0x80; $i++ }
        $block = substr $block, $i;
        $b = ord $block;
    }
    return $STATIC_STATUS{$b & 0x7f} // 'indexed:' . ($b & 0x7f) if $b & 0x80;
    my $prefix = ($b & 0xc0) == 0x40 ? 0x3f : 0x0f;   # incremental indexing, or not / never
    my $idx = $b & $prefix;
    return 'unknown' unless $idx >= 8 && $idx <= 14;    # a :status name
    my $lb = ord substr $block, 1, 1;
    return 'huffman' if $lb & 0x80;
    return substr($block, 2, $lb & 0x7f) + 0;
}

1;

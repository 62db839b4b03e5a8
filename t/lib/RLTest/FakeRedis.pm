package RLTest::FakeRedis;

# A fake Redis for protocol faults: a forked process listening on a free
# 127.0.0.1 port that reads RESP commands and answers them according to a
# mode.  Real Redis cannot be made to send garbage, split or oversized
# replies, or to close in the middle of a pipeline; this can.
#
#   my $f = RLTest::FakeRedis->new(mode => 'garbage', dir => "$servroot/fake");
#   $f->start;  ... $f->port ...
#   $f->set_mode('ok');           # takes effect at the next command
#   $f->connections;              # connections accepted so far
#   $f->commands;                 # commands received (all connections)
#   $f->command_names;            # their verbs, in order (EVALSHA, SCRIPT, EVAL...)
#   $f->closed;                   # connections whose peer closed (EOF seen)
#   $f->stop;
#
# Modes (the mode is read again for every command, so a test can switch it
# while connections stay open; `silent` and the greeting of `unsolicited`
# apply per connection or per command as described):
#
#   ok                  answers like Redis running the decision script:
#                       EVALSHA/EVAL -> *4 :1 :1 :9 :1000 (allowed, ok,
#                       remaining 9, reset 1000 ms), one per decision of a
#                       batch (an array of them); SCRIPT LOAD -> the
#                       script's SHA-1; PING -> +PONG; anything else -> +OK
#   garbage             non-RESP bytes ("HTTP/1.1 400 Bad Request ...")
#   split               the `ok` reply, one byte at a time, `split_delay`
#                       seconds (default 0.005) apart
#   unsolicited         a reply before any command (+HELLO at accept), and
#                       after every real reply one more that nobody asked for
#   oversized           a bulk header `$104857600` followed by as much of
#                       100 MB of data as the peer reads (stops at EPIPE),
#                       written `oversized_chunk` bytes (default 64 KiB) at
#                       a time, the header together with the first chunk
#   oversized_array     `*65536` followed by 1 MiB bulk strings: each length
#                       within the decoder's caps, 64 GiB in total
#   close_mid_pipeline  answers the first `close_after` - 1 commands of a
#                       connection (default close_after 3), then closes it
#                       without answering the `close_after`-th or any
#                       command that arrived with it (it waits 0.2 s after
#                       each read for the rest of a burst to arrive)
#   silent              reads everything, never answers
#   wrong_shape         valid RESP that is not the script's reply (:1)
#   error:TEXT          the error reply -TEXT for EVALSHA/EVAL (SCRIPT LOAD
#                       still answers its SHA-1); e.g. error:BUSY ...
#   noscript            -NOSCRIPT for every EVALSHA and EVAL, a SHA-1 for
#                       SCRIPT LOAD: the module's EVAL fallback meets
#                       NOSCRIPT again
#
# Options: split_delay, close_after, oversized_chunk (see above),
# reply_delay (seconds to wait before each answer, default 0) and read_chunk
# (bytes read at a time, default 65536: with a small one and a reply_delay,
# the fake reads no faster than it answers, as a Redis that cannot keep up).
#
# Events are appended, one line each, to "$dir/events" (written with
# O_APPEND by the accepting process and by each connection's process):
# "accept N", "cmd N VERB", "eof N" (peer closed) and "hangup N" (the fake
# closed).  N is the connection number, from 1.

use strict;
use warnings;
use IO::Socket::INET;
use IO::Select;
use File::Path qw(make_path);
use Fcntl qw(O_WRONLY O_APPEND O_CREAT);
use POSIX ();
use Digest::SHA qw(sha1_hex);
use Time::HiRes qw(sleep time);
use RLTest::Proc qw(alive kill_and_wait);

our %ERRORS = (
    BUSY      => 'BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.',
    LOADING   => 'LOADING Redis is loading the dataset in memory',
    READONLY  => "READONLY You can't write against a read only replica.",
    OOM       => "OOM command not allowed when used memory > 'maxmemory'.",
    WRONGTYPE => 'WRONGTYPE Operation against a key holding the wrong kind of value',
    NOAUTH    => 'NOAUTH Authentication required.',
    NOSCRIPT  => 'NOSCRIPT No matching script. Please use EVAL.',
);

our $OK_REPLY = "*4\r\n:1\r\n:1\r\n:9\r\n:1000\r\n";
our $OVERSIZED_LEN = 104857600;

sub new {
    my ($class, %o) = @_;
    my $dir = $o{dir} or die "FakeRedis: dir required\n";
    return bless {
        dir => $dir,
        mode => $o{mode} // 'ok',
        port => $o{port},
        split_delay => $o{split_delay} // 0.005,
        close_after => $o{close_after} // 3,
        oversized_chunk => $o{oversized_chunk} // 65536,
        reply_delay => $o{reply_delay} // 0,
        read_chunk => $o{read_chunk} // 65536,
        reply => $o{reply} // $OK_REPLY,
        owner => $$,
    }, $class;
}

sub port   { $_[0]{port} }
sub pid    { $_[0]{pid} }
sub dir    { $_[0]{dir} }
sub events_file { "$_[0]{dir}/events" }
sub mode_file   { "$_[0]{dir}/mode" }

sub set_mode {
    my ($self, $mode) = @_;
    $self->{mode} = $mode;
    my $tmp = $self->mode_file . ".tmp";
    open my $fh, '>', $tmp or die "$tmp: $!";
    print $fh $mode;
    close $fh;
    rename $tmp, $self->mode_file or die "rename: $!";
}

sub start {
    my ($self) = @_;
    make_path($self->{dir});
    unlink $self->events_file;
    $self->set_mode($self->{mode});
    my $listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1',
        LocalPort => $self->{port} || 0, Proto => 'tcp', Listen => 128, ReuseAddr => 1)
        or die "FakeRedis: listen: $!\n";
    $self->{port} = $listen->sockport;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        POSIX::setpgid(0, 0);
        $SIG{$_} = 'DEFAULT' for qw(INT TERM HUP);
        $SIG{PIPE} = 'IGNORE';
        $SIG{CHLD} = 'IGNORE';    # connection processes are reaped automatically
        open STDIN, '<', '/dev/null';
        eval { $self->serve($listen) };
        POSIX::_exit(0);
    }
    close $listen;
    $self->{pid} = $pid;
    RLTest::Proc::register_pid($pid, 'fake redis');
    return $self;
}

sub stop {
    my ($self) = @_;
    my $pid = delete $self->{pid} or return;
    # The connection processes share the server's process group.
    kill 'KILL', -$pid;
    kill_and_wait($pid, 'KILL', 2);
    waitpid $pid, 0;
    RLTest::Proc::unregister_pid($pid);
}

sub DESTROY { $_[0]->stop if $_[0]{pid} && $$ == $_[0]{owner} }

# --- what the fake saw

sub events {
    my ($self) = @_;
    open my $fh, '<', $self->events_file or return ();
    chomp(my @l = <$fh>);
    return @l;
}

sub connections   { scalar grep { /^accept / } $_[0]->events }
sub commands      { scalar grep { /^cmd / } $_[0]->events }
sub command_names { map { /^cmd \d+ (\S+)/ ? $1 : () } $_[0]->events }
sub closed        { scalar grep { /^(eof|hangup) / } $_[0]->events }

# --- the server side (runs in the forked processes)

sub log_event {
    my ($self, $line) = @_;
    sysopen my $fh, $self->events_file, O_WRONLY | O_APPEND | O_CREAT or return;
    syswrite $fh, "$line\n";
    close $fh;
}

sub current_mode {
    my ($self) = @_;
    open my $fh, '<', $self->mode_file or return $self->{mode};
    local $/;
    my $m = <$fh>;
    return defined $m && length $m ? $m : $self->{mode};
}

sub serve {
    my ($self, $listen) = @_;
    my $n = 0;
    while (1) {
        my $c = $listen->accept or next;
        $n++;
        $self->log_event("accept $n");
        my $kid = fork;
        if (defined $kid && $kid == 0) {
            close $listen;
            eval { $self->handle($c, $n) };
            POSIX::_exit(0);
        }
        close $c;
    }
}

# Writes all of $bytes; false when the peer has gone (EPIPE, reset).
# $count, a scalar ref, accumulates the bytes written.
sub send_all {
    my ($c, $bytes, $count) = @_;
    my $off = 0;
    while ($off < length $bytes) {
        my $w = syswrite $c, $bytes, length($bytes) - $off, $off;
        return 0 unless defined $w && $w > 0;
        $off += $w;
        $$count += $w if $count;
    }
    return 1;
}

# Parses complete RESP arrays of bulk strings off the front of $$buf;
# returns the commands (array refs) and leaves any partial one in $$buf.
sub parse_commands {
    my ($buf) = @_;
    my @cmds;
    while (1) {
        my $p = 0;
        last unless $$buf =~ /\G\*(\d+)\r\n/gc;
        my $argc = $1;
        $p = pos $$buf;
        my @args;
        my $complete = 1;
        for (1 .. $argc) {
            pos($$buf) = $p;
            unless ($$buf =~ /\G\$(\d+)\r\n/gc) { $complete = 0; last }
            my $len = $1;
            my $start = pos $$buf;
            if (length($$buf) < $start + $len + 2) { $complete = 0; last }
            push @args, substr($$buf, $start, $len);
            $p = $start + $len + 2;
        }
        last unless $complete;
        push @cmds, \@args;
        substr($$buf, 0, $p) = '';
    }
    pos($$buf) = undef;
    return @cmds;
}

sub handle {
    my ($self, $c, $n) = @_;
    binmode $c;
    my $mode = $self->current_mode;
    if ($mode eq 'unsolicited') {
        send_all($c, "+HELLO\r\n");
    }
    my $buf = '';
    while (1) {
        my $r = sysread $c, my $chunk, $self->{read_chunk};
        if (!$r) {
            $self->log_event("eof $n");
            return;
        }
        $buf .= $chunk;
        if ($self->current_mode eq 'close_mid_pipeline') {
            # Let the rest of a burst arrive, so that the close cuts a
            # pipeline of several commands in flight.
            my $sel = IO::Select->new($c);
            while ($sel->can_read(0.2)) {
                my $more = sysread $c, my $x, 65536;
                last unless $more;
                $buf .= $x;
            }
        }
        my @cmds = parse_commands(\$buf);
        for my $cmd (@cmds) {
            my $verb = uc($cmd->[0] // '');
            $verb .= '_' . uc($cmd->[1] // '') if $verb eq 'SCRIPT';
            $self->log_event("cmd $n $verb");
        }
        for my $cmd (@cmds) {
            $mode = $self->current_mode;
            if ($mode eq 'close_mid_pipeline' && ++$self->{answered} >= $self->{close_after}) {
                $self->log_event("hangup $n");
                close $c;
                return;
            }
            my $reply = $self->reply_for($mode, $cmd);
            next unless defined $reply;    # silent
            sleep $self->{reply_delay} if $self->{reply_delay};
            if ($mode eq 'split') {
                for my $byte (split //, $reply) {
                    send_all($c, $byte) or return $self->log_event("eof $n");
                    sleep $self->{split_delay};
                }
            } elsif ($mode eq 'oversized') {
                $self->send_oversized($c, $n);
                return;
            } elsif ($mode eq 'oversized_array') {
                $self->send_oversized_array($c, $n);
                return;
            } else {
                send_all($c, $reply) or return $self->log_event("eof $n");
            }
        }
    }
}

sub reply_for {
    my ($self, $mode, $cmd) = @_;
    my $verb = uc($cmd->[0] // '');
    my $sub  = uc($cmd->[1] // '');
    my $script = $verb eq 'EVALSHA' || $verb eq 'EVAL';
    if ($verb eq 'SCRIPT' && $sub eq 'LOAD') {
        return undef if $mode eq 'silent';
        my $sha = sha1_hex($cmd->[2] // '');
        return "\$40\r\n$sha\r\n" unless $mode =~ /^(garbage|oversized|oversized_array)$/;
    }
    return undef if $mode eq 'silent';
    return "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n" if $mode eq 'garbage';
    return "\$$OVERSIZED_LEN\r\n" if $mode eq 'oversized' || $mode eq 'oversized_array';
    if ($mode =~ /^error:(.*)$/s) {
        my $text = $ERRORS{$1} // $1;
        return $script ? "-$text\r\n" : "+OK\r\n";
    }
    if ($mode eq 'noscript') {
        return $script ? "-$ERRORS{NOSCRIPT}\r\n" : "+OK\r\n";
    }
    return ":1\r\n" if $mode eq 'wrong_shape' && $script;
    my $n = $script ? decisions($cmd) : 1;
    my $ok = !$script ? ($verb eq 'PING' ? "+PONG\r\n" : "+OK\r\n")
        : $n == 1 ? $self->{reply} : "*$n\r\n" . ($self->{reply} x $n);
    return $ok . ($mode eq 'unsolicited' ? "+EXTRA\r\n" : '');
}

# The decisions of a script call, as lua/decide.lua tells them apart: each starts
# with its clock (digits or empty, never an algorithm), then 5 arguments per
# zone.  A batch is answered with one reply per decision, as Redis would: a
# slow worker (valgrind) batches more.
sub decisions {
    my ($cmd) = @_;
    my @argv = @$cmd[3 + ($cmd->[2] // 0) .. $#$cmd];
    my ($n, $i) = (0, 0);
    while ($i < @argv) {
        $n++;
        $i++;
        $i += 5 while $i < @argv && $argv[$i] !~ /^\d*$/;
    }
    return $n || 1;
}

# The header of a 100 MB bulk string, then its data for as long as the peer
# reads it.  A client that caps bulk lengths closes the connection after the
# header; one that buffers would take all of it.
sub send_oversized {
    my ($self, $c, $n) = @_;
    my $chunk = 'x' x $self->{oversized_chunk};
    # The header goes out with the first chunk of data, as it would from a
    # server that has the whole value ready.
    my $sent = 0;
    my $ok = send_all($c, "\$$OVERSIZED_LEN\r\n" . $chunk, \$sent);
    while ($ok && $sent < $OVERSIZED_LEN) {
        $ok = send_all($c, $chunk, \$sent);
    }
    $self->log_event("oversized $n sent $sent");
    # Wait for the peer to close, so that eof is recorded.
    if ($ok) { while (sysread $c, my $x, 65536) { } }
    $self->log_event("eof $n");
}

# An array of 65536 bulk strings of 1 MiB each: every length is within the
# decoder's caps (MAX_ARRAY_LEN 65536, MAX_BULK_LEN 1 MiB), the whole is
# 64 GiB.  Sent for as long as the peer reads.
sub send_oversized_array {
    my ($self, $c, $n) = @_;
    my $item = "\$1048576\r\n" . ('x' x 1048576) . "\r\n";
    my $sent = 0;
    my $ok = send_all($c, "*65536\r\n", \$sent);
    for (1 .. 65536) {
        last unless $ok;
        $ok = send_all($c, $item, \$sent);
    }
    $self->log_event("oversized $n sent $sent");
    if ($ok) { while (sysread $c, my $x, 65536) { } }
    $self->log_event("eof $n");
}

sub oversized_sent {
    my ($self) = @_;
    my $total = 0;
    for ($self->events) { $total += $1 if /^oversized \d+ sent (\d+)/ }
    return $total;
}

1;

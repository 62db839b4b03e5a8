package RLTest::SlowBackend;

# A small HTTP server for the concurrency suites: it holds each request and
# logs, from its own side, when it began and ended, so that a test counts the
# requests in flight at once without asking the module.
#
#   my $b = RLTest::SlowBackend->start(log => "$dir/backend.log");
#   $b->port;                     # listening on 127.0.0.1 (addr => ... for another)
#   GET /any?hold=1.5             # answers 200 "ok\n" after 1.5 s (default 1)
#   GET /any?hold=10&stream=1     # headers at once, then a line a second until hold
#   GET /any?stream=1&usage=123   # ... and a last event carrying the usage, as LLM APIs send it
#   GET /status404...             # 404 at once (an error_page test's first answer)
#   $b->intervals(qr/k=a\b/);     # [start, end, uri] of the requests logged, matching
#   max_overlap(@intervals);      # the most of them in flight at one instant
#   $b->stop;                     # also at the test's END
#
# One process accepts, a child per connection answers (so requests overlap);
# the acceptor leads its own process group, which stop() signals: the
# children of a connection still held go with it.

use strict;
use warnings;
use IO::Socket::INET;
use POSIX ();
use Fcntl qw(:flock);
use Time::HiRes qw(time sleep);
use Exporter 'import';
use RLTest::Proc qw(free_port);

our @EXPORT_OK = qw(max_overlap);

sub start {
    my ($class, %o) = @_;
    my $port = free_port();
    my $log = $o{log} or die "RLTest::SlowBackend: log => path\n";
    open my $touch, '>', $log or die "$log: $!";
    close $touch;
    my $listen = IO::Socket::INET->new(LocalAddr => $o{addr} // '127.0.0.1', LocalPort => $port,
        Proto => 'tcp', Listen => 512, ReuseAddr => 1) or die "listen $port: $!";
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        POSIX::setpgid(0, 0);
        $SIG{CHLD} = 'IGNORE';    # children are reaped by the kernel
        while (1) {
            my $c = $listen->accept or next;
            my $child = fork;
            if (defined $child && $child == 0) {
                close $listen;
                serve($c, $log);
                POSIX::_exit(0);
            }
            close $c;
        }
    }
    close $listen;
    RLTest::Proc::register_pid($pid, "slow backend $port");
    return bless { pid => $pid, port => $port, log => $log }, $class;
}

sub serve {
    my ($c, $log) = @_;
    my $req = '';
    while ($req !~ /\r\n\r\n/) {
        my $n = sysread $c, $req, 4096, length $req;
        return unless $n;
    }
    my $begin = time;
    my ($uri) = $req =~ /^\S+ (\S+)/;
    $uri //= '?';
    if ($uri =~ m{^/status404}) {
        syswrite $c, "HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\nConnection: close\r\n\r\nno!\n";
        return;
    }
    my $hold = $uri =~ /[?&]hold=([\d.]+)/ ? $1 : 1;
    # The end is taken before the last write: the request is then certainly still in flight
    # at the gateway, so that [begin, end] lies within the gateway's hold of its slot.
    my $end;
    if ($uri =~ /[?&]stream=1/) {
        syswrite $c, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n";
        my $until = $begin + $hold;
        while (time < $until) {
            sleep(($until - time) < 1 ? $until - time : 1);
            $end = time;
            last unless defined syswrite $c, "tick\n";
        }
        if ($uri =~ /[?&]usage=(\d+)/) {
            syswrite $c, qq{data: {"choices":[],"usage":{"prompt_tokens":0,"total_tokens":$1}}\n\n};
        }
        logged($log, $begin, $end // time, $uri);
    } else {
        sleep $hold;
        $end = time;
        logged($log, $begin, $end, $uri);
        syswrite $c, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n";
    }
    close $c;
}

# One line per request, appended whole under a lock (children write at once), before the
# client can see its response end: a test reads the log as soon as its responses are in.
sub logged {
    my ($log, $begin, $end, $uri) = @_;
    open my $fh, '>>', $log or return;
    flock $fh, LOCK_EX;
    printf $fh "%.6f %.6f %s\n", $begin, $end, $uri;
    close $fh;
}

sub port { $_[0]{port} }

# [start, end, uri] of each logged request whose uri matches $re (all without).
sub intervals {
    my ($self, $re) = @_;
    open my $fh, '<', $self->{log} or die "$self->{log}: $!";
    my @out;
    while (<$fh>) {
        my ($s, $e, $uri) = /^(\S+) (\S+) (\S+)$/ or next;
        push @out, [$s, $e, $uri] if !$re || $uri =~ $re;
    }
    return @out;
}

# The most intervals that hold one instant (an end and a start at the same
# instant do not overlap).
sub max_overlap {
    my @ev = sort { $a->[0] <=> $b->[0] || $a->[1] <=> $b->[1] }
        map { ([$_->[0], 1], [$_->[1], -1]) } @_;
    my ($n, $max) = (0, 0);
    for (@ev) {
        $n += $_->[1];
        $max = $n if $n > $max;
    }
    return $max;
}

sub stop {
    my ($self) = @_;
    my $pid = delete $self->{pid} or return;
    kill 'TERM', -$pid;
    waitpid $pid, 0;
    RLTest::Proc::unregister_pid($pid);
}

sub DESTROY { local ($@, $?, $!); $_[0]->stop }

1;

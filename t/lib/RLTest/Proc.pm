package RLTest::Proc;

# Process and port plumbing shared by the Redis and nginx helpers.  Every
# process a test starts is registered here so that END and signal handlers
# can stop it even when the test dies halfway.

use strict;
use warnings;
use Exporter 'import';
use IO::Socket::INET;
use Time::HiRes qw(sleep time);

our @EXPORT_OK = qw(free_port alive kill_and_wait children_of wait_for_port);

my %registered;      # pid => description
my %cleanup;         # id => code, run before the pids are killed
my $cleanup_id = 0;
my $owner = $$;

sub register_pid   { $registered{$_[0]} = $_[1] }
sub unregister_pid { delete $registered{$_[0]} }
sub add_cleanup    { my $id = ++$cleanup_id; $cleanup{$id} = $_[0]; $id }
sub remove_cleanup { delete $cleanup{$_[0]} }

# Port 0 lets the kernel choose; the socket is closed again at once, and a
# reuse by someone else in the short gap is improbable on a test machine.
# Ports the harness already handed out are not handed out twice.
my %given;
sub free_port {
    for (1 .. 50) {
        my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0,
            Proto => 'tcp', Listen => 1, ReuseAddr => 1) or die "bind: $!";
        my $p = $s->sockport;
        close $s;
        next if $given{$p}++;
        return $p;
    }
    die "no free port\n";
}

# A daemonised nginx master is not our child; when it exits it may stay a
# zombie if PID 1 does not reap, so "kill 0" alone would say it lives.
sub alive {
    my ($pid) = @_;
    return 0 unless $pid && kill 0, $pid;
    open my $fh, '<', "/proc/$pid/stat" or return 0;
    my $stat = <$fh> // '';
    return $stat =~ /^\d+ \(.*\) ([A-Za-z])/ && $1 ne 'Z' ? 1 : 0;
}

sub children_of {
    my ($ppid) = @_;
    my @kids;
    for my $f (glob '/proc/[0-9]*/stat') {
        open my $fh, '<', $f or next;
        my $stat = <$fh> // next;
        push @kids, $1 if $stat =~ /^(\d+) \(.*\) \S (\d+)/ && $2 == $ppid;
    }
    return @kids;
}

# Send $sig, wait up to $timeout seconds, escalate to KILL.  Returns 1 if
# the process went away on the first signal.
sub kill_and_wait {
    my ($pid, $sig, $timeout) = @_;
    return 1 unless alive($pid);
    kill $sig, $pid;
    my $deadline = time + $timeout;
    while (time < $deadline) {
        waitpid $pid, 1;    # WNOHANG; reaps it if it is our child
        return 1 unless alive($pid);
        sleep 0.02;
    }
    kill 'KILL', $pid;
    waitpid $pid, 0 if kill 0, $pid;
    return 0;
}

# $port may be "host:port" (an nginx in a network namespace, RLTest::Netns).
sub wait_for_port {
    my ($port, $timeout) = @_;
    my $host = $port =~ s/^(.+):(\d+)$/$2/ ? $1 : '127.0.0.1';
    my $deadline = time + ($timeout || 10);
    while (time < $deadline) {
        my $s = IO::Socket::INET->new(PeerAddr => $host, PeerPort => $port,
            Proto => 'tcp', Timeout => 1);
        if ($s) { close $s; return 1 }
        sleep 0.02;
    }
    return 0;
}

sub cleanup_all {
    return unless $$ == $owner;    # forked children must not stop the servers
    for my $id (sort { $a <=> $b } keys %cleanup) {
        my $code = delete $cleanup{$id};
        eval { $code->() };
    }
    for my $pid (keys %registered) {
        my @kids = children_of($pid);
        kill 'CONT', $pid;
        kill_and_wait($pid, 'TERM', 3);
        kill 'KILL', grep { alive($_) } @kids;
        delete $registered{$pid};
    }
}

END {
    my $rc = $?;
    cleanup_all();
    $? = $rc;
}

# A peer that closed its end must give a write error, not kill the test.
$SIG{PIPE} = 'IGNORE';

for my $sig (qw(INT TERM HUP)) {
    $SIG{$sig} = sub { cleanup_all(); $SIG{$sig} = 'DEFAULT'; kill $sig, $$ };
}

1;

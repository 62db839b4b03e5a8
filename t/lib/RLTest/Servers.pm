package RLTest::Servers;

# redis-server children of the test, keyed by port: the process handling
# that RLTest::Redis, RLTest::Cluster and RLTest::Sentinel share.  Every
# server runs in the foreground (no daemonize) in its own process group and
# is registered with RLTest::Proc, so that END and the signal handlers stop
# it even when the test dies halfway.  Its command line is kept: a server
# killed on purpose comes back exactly as it was (a primary with its old
# configuration, a cluster node with its nodes.conf).
#
#   my $srv = RLTest::Servers->new(what => 'redis cluster node', logs => "$dir/*/redis.log");
#   $srv->spawn($port, RLTest::Servers::redis_server(), '--port', $port, ...);
#   $srv->wait_ping($port);
#   $srv->cmd($port, 'INFO', 'replication');
#   $srv->sigkill($port);    # a crash
#   $srv->restart($port);    # the same command line again
#   $srv->stop_all;          # also when the set goes away

use strict;
use warnings;
use POSIX ();
use Time::HiRes qw(sleep time);
use RLTest::Proc qw(alive kill_and_wait);
use RLTest::Redis ();

sub redis_server { $ENV{TEST_NGINX_REDIS_SERVER} || 'redis-server' }

# what: how errors and RLTest::Proc name a server ("$what $port"); logs:
# where to look when one does not come up.
sub new {
    my ($class, %o) = @_;
    return bless {
        what    => $o{what} // 'redis-server',
        logs    => $o{logs},
        argv    => {},     # port => command line, kept for restart
        pid     => {},     # port => pid, while it runs
        order   => [],     # ports, in the order first spawned
        clients => {},     # port => the harness's connection
        owner   => $$,
    }, $class;
}

# Starts the server of $port with @argv, or with the command line it last
# had when @argv is empty.  Returns the pid; does not wait (wait_ping).
sub spawn {
    my ($self, $port, @argv) = @_;
    if (@argv) {
        push @{ $self->{order} }, $port unless $self->{argv}{$port};
        $self->{argv}{$port} = \@argv;
    }
    my $argv = $self->{argv}{$port} or die "RLTest::Servers: no command line for $port\n";
    die "RLTest::Servers: $self->{what} $port runs already\n" if $self->{pid}{$port};
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        # Own process group: a Ctrl-C aimed at prove must not be what stops
        # Redis halfway through a test's cleanup.
        POSIX::setpgid(0, 0);
        open STDIN, '<', '/dev/null';
        exec @$argv or POSIX::_exit(127);
    }
    $self->{pid}{$port} = $pid;
    RLTest::Proc::register_pid($pid, "$self->{what} $port");
    return $pid;
}

# Until the server answers PING (not merely accepts: a server loading or a
# sentinel reading its file does that too); dies at once if it exited.
sub wait_ping {
    my ($self, $port, $timeout) = @_;
    my $deadline = time + ($timeout // 10);
    my $where = $self->{logs} ? "; logs in $self->{logs}" : '';
    while (time < $deadline) {
        my $r = eval { $self->cmd($port, 'PING') };
        return 1 if defined $r && !ref $r && $r eq 'PONG';
        delete $self->{clients}{$port};
        die "$self->{what} $port exited$where\n" unless alive($self->{pid}{$port});
        sleep 0.05;
    }
    die "$self->{what} $port did not answer PING$where\n";
}

# One command over the harness's connection to $port (kept, re-opened once
# if the server closed it).  Error replies come back as RLTest::Redis::Error
# objects.
sub cmd {
    my ($self, $port, @args) = @_;
    for my $try (1, 2) {
        my $c = $self->{clients}{$port} ||= RLTest::Redis::Client->new(port => $port);
        my $r = eval { $c->cmd(@args) };
        return $r unless $@;
        delete $self->{clients}{$port};
        # Tests kill clients and set idle timeouts; a server that closed this
        # connection never read the command, so one retry on a new one is safe.
        die $@ if $try == 2 || $@ !~ /EOF|reset|Broken pipe|write/i;
    }
}

# The next cmd() opens a new connection (tests that cut clients).
sub drop_client { delete $_[0]{clients}{$_[1]} }

# SIGTERM, SIGKILL after 5 s.  Returns 0 if it was not running.
sub stop {
    my ($self, $port) = @_;
    my $pid = delete $self->{pid}{$port} or return 0;
    delete $self->{clients}{$port};
    kill 'CONT', $pid;    # a SIGSTOPped server would never act on TERM
    kill_and_wait($pid, 'TERM', 5);
    waitpid $pid, 0;
    RLTest::Proc::unregister_pid($pid);
    return 1;
}

# SIGKILL: a crash, no goodbye to replicas, sentinels or the cluster bus.
# Returns 0 if it was not running.
sub sigkill {
    my ($self, $port) = @_;
    my $pid = delete $self->{pid}{$port} or return 0;
    delete $self->{clients}{$port};
    kill 'KILL', $pid;
    waitpid $pid, 0;
    RLTest::Proc::unregister_pid($pid);
    return 1;
}

# Stopped first if it runs, then the same command line, until it answers.
sub restart {
    my ($self, $port) = @_;
    $self->stop($port);
    $self->spawn($port);
    $self->wait_ping($port);
    return $self;
}

sub pid_of     { $_[0]{pid}{$_[1]} }
sub ports      { @{ $_[0]{order} } }
sub live_ports { my $s = shift; grep { $s->{pid}{$_} } @{ $s->{order} } }

# The last started first: whatever watches the others (sentinels, spawned
# after the servers they monitor) goes before what it watches, and does not
# reconfigure a server being stopped.
sub stop_all {
    my ($self) = @_;
    $self->stop($_) for reverse @{ $self->{order} };
    $self->{clients} = {};
}

# Not in a forked child of the test: its copy of the set must not stop the
# parent's servers when it exits.
sub DESTROY {
    my ($self) = @_;
    local ($@, $?, $!);
    $self->stop_all if $$ == $self->{owner};
}

1;

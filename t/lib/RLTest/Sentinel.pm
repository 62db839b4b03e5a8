package RLTest::Sentinel;

# Redis Sentinel per test: one primary, one replica and three sentinels
# (quorum 2), every one a redis-server child of the test on free 127.0.0.1
# ports, configuration files written under dir.  See t/README.md.
#
#   my $s = RLTest::Sentinel->new(dir => servroot() . '/sentinel')->start;
#   my $old = $s->primary_port;
#   $s->kill_primary;
#   my $secs = $s->wait_failover($old);   # sentinels agree on a new master, its ROLE is master
#   $s->restart($old);                    # the old primary, as it was: a stale master for a while

use strict;
use warnings;
use File::Path qw(make_path);
use POSIX ();
use Time::HiRes qw(sleep time);
use RLTest::Proc qw(free_port alive kill_and_wait);
use RLTest::Redis;

sub new {
    my ($class, %o) = @_;
    die "RLTest::Sentinel: dir is required\n" unless $o{dir};
    return bless {
        dir          => $o{dir},
        name         => $o{name} // 'rlmaster',
        down_after   => $o{down_after} // 1000,
        failover_timeout => $o{failover_timeout} // 5000,
        quorum       => $o{quorum} // 2,
        nsentinels   => $o{sentinels} // 3,
        procs        => {},    # port => { argv, pid, dir, kind }
        clients      => {},
    }, $class;
}

sub redis_server { $ENV{TEST_NGINX_REDIS_SERVER} || 'redis-server' }

sub start {
    my ($self) = @_;
    my $t0 = time;
    my $dir = $self->{dir};
    make_path($dir);
    my ($p, $r) = (free_port(), free_port());
    $self->{data_ports} = [$p, $r];
    $self->add_proc($p, 'data', $self->data_argv($p));
    $self->add_proc($r, 'data', $self->data_argv($r, '--replicaof', '127.0.0.1', $p));
    for (1 .. $self->{nsentinels}) {
        my $sp = free_port();
        my $conf = "$dir/sentinel-$sp.conf";
        # Sentinels rewrite their file: it must be writable and their own.
        open my $fh, '>', $conf or die "$conf: $!";
        print $fh join "\n", "port $sp", 'bind 127.0.0.1', 'daemonize no', "dir $dir",
            "logfile $dir/sentinel-$sp.log",
            "sentinel monitor $self->{name} 127.0.0.1 $p $self->{quorum}",
            "sentinel down-after-milliseconds $self->{name} $self->{down_after}",
            "sentinel failover-timeout $self->{name} $self->{failover_timeout}",
            "sentinel parallel-syncs $self->{name} 1", '';
        close $fh;
        push @{ $self->{sentinel_ports} }, $sp;
        $self->add_proc($sp, 'sentinel', redis_server(), $conf, '--sentinel');
    }
    $self->spawn($_) for $p, $r;
    $self->wait_ping($_) for $p, $r;
    # A sentinel learns the replicas from the primary's INFO, at once on
    # connecting and then every 10 s: the replica must be attached before.
    my $deadline = time + 10;
    sleep 0.02 while time < $deadline
        && (eval { $self->info_field($r, 'master_link_status') } // '') ne 'up';
    $self->spawn($_) for @{ $self->{sentinel_ports} };
    $self->wait_ping($_) for @{ $self->{sentinel_ports} };
    $self->wait_ready(20);
    $self->{started_in} = time - $t0;
    return $self;
}

sub data_argv {
    my ($self, $port, @more) = @_;
    my $d = "$self->{dir}/$port";
    make_path($d);
    return (redis_server(), '--port', $port, '--bind', '127.0.0.1', '--dir', $d,
        '--save', '', '--appendonly', 'no', '--daemonize', 'no',
        '--logfile', "$d/redis.log", '--repl-diskless-sync-delay', 0,
        '--enable-debug-command', 'local', @more);
}

sub add_proc {
    my ($self, $port, $kind, @argv) = @_;
    $self->{procs}{$port} = { port => $port, kind => $kind, argv => \@argv };
}

sub spawn {
    my ($self, $port) = @_;
    my $pr = $self->{procs}{$port};
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        POSIX::setpgid(0, 0);
        open STDIN, '<', '/dev/null';
        exec @{ $pr->{argv} } or POSIX::_exit(127);
    }
    $pr->{pid} = $pid;
    RLTest::Proc::register_pid($pid, "redis $pr->{kind} $port");
}

sub wait_ping {
    my ($self, $port) = @_;
    my $deadline = time + 10;
    while (time < $deadline) {
        my $r = eval { $self->cmd($port, 'PING') };
        return 1 if defined $r && !ref $r && $r eq 'PONG';
        delete $self->{clients}{$port};
        last unless alive($self->{procs}{$port}{pid});
        sleep 0.05;
    }
    die "redis $self->{procs}{$port}{kind} $port did not answer PING; logs in $self->{dir}\n";
}

# Every sentinel knows the primary, the replica and the other sentinels
# (they find each other through the primary, every 2 s): before that a
# failover cannot reach its quorum.
sub wait_ready {
    my ($self, $timeout) = @_;
    my $t0 = time;
    my $deadline = $t0 + ($timeout // 20);
    my $others = $self->{nsentinels} - 1;
    while (time < $deadline) {
        my $ok = 1;
        for my $sp (@{ $self->{sentinel_ports} }) {
            my $rep = eval { $self->cmd($sp, 'SENTINEL', 'REPLICAS', $self->{name}) };
            my $sen = eval { $self->cmd($sp, 'SENTINEL', 'SENTINELS', $self->{name}) };
            $ok &&= ref $rep eq 'ARRAY' && @$rep >= 1 && ref $sen eq 'ARRAY' && @$sen >= $others;
        }
        my $link = eval { $self->info_field($self->{data_ports}[1], 'master_link_status') } // '';
        return time - $t0 if $ok && $link eq 'up';
        sleep 0.1;
    }
    die sprintf("sentinels not ready after %.1f s (each must see the replica and %d other "
        . "sentinels); logs in %s\n", time - $t0, $others, $self->{dir});
}

sub started_in     { $_[0]{started_in} }
sub name           { $_[0]{name} }
sub sentinel_ports { @{ $_[0]{sentinel_ports} } }
sub data_ports     { @{ $_[0]{data_ports} } }
sub pid_of         { $_[0]{procs}{$_[1]}{pid} }

sub cmd {
    my ($self, $port, @args) = @_;
    for my $try (1, 2) {
        my $c = $self->{clients}{$port} ||= RLTest::Redis::Client->new(port => $port);
        my $r = eval { $c->cmd(@args) };
        return $r unless $@;
        delete $self->{clients}{$port};
        die $@ if $try == 2 || $@ !~ /EOF|reset|Broken pipe|write/i;
    }
}

sub info_field {
    my ($self, $port, $field) = @_;
    my $text = $self->cmd($port, 'INFO', 'replication');
    return ref $text ? undef : $text =~ /^\Q$field\E:(\S+)/m ? $1 : undef;
}

# The primary's address as the first answering sentinel gives it: (host, port)
# in list context, the port in scalar context.
sub primary_addr {
    my ($self) = @_;
    for my $sp (@{ $self->{sentinel_ports} }) {
        next unless $self->{procs}{$sp}{pid};
        my $r = eval { $self->cmd($sp, 'SENTINEL', 'GET-MASTER-ADDR-BY-NAME', $self->{name}) };
        return @$r if ref $r eq 'ARRAY';
    }
    die "no sentinel answered for $self->{name}\n";
}
sub primary_port { my @a = $_[0]->primary_addr; $a[1] }

# SIGKILL of the current primary (as the sentinels name it).  Returns its port.
sub kill_primary {
    my ($self) = @_;
    my $port = $self->primary_port;
    $self->kill_port($port);
    return $port;
}

sub kill_port {
    my ($self, $port) = @_;
    my $pr = $self->{procs}{$port};
    return unless $pr->{pid};
    delete $self->{clients}{$port};
    kill 'KILL', $pr->{pid};
    waitpid $pr->{pid}, 0;
    RLTest::Proc::unregister_pid($pr->{pid});
    delete $pr->{pid};
    $self->{killed_at} = time;
}

# Until every live sentinel names a master other than $old and that server's
# ROLE says master.  Returns the seconds since kill_primary (or since the
# call, without one); dies after $timeout (20 s).
sub wait_failover {
    my ($self, $old, $timeout) = @_;
    my $t0 = time;
    my $since = $self->{killed_at} // $t0;
    my $deadline = $t0 + ($timeout // 20);
    while (time < $deadline) {
        my %ports;
        for my $sp (grep { $self->{procs}{$_}{pid} } @{ $self->{sentinel_ports} }) {
            my $r = eval { $self->cmd($sp, 'SENTINEL', 'GET-MASTER-ADDR-BY-NAME', $self->{name}) };
            $ports{ref $r eq 'ARRAY' ? $r->[1] : 'none'} = 1;
        }
        my @p = keys %ports;
        if (@p == 1 && $p[0] ne 'none' && $p[0] != $old) {
            my $role = eval { $self->cmd($p[0], 'ROLE') };
            return time - $since if ref $role eq 'ARRAY' && $role->[0] eq 'master';
        }
        sleep 0.02;
    }
    die sprintf("no failover away from %s within %.1f s; logs in %s\n", $old, time - $t0,
        $self->{dir});
}

# Starts a killed server with the command line it first had: the old primary
# comes back as a writable master with its old configuration, until the
# sentinels demote it (the split-brain window of the design note, 3.1).
sub restart {
    my ($self, $port) = @_;
    $self->stop_port($port) if $self->{procs}{$port}{pid};
    $self->spawn($port);
    $self->wait_ping($port);
    return $self;
}

sub stop_port {
    my ($self, $port) = @_;
    my $pr = $self->{procs}{$port};
    return unless $pr->{pid};
    delete $self->{clients}{$port};
    kill 'CONT', $pr->{pid};
    kill_and_wait($pr->{pid}, 'TERM', 5);
    waitpid $pr->{pid}, 0;
    RLTest::Proc::unregister_pid($pr->{pid});
    delete $pr->{pid};
}

sub stop {
    my ($self) = @_;
    # Sentinels first, so that none reconfigures a server being stopped.
    $self->stop_port($_) for @{ $self->{sentinel_ports} || [] }, @{ $self->{data_ports} || [] };
    $self->{clients} = {};
}

sub DESTROY {
    my ($self) = @_;
    local ($@, $?, $!);
    $self->stop;
}

1;

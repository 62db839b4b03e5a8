package RLTest::Netns;

# Several "hosts" on one machine with network namespaces (design note 8.4):
# a `redis` namespace holding a bridge, N gateway namespaces each wired to
# it by a veth pair, and a link from the test's own namespace to the bridge
# so that the test reaches nginx and Redis in them.  One gateway can then be
# cut off from Redis (iptables DROP inside it) while the others keep going.
# Needs root, `ip` and `iptables`; available() says why not otherwise, so
# tests skip cleanly (e.g. in a docker build container).  See t/README.md.
#
#   my ($ok, $why) = RLTest::Netns->available;
#   plan skip_all => $why unless $ok;
#   my $net = RLTest::Netns->new(gateways => 3, dir => servroot() . '/netns')->setup;
#   my $redis = $net->start_redis(port => 6380);          # inside the redis namespace
#   start_nginx(name => 'gw1', $net->nginx_options(1), http_config => "...
#       ratelimit_redis " . $net->redis_addr . ":6380;", ...);
#   http_get('/t', -port => nginx('gw1')->addr);
#   $net->cut(1); ... $net->restore(1);
#
# Names carry the test's pid (namespaces rlt<pid>r, rlt<pid>g1..., host
# link rlt<pid>h) and the /24 is derived from it, 10.X.Y.0/24 with X in
# 200..254, so parallel runs never collide.  Namespaces left by a run that
# was SIGKILLed (its pid gone) are removed by the next setup().

use strict;
use warnings;
use File::Path qw(make_path);
use POSIX ();
use Time::HiRes qw(sleep time);
use RLTest::Proc qw(alive kill_and_wait wait_for_port);
use RLTest::Redis;

sub which {
    my ($prog) = @_;
    for my $d (split(/:/, $ENV{PATH} // ''), qw(/usr/sbin /sbin /usr/bin /bin)) {
        return "$d/$prog" if -x "$d/$prog";
    }
    return undef;
}

sub quiet {
    my (@cmd) = @_;
    my $out = `@{[join ' ', map { quotemeta } @cmd]} 2>&1`;
    return ($? >> 8, $out);
}

# (1) or (0, reason); in scalar context just the boolean.
sub available {
    my $why;
    if ($> != 0) { $why = 'network namespaces need root' }
    elsif (!which('ip')) { $why = "'ip' (iproute2) is not installed" }
    elsif (!which('iptables')) { $why = "'iptables' is not installed (apt-get install iptables)" }
    else {
        my $probe = "rltprobe$$";
        my ($rc, $out) = quiet('ip', 'netns', 'add', $probe);
        if ($rc) { chomp $out; $why = "ip netns add fails: $out" }
        else {
            my ($irc, $iout) = quiet('ip', 'netns', 'exec', $probe, 'iptables', '-L', 'OUTPUT', '-n');
            chomp $iout;
            $why = "iptables does not work in a namespace: $iout" if $irc;
            quiet('ip', 'netns', 'del', $probe);
        }
    }
    return wantarray ? (defined $why ? (0, $why) : (1)) : !defined $why;
}

sub new {
    my ($class, %o) = @_;
    my $pid = $$;
    my $tag = "rlt$pid";
    my $net = sprintf '10.%d.%d', 200 + (($pid >> 8) % 55), $pid & 255;
    return bless {
        gateways => $o{gateways} // 2,
        dir      => $o{dir},
        tag      => $tag,
        net      => $net,
        redis_ns => "${tag}r",
        host_if  => "${tag}h",
        host_link => $o{host_link} // 1,
        made     => [],
        pids     => {},
        cuts     => {},
        owner    => $$,
    }, $class;
}

sub redis_ns    { $_[0]{redis_ns} }
sub gw_ns       { "$_[0]{tag}g$_[1]" }
sub gateways    { $_[0]{gateways} }
sub redis_addr  { "$_[0]{net}.1" }
sub gw_addr     { "$_[0]{net}." . (10 + $_[1]) }
sub host_addr   { "$_[0]{net}.254" }
sub subnet      { "$_[0]{net}.0/24" }
sub namespaces  { ($_[0]->redis_ns, map { $_[0]->gw_ns($_) } 1 .. $_[0]{gateways}) }

sub ip {
    my ($self, @args) = @_;
    my ($rc, $out) = quiet('ip', @args);
    die "ip @args: $out" if $rc;
    return $out;
}

# Namespaces of runs whose test process is gone.
sub sweep_stale {
    my ($rc, $out) = quiet('ip', 'netns', 'list');
    for my $line (split /\n/, $out) {
        my ($ns) = $line =~ /^(rlt(\d+)(?:r|g\d+))\b/ or next;
        my ($pid) = $ns =~ /^rlt(\d+)/;
        next if $pid == $$ || alive($pid);
        # What that run left running inside (its Redis, its nginx) goes too.
        my (undef, $pids) = quiet('ip', 'netns', 'pids', $ns);
        kill 'KILL', grep { /^\d+$/ } split /\s+/, $pids;
        quiet('ip', 'netns', 'del', $ns);
        quiet('ip', 'link', 'del', "rlt${pid}h");
    }
}

sub setup {
    my ($self) = @_;
    my ($ok, $why) = available();
    die "RLTest::Netns unavailable: $why\n" unless $ok;
    make_path($self->{dir}) if $self->{dir};
    sweep_stale();
    my ($rc, $routes) = quiet('ip', '-4', 'route', 'show');
    my $net = quotemeta $self->{net};
    die "RLTest::Netns: $self->{net}.0/24 is in use on this host:\n$routes"
        if $routes =~ /^$net\./m;
    # Undone (namespaces deleted, processes stopped) even when the test dies
    # or is interrupted: RLTest::Proc runs cleanups before stopping pids.
    $self->{cleanup} = RLTest::Proc::add_cleanup(sub { $self->teardown });
    my $r = $self->{redis_ns};
    $self->ip('netns', 'add', $r);
    push @{ $self->{made} }, $r;
    $self->ip('-n', $r, 'link', 'add', 'br0', 'type', 'bridge');
    $self->ip('-n', $r, 'addr', 'add', $self->redis_addr . '/24', 'dev', 'br0');
    $self->ip('-n', $r, 'link', 'set', $_, 'up') for 'br0', 'lo';
    for my $i (1 .. $self->{gateways}) {
        my $g = $self->gw_ns($i);
        $self->ip('netns', 'add', $g);
        push @{ $self->{made} }, $g;
        $self->ip('-n', $r, 'link', 'add', "g$i", 'type', 'veth', 'peer', 'name', 'eth0',
            'netns', $g);
        $self->ip('-n', $r, 'link', 'set', "g$i", 'master', 'br0');
        $self->ip('-n', $r, 'link', 'set', "g$i", 'up');
        $self->ip('-n', $g, 'addr', 'add', $self->gw_addr($i) . '/24', 'dev', 'eth0');
        $self->ip('-n', $g, 'link', 'set', $_, 'up') for 'eth0', 'lo';
    }
    if ($self->{host_link}) {
        $self->ip('link', 'add', $self->{host_if}, 'type', 'veth', 'peer', 'name', 'host',
            'netns', $r);
        $self->{host_link_made} = 1;
        $self->ip('-n', $r, 'link', 'set', 'host', 'master', 'br0');
        $self->ip('-n', $r, 'link', 'set', 'host', 'up');
        $self->ip('addr', 'add', $self->host_addr . '/24', 'dev', $self->{host_if});
        $self->ip('link', 'set', $self->{host_if}, 'up');
    }
    return $self;
}

# The command prefix that runs a program inside a namespace.
sub prefix {
    my ($self, $ns) = @_;
    return ('ip', 'netns', 'exec', $ns);
}

# Runs a command inside a namespace and waits: (exit code, stdout+stderr).
sub run_in {
    my ($self, $ns, @cmd) = @_;
    return quiet($self->prefix($ns), @cmd);
}

# Starts a long-running command inside a namespace as our child (ip netns
# exec execs it: the pid is the program's own).  Stopped by teardown.
sub spawn_in {
    my ($self, $ns, @cmd) = @_;
    my $log = $self->{dir} ? "$self->{dir}/spawn.log" : '/dev/null';
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        POSIX::setpgid(0, 0);
        open STDIN, '<', '/dev/null';
        open STDOUT, '>>', $log;
        open STDERR, '>&', \*STDOUT;
        exec $self->prefix($ns), @cmd or POSIX::_exit(127);
    }
    $self->{pids}{$pid} = 1;
    RLTest::Proc::register_pid($pid, "in $ns: $cmd[0]");
    return $pid;
}

sub stop_pid {
    my ($self, $pid) = @_;
    return unless delete $self->{pids}{$pid};
    kill 'CONT', $pid;
    kill_and_wait($pid, 'TERM', 5);
    waitpid $pid, 0;
    RLTest::Proc::unregister_pid($pid);
}

# A redis-server inside the redis namespace on redis_addr:port.  Returns an
# object with port, addr, pid, cmd(@args), client, stop, restart.
sub start_redis {
    my ($self, %o) = @_;
    my $port = $o{port} // 6379;
    my $dir = ($self->{dir} // die "RLTest::Netns: dir is required for start_redis\n")
        . "/redis-$port";
    make_path($dir);
    my $r = RLTest::Netns::Redis->new(net => $self, port => $port, dir => $dir,
        argv => [$ENV{TEST_NGINX_REDIS_SERVER} || 'redis-server', '--port', $port,
            '--bind', $self->redis_addr, '--protected-mode', 'no', '--save', '',
            '--appendonly', 'no', '--dir', $dir, '--daemonize', 'no',
            '--logfile', "$dir/redis.log", '--maxclients', '4000', @{ $o{args} || [] }]);
    $r->start;
    return $r;
}

# Options for RLTest's nginx($name, ...) / RLTest::Nginx->new: the instance
# runs inside gateway $i and listens on its address (reachable from the test
# through the host link).
sub nginx_options {
    my ($self, $i) = @_;
    return (prefix_cmd => [$self->prefix($self->gw_ns($i))], host => $self->gw_addr($i));
}

# Gateway $i loses Redis: its packets to the redis address (to $port only,
# if given) are dropped silently, so connects hang and replies never come.
sub cut {
    my ($self, $i, $port) = @_;
    my @rule = ('OUTPUT', '-d', $self->redis_addr, '-p', 'tcp',
        defined $port ? ('--dport', $port) : (), '-j', 'DROP');
    my ($rc, $out) = $self->run_in($self->gw_ns($i), 'iptables', '-A', @rule);
    die "iptables -A @rule in gateway $i: $out" if $rc;
    push @{ $self->{cuts}{$i} }, \@rule;
}

# Undoes every cut of gateway $i; TCP retransmission then delivers what
# was pending.
sub restore {
    my ($self, $i) = @_;
    for my $rule (@{ delete $self->{cuts}{$i} || [] }) {
        my ($rc, $out) = $self->run_in($self->gw_ns($i), 'iptables', '-D', @$rule);
        die "iptables -D @$rule in gateway $i: $out" if $rc;
    }
}

sub teardown {
    my ($self) = @_;
    return unless $$ == $self->{owner};
    $self->stop_pid($_) for keys %{ $self->{pids} };
    # Processes we did not start ourselves (nginx daemons) may still live in
    # a namespace: stop them, or the namespace outlives its name.
    for my $ns (@{ $self->{made} }) {
        my ($rc, $out) = quiet('ip', 'netns', 'pids', $ns);
        my @left = grep { /^\d+$/ } split /\s+/, $out;
        kill_and_wait($_, 'TERM', 3) for @left;
    }
    quiet('ip', 'link', 'del', $self->{host_if}) if delete $self->{host_link_made};
    quiet('ip', 'netns', 'del', $_) for reverse @{ $self->{made} };
    $self->{made} = [];
    RLTest::Proc::remove_cleanup(delete $self->{cleanup}) if $self->{cleanup};
}

sub DESTROY {
    my ($self) = @_;
    local ($@, $?, $!);
    $self->teardown;
}

package RLTest::Netns::Redis;

use strict;
use warnings;
use Time::HiRes qw(sleep time);

sub new { my ($class, %o) = @_; bless {%o}, $class }

sub start {
    my ($self) = @_;
    my $net = $self->{net};
    $self->{pid} = $net->spawn_in($net->redis_ns, @{ $self->{argv} });
    my $deadline = time + 10;
    while (time < $deadline) {
        my $r = eval { $self->cmd('PING') };
        return $self if defined $r && !ref $r && $r eq 'PONG';
        delete $self->{client};
        last unless RLTest::Proc::alive($self->{pid});
        sleep 0.05;
    }
    die "redis-server in $net->{redis_ns} did not come up; see $self->{dir}/redis.log\n";
}

sub port { $_[0]{port} }
sub pid  { $_[0]{pid} }
sub addr { $_[0]{net}->redis_addr }

sub client {
    my ($self) = @_;
    return RLTest::Redis::Client->new(host => $self->addr, port => $self->{port});
}

sub cmd {
    my ($self, @args) = @_;
    $self->{client} ||= $self->client;
    my $r = eval { $self->{client}->cmd(@args) };
    return $r unless $@;
    delete $self->{client};
    die $@;
}

sub stop {
    my ($self) = @_;
    delete $self->{client};
    $self->{net}->stop_pid(delete $self->{pid}) if $self->{pid};
}

sub restart { $_[0]->stop; $_[0]->start }

1;

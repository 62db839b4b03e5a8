package RLTest::Cluster;

# A real Redis Cluster per test: N primaries with R replicas each, every
# node a redis-server child of the test (no daemonize), on free 127.0.0.1
# ports, created with `redis-cli --cluster create`.  See t/README.md.
#
#   my $c = RLTest::Cluster->new(dir => servroot() . '/cluster')->start;
#   my $p = $c->primary_of_slot($c->keyslot('rl:api:a'));
#   $c->cmd($p, 'GET', 'rl:api:a');
#
# Each node gets its own cluster bus port (--cluster-port) from free_port:
# the default bus port, port + 10000, is beyond 65535 for the high ephemeral
# ports free_port hands out.

use strict;
use warnings;
use File::Path qw(make_path);
use POSIX ();
use Time::HiRes qw(sleep time);
use RLTest::Proc qw(free_port);
use RLTest::Redis;
use RLTest::Servers;

sub new {
    my ($class, %o) = @_;
    die "RLTest::Cluster: dir is required\n" unless $o{dir};
    my $self = bless {
        dir          => $o{dir},
        primaries    => $o{primaries} // 3,
        replicas     => $o{replicas} // 1,
        node_timeout => $o{node_timeout} // 2000,
        tls          => $o{tls},
        first_port   => $o{first_port},
        host         => '127.0.0.1',
        nodes        => {},     # port => { dir, bus, tls_port }
        order        => [],     # ports, in creation order
        servers      => RLTest::Servers->new(what => 'redis cluster node',
            logs => "$o{dir}/*/redis.log"),
    }, $class;
    if (my $t = $self->{tls}) {
        for (qw(cert key ca)) {
            die "RLTest::Cluster: tls needs $_ (an absolute path)\n"
                unless $t->{$_} && $t->{$_} =~ m{^/};
        }
    }
    return $self;
}

sub redis_server { RLTest::Servers::redis_server() }

# Every node on its own ports; nodes.conf in each node's directory is what
# lets restart_node() bring a node back with its identity.
sub start {
    my ($self) = @_;
    my $t0 = time;
    make_path($self->{dir});
    my $n = $self->{primaries} * (1 + $self->{replicas});
    for (1 .. $n) {
        # first_port: the first node where a test needs it (6379, Redis' default), when free.
        my $port = (!@{ $self->{order} } && $self->{first_port}) || free_port();
        my $node = $self->{nodes}{$port} = {
            port => $port, bus => free_port(), dir => "$self->{dir}/$port",
            $self->{tls} ? (tls_port => free_port()) : (),
        };
        make_path($node->{dir});
        push @{ $self->{order} }, $port;
    }
    my $srv = $self->{servers};
    $srv->spawn($_, $self->node_argv($self->{nodes}{$_})) for @{ $self->{order} };
    $srv->wait_ping($_) for @{ $self->{order} };
    my @addrs = map { "$self->{host}:" . $self->create_port($_) } @{ $self->{order} };
    my $log = "$self->{dir}/create.log";
    my $rc = $self->cli_system($log, '--cluster', 'create', @addrs,
        '--cluster-replicas', $self->{replicas}, '--cluster-yes');
    die "redis-cli --cluster create failed (exit $rc); see $log\n" if $rc;
    $self->wait_ready(30);
    $self->{started_in} = time - $t0;
    return $self;
}

# Seconds start() took, until every node said ok and listed every replica.
sub started_in { $_[0]{started_in} }

sub node_argv {
    my ($self, $node) = @_;
    my @tls;
    if (my $t = $self->{tls}) {
        # The plain port stays open on loopback for the harness (core Perl
        # has no TLS client); nginx is pointed at the tls ports.
        @tls = ('--tls-port', $node->{tls_port}, '--tls-cert-file', $t->{cert},
            '--tls-key-file', $t->{key}, '--tls-ca-cert-file', $t->{ca},
            '--tls-auth-clients', $t->{auth_clients} ? 'yes' : 'no',
            '--tls-cluster', 'yes', '--tls-replication', 'yes');
    }
    return (redis_server(), '--port', $node->{port}, '--bind', $self->{host},
        '--cluster-enabled', 'yes', '--cluster-config-file', "$node->{dir}/nodes.conf",
        '--cluster-port', $node->{bus},
        '--cluster-node-timeout', $self->{node_timeout},
        '--dir', $node->{dir}, '--save', '', '--appendonly', 'no',
        '--daemonize', 'no', '--logfile', "$node->{dir}/redis.log",
        '--enable-debug-command', 'local', '--maxclients', '4000',
        # CLUSTER SLOTS lists a replica only once its replication offset,
        # as gossiped, is non-zero; a fresh primary's offset first moves with
        # its ping to the replicas, every 10 s by default.
        '--repl-ping-replica-period', 1,
        # A primary waits this long for more replicas before a (diskless)
        # full sync: 5 s by default, all of it spent before a replica counts.
        '--repl-diskless-sync-delay', 0, @tls);
}

# redis-cli talks to the nodes over TLS when the cluster has it: the bus is
# TLS (tls-cluster), and create/reshard must name the ports nginx will see.
sub create_port {
    my ($self, $port) = @_;
    return $self->{tls} ? $self->{nodes}{$port}{tls_port} : $port;
}

sub cli_args {
    my ($self) = @_;
    my $t = $self->{tls} or return ('redis-cli');
    return ('redis-cli', '--tls', '--cacert', $t->{ca},
        $t->{auth_clients} ? ('--cert', $t->{cert}, '--key', $t->{key}) : ());
}

# Runs redis-cli with output to $log; returns its exit code.
sub cli_system {
    my ($self, $log, @args) = @_;
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDIN, '<', '/dev/null';
        open STDOUT, '>>', $log;
        open STDERR, '>&', \*STDOUT;
        exec $self->cli_args, @args or POSIX::_exit(127);
    }
    waitpid $pid, 0;
    return $? >> 8;
}

sub ports     { @{ $_[0]{order} } }
sub tls_port  { $_[0]{nodes}{$_[1]}{tls_port} }
sub pid_of    { $_[0]{servers}->pid_of($_[1]) }
sub dir_of    { $_[0]{nodes}{$_[1]}{dir} }
sub host      { $_[0]{host} }
sub live_ports { $_[0]{servers}->live_ports }

# One command on one node over the harness's plain connection (kept per
# node, re-opened once if the node closed it).  Error replies come back as
# RLTest::Redis::Error objects, as with RLTest::Redis.
sub cmd { my $self = shift; $self->{servers}->cmd(@_) }

# A client of its own on one node, for raw RESP (ASKING + command on one
# connection, pipelines): ->send_cmd, ->read_reply, ->sock.
sub client {
    my ($self, $port) = @_;
    return RLTest::Redis::Client->new(port => $port);
}

sub id_of {
    my ($self, $port) = @_;
    return $self->{ids}{$port} //= $self->cmd($port, 'CLUSTER', 'MYID');
}

sub info_field {
    my ($self, $port, $section, $field) = @_;
    my $text = $self->cmd($port, $section eq 'cluster' ? ('CLUSTER', 'INFO') : ('INFO', $section));
    return undef if ref $text;
    return $text =~ /^\Q$field\E:(\S+)/m ? $1 : undef;
}

# CLUSTER NODES as seen by $port (a live node by default):
# [{ id, port, flags => {master => 1, ...}, master (id or '-'), slots }].
sub nodes_view {
    my ($self, $port) = @_;
    $port //= ($self->live_ports)[0];
    my $text = $self->cmd($port, 'CLUSTER', 'NODES');
    die "CLUSTER NODES on $port: " . $text->message . "\n" if ref $text;
    my @nodes;
    for my $line (split /\n/, $text) {
        my ($id, $addr, $flags, $master, undef, undef, undef, $link, @slots) = split ' ', $line;
        next unless $addr && $addr =~ /:(\d+)@/;
        push @nodes, { id => $id, port => $self->plain_port($1 + 0),
            flags => { map { $_ => 1 } split /,/, $flags }, master => $master,
            link => $link, slots => \@slots };
    }
    return \@nodes;
}

# Nodes announce their tls port when the cluster runs TLS; map back.
sub plain_port {
    my ($self, $p) = @_;
    return $p unless $self->{tls};
    for (values %{ $self->{nodes} }) { return $_->{port} if $_->{tls_port} == $p }
    return $p;
}

# CLUSTER SLOTS as seen by $port: [[start, end, primary port, replica ports...]].
sub slots_view {
    my ($self, $port) = @_;
    $port //= ($self->live_ports)[0];
    my $r = $self->cmd($port, 'CLUSTER', 'SLOTS');
    die "CLUSTER SLOTS on $port: " . $r->message . "\n" if ref $r ne 'ARRAY';
    return [map { [$_->[0], $_->[1], map { $self->plain_port($_->[1]) } @{$_}[2 .. $#$_]] } @$r];
}

sub is_ready {
    my ($self) = @_;
    my @live = $self->live_ports;
    for my $p (@live) {
        my $state = eval { $self->info_field($p, 'cluster', 'cluster_state') } // '';
        return 0 unless $state eq 'ok';
        # Every live node listed in this node's map (replicas show up late).
        my $slots = eval { $self->slots_view($p) } or return 0;
        my %seen = map { $_ => 1 } map { @{$_}[2 .. $#$_] } @$slots;
        return 0 if grep { !$seen{$_} } @live;
    }
    return 1;
}

# Until every live node reports cluster_state:ok and lists every live node
# (replicas included) in CLUSTER SLOTS.  Returns the seconds waited.
sub wait_ready {
    my ($self, $timeout) = @_;
    my $t0 = time;
    my $deadline = $t0 + ($timeout // 30);
    while (time < $deadline) {
        return time - $t0 if $self->is_ready;
        sleep 0.05;
    }
    die sprintf("cluster not ready after %.1f s (cluster_state ok and every replica in "
        . "CLUSTER SLOTS on every node); logs in %s/*/redis.log\n", time - $t0, $self->{dir});
}

# Until every live node says cluster_state:ok.  Returns the seconds waited.
sub wait_ok {
    my ($self, $timeout) = @_;
    my $t0 = time;
    my $deadline = $t0 + ($timeout // 30);
    while (time < $deadline) {
        my $bad = grep {
            (eval { $self->info_field($_, 'cluster', 'cluster_state') } // '') ne 'ok'
        } $self->live_ports;
        return time - $t0 unless $bad;
        sleep 0.05;
    }
    die sprintf("cluster_state not ok on every node after %.1f s; logs in %s/*/redis.log\n",
        time - $t0, $self->{dir});
}

# Ports of the nodes that are primaries now (serving slots or not).
sub primaries {
    my ($self) = @_;
    my %live = map { $_ => 1 } $self->live_ports;
    return sort { $a <=> $b } map { $_->{port} }
        grep { $_->{flags}{master} && !$_->{flags}{fail} && $live{$_->{port}} }
        @{ $self->nodes_view };
}

# The replica ports of a primary (the first one in scalar context).
sub replica_of {
    my ($self, $port) = @_;
    my $id = $self->id_of($port);
    my @r = sort { $a <=> $b } map { $_->{port} }
        grep { $_->{master} eq $id } @{ $self->nodes_view };
    return wantarray ? @r : $r[0];
}

sub primary_of_slot {
    my ($self, $slot) = @_;
    for my $r (@{ $self->slots_view }) {
        return $r->[2] if $slot >= $r->[0] && $slot <= $r->[1];
    }
    return undef;
}

# The key's slot, computed here (CRC16-XMODEM and the hash-tag rule, as
# src/codec/slot.rs): no round trip, also while nodes are down.
my @CRC;
for my $i (0 .. 255) {
    my $c = $i << 8;
    $c = $c & 0x8000 ? (($c << 1) ^ 0x1021) & 0xFFFF : ($c << 1) & 0xFFFF for 1 .. 8;
    $CRC[$i] = $c;
}
sub crc16 {
    my $crc = 0;
    $crc = (($crc << 8) & 0xFFFF) ^ $CRC[(($crc >> 8) ^ $_) & 0xFF] for unpack 'C*', $_[0];
    return $crc;
}
sub keyslot {
    my ($self, $key) = @_ == 1 ? (undef, $_[0]) : @_;
    my $o = index $key, '{';
    if ($o >= 0) {
        my $c = index $key, '}', $o + 1;
        $key = substr $key, $o + 1, $c - $o - 1 if $c > $o + 1;
    }
    return crc16($key) & 16383;
}

# SIGKILL: a crash, no goodbye on the bus.
sub kill_node {
    my ($self, $port) = @_;
    return unless $self->pid_of($port);
    # The slots it served, for wait_promoted().
    my $live = (grep { $_ != $port } $self->live_ports)[0];
    $self->{served}{$port} = [map { $_->[0] } grep { $_->[2] == $port }
        @{ (eval { $self->slots_view($live) }) || [] }] if $live;
    $self->{servers}->sigkill($port);
    $self->{killed_at}{$port} = time;
}

# After kill_node($port) of a primary: until its slots are served by a live
# node in the view of every live node, and cluster_state is ok everywhere
# (about node_timeout + 1 s).  Returns the seconds since the kill.
sub wait_promoted {
    my ($self, $port, $timeout) = @_;
    my @slots = @{ $self->{served}{$port} || [] };
    die "wait_promoted: $port served no slots when it was killed\n" unless @slots;
    my $deadline = time + ($timeout // 30);
    my %live = map { $_ => 1 } $self->live_ports;
    while (time < $deadline) {
        my $done = 1;
        for my $p (keys %live) {
            my $state = eval { $self->info_field($p, 'cluster', 'cluster_state') } // '';
            my $view = eval { $self->slots_view($p) } || [];
            my $served = 0;
            for my $r (@$view) {
                $served++ if $live{$r->[2]} && grep { $_ >= $r->[0] && $_ <= $r->[1] } @slots;
            }
            $done = 0, last unless $state eq 'ok' && $served;
        }
        return time - $self->{killed_at}{$port} if $done;
        sleep 0.05;
    }
    die "slots of $port not taken over within the timeout; logs in $self->{dir}/*/redis.log\n";
}

# The same command line again: with its nodes.conf the node rejoins (a
# primary that was replaced comes back as a replica of its successor).
sub restart_node {
    my ($self, $port) = @_;
    $self->{servers}->restart($port);
    return $self;
}

sub stop_node { $_[0]{servers}->stop($_[1]); return }

# CLUSTER FAILOVER on a replica (or FORCE/TAKEOVER as $mode), until it says
# it is a primary and the cluster is ok.  Returns the seconds it took.
sub failover {
    my ($self, $port, $mode, $timeout) = @_;
    my $t0 = time;
    my $was = $self->cmd($port, 'ROLE');
    my $old = ref $was eq 'ARRAY' && $was->[0] eq 'slave' ? $self->plain_port($was->[2]) : undef;
    my $old_id = defined $old && $self->pid_of($old) ? $self->id_of($old) : '';
    my $r = $self->cmd($port, 'CLUSTER', 'FAILOVER', $mode ? ($mode) : ());
    die "CLUSTER FAILOVER on $port: " . $r->message . "\n" if ref $r;
    my $deadline = $t0 + ($timeout // 15);
    while (time < $deadline) {
        my $role = eval { $self->cmd($port, 'ROLE') };
        last if ref $role eq 'ARRAY' && $role->[0] eq 'master';
        sleep 0.01;
    }
    my $role = $self->cmd($port, 'ROLE');
    die "node $port is not a primary after CLUSTER FAILOVER\n"
        unless ref $role eq 'ARRAY' && $role->[0] eq 'master';
    my $took = time - $t0;
    # Every node's view has it as a primary and its old primary as a
    # replica (gossip takes a few ms more).
    my $id = $self->id_of($port);
    my $agreed = sub {
        for my $p ($self->live_ports) {
            my @view = @{ (eval { $self->nodes_view($p) }) || [] };
            my ($me) = grep { $_->{id} eq $id } @view;
            return 0 unless $me && $me->{flags}{master};
            my ($it) = grep { $_->{id} eq $old_id } @view;
            return 0 if $it && $it->{flags}{master} && !$it->{flags}{fail};
        }
        return 1;
    };
    while (time < $deadline && !$agreed->()) { sleep 0.01 }
    die "not every node sees $port as a primary after CLUSTER FAILOVER\n" unless $agreed->();
    $self->wait_ok($timeout);
    return $took;
}

# Slot migration in steps, to hold a slot in the MIGRATING/IMPORTING state
# (ASK, TRYAGAIN) for as long as a test needs.
sub migrate_slot_begin {
    my ($self, $slot, $from, $to) = @_;
    for ([$to, 'IMPORTING', $self->id_of($from)], [$from, 'MIGRATING', $self->id_of($to)]) {
        my ($port, $state, $id) = @$_;
        my $r = $self->cmd($port, 'CLUSTER', 'SETSLOT', $slot, $state, $id);
        die "CLUSTER SETSLOT $slot $state on $port: " . $r->message . "\n" if ref $r;
    }
}

# Moves the given keys of $slot (all of them when none are given) from
# $from to $to.  Returns how many keys it moved.
sub migrate_keys {
    my ($self, $slot, $from, $to, @keys) = @_;
    @keys = @{ $self->cmd($from, 'CLUSTER', 'GETKEYSINSLOT', $slot, 100000) || [] } unless @keys;
    return 0 unless @keys;
    my $r = $self->cmd($from, 'MIGRATE', $self->{host}, $to, '', 0, 5000, 'KEYS', @keys);
    die "MIGRATE of slot $slot from $from to $to: " . $r->message . "\n" if ref $r;
    return scalar @keys;
}

# The slot belongs to $to: SETSLOT NODE on $to first, then every other
# primary (what redis-cli --cluster does).
sub migrate_slot_end {
    my ($self, $slot, $to) = @_;
    my $id = $self->id_of($to);
    for my $port ($to, grep { $_ != $to } $self->primaries) {
        my $r = $self->cmd($port, 'CLUSTER', 'SETSLOT', $slot, 'NODE', $id);
        die "CLUSTER SETSLOT $slot NODE on $port: " . $r->message . "\n" if ref $r;
    }
}

# redis-cli --cluster reshard of $nslots slots from $from to $to.  Returns
# the seconds it took (the cluster is ok again when it returns).
sub reshard {
    my ($self, $from, $to, $nslots) = @_;
    my $t0 = time;
    my $log = "$self->{dir}/reshard.log";
    my $rc = $self->cli_system($log, '--cluster', 'reshard',
        "$self->{host}:" . $self->create_port($from),
        '--cluster-from', $self->id_of($from), '--cluster-to', $self->id_of($to),
        '--cluster-slots', $nslots, '--cluster-yes', '--cluster-pipeline', 100);
    die "redis-cli --cluster reshard failed (exit $rc); see $log\n" if $rc;
    my $took = time - $t0;
    $self->wait_ok;
    return $took;
}

# Empty data and script caches on every live node (replicas follow their
# primary's FLUSHALL; their script caches are their own).
sub flushall {
    my ($self) = @_;
    for my $p ($self->primaries) {
        my $r = $self->cmd($p, 'FLUSHALL');
        die "FLUSHALL on $p: " . $r->message . "\n" if ref $r;
    }
    $self->cmd($_, 'SCRIPT', 'FLUSH') for $self->live_ports;
}

sub stop { $_[0]{servers}->stop_all }

# A throw-away CA and a server certificate for 127.0.0.1 / localhost /
# redis.test under $dir (openssl CLI), as { cert, key, ca } for tls => ...
sub tls_certs {
    my $dir = @_ == 2 ? $_[1] : $_[0];
    make_path($dir);
    my @steps = (
        "req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 -subj /CN=RLTest-CA",
        "req -newkey rsa:2048 -nodes -keyout redis.key -out redis.csr -subj /CN=redis.test",
        "x509 -req -in redis.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out redis.crt "
            . "-days 30 -extfile san.ext",
    );
    open my $fh, '>', "$dir/san.ext" or die "$dir/san.ext: $!";
    print $fh "subjectAltName=DNS:redis.test,DNS:localhost,IP:127.0.0.1\n";
    close $fh;
    for my $step (@steps) {
        system("cd \Q$dir\E && openssl $step >>openssl.log 2>&1") == 0
            or die "openssl $step failed; see $dir/openssl.log\n";
    }
    return { cert => "$dir/redis.crt", key => "$dir/redis.key", ca => "$dir/ca.crt" };
}

# The nodes stop when the set of servers goes away (RLTest::Servers::DESTROY).

1;

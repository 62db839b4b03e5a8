package RLTest::Redis;

# A real redis-server per test file plus a minimal RESP2 client.  No mock:
# the module under test must face the same server the users run.

use strict;
use warnings;
use IO::Socket::INET;
use IO::Socket::UNIX;
use POSIX ();
use Time::HiRes qw(sleep time);
use RLTest::Proc qw(free_port alive kill_and_wait);

sub new {
    my ($class, %o) = @_;
    # args: more redis-server options, e.g. --tls-port (t/310-tls.t); the plain
    # port stays, for the harness's own client.
    my $self = bless { dir => $o{dir}, port => $o{port} || free_port(),
        args => $o{args} || [] }, $class;
    $self->{socket} = "$self->{dir}/redis.sock";
    return $self;
}

sub start {
    my ($self) = @_;
    mkdir $self->{dir};
    unlink $self->{socket};
    my $bin = $ENV{TEST_NGINX_REDIS_SERVER} || 'redis-server';
    # The socket must be usable by nginx workers, which run as nobody.
    my @argv = ($bin, '--port', $self->{port}, '--bind', '127.0.0.1',
        '--unixsocket', $self->{socket}, '--unixsocketperm', '777',
        '--save', '', '--appendonly', 'no', '--dir', $self->{dir},
        '--enable-debug-command', 'local', '--daemonize', 'no',
        '--logfile', "$self->{dir}/redis.log", '--maxclients', '4000',
        @{ $self->{args} });
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        # Own process group: a Ctrl-C aimed at prove must not be what stops
        # Redis halfway through a test's cleanup.
        POSIX::setpgid(0, 0);
        open STDIN, '<', '/dev/null';
        exec @argv or POSIX::_exit(127);
    }
    $self->{pid} = $pid;
    RLTest::Proc::register_pid($pid, 'redis');
    my $deadline = time + 10;
    while (time < $deadline) {
        my $c = eval { $self->client };
        if ($c && eval { $c->cmd('PING') } && !$@) {
            $self->{client} = $c;
            return $self;
        }
        last unless alive($pid);
        sleep 0.05;
    }
    $self->stop;
    die "redis-server did not come up on port $self->{port}; see $self->{dir}/redis.log\n";
}

sub stop {
    my ($self) = @_;
    return unless $self->{pid};
    delete $self->{client};
    kill 'CONT', $self->{pid};    # a SIGSTOPped server would never act on TERM
    kill_and_wait($self->{pid}, 'TERM', 5);
    waitpid $self->{pid}, 0;
    RLTest::Proc::unregister_pid($self->{pid});
    delete $self->{pid};
}

# Stop and start again on the same port: data and script cache are gone,
# every client connection is cut.
sub restart {
    my ($self) = @_;
    $self->stop;
    $self->start;
}

sub port   { $_[0]{port} }
sub socket_path { $_[0]{socket} }
sub pid    { $_[0]{pid} }

sub client {
    my ($self, %o) = @_;
    return RLTest::Redis::Client->new(name => $o{name},
        $o{unix} ? (path => $self->{socket}) : (port => $self->{port}));
}

sub cmd {
    my ($self, @args) = @_;
    $self->{client} ||= $self->client;
    my $r = eval { $self->{client}->cmd(@args) };
    return $r unless $@;
    # Tests kill clients and set idle timeouts; a server that closed this
    # connection never read the command, so one retry on a new one is safe.
    die $@ unless $@ =~ /EOF|reset|Broken pipe|write/i;
    $self->{client} = $self->client;
    return $self->{client}->cmd(@args);
}

# A fresh database and script cache, as every test block expects.
sub reset {
    my ($self) = @_;
    kill 'CONT', $self->{pid} if $self->{pid};
    # The persistent client may have been cut by CLIENT KILL tests.
    delete $self->{client};
    $self->cmd('FLUSHALL');
    $self->cmd('SCRIPT', 'FLUSH');
    $self->cmd('CONFIG', 'RESETSTAT');
}

# Clients other than the harness's own connections.
sub foreign_clients {
    my ($self) = @_;
    my $list = $self->cmd('CLIENT', 'LIST');
    my @c;
    for my $line (split /\n/, $list) {
        my %f = map { /^([^=]+)=(.*)$/ ? ($1, $2) : () } split / /, $line;
        next if ($f{name} // '') eq 'rltest';
        push @c, \%f;
    }
    return @c;
}

# redis-cli style tokenizer: words, "double quoted" with \-escapes, 'single'.
sub split_command {
    my ($line) = @_;
    my @w;
    while ($line =~ /\G\s*(?:"((?:[^"\\]|\\.)*)"|'([^']*)'|(\S+))/gc) {
        if (defined $1) {
            my $s = $1;
            $s =~ s/\\x([0-9a-fA-F]{2})/chr hex $1/ge;
            $s =~ s/\\n/\n/g; $s =~ s/\\r/\r/g; $s =~ s/\\t/\t/g;
            $s =~ s/\\(.)/$1/g;
            push @w, $s;
        } else {
            push @w, defined $2 ? $2 : $3;
        }
    }
    return @w;
}

# Replies rendered the way the redis_check section spells expectations.
sub format_reply {
    my ($r) = @_;
    return '(nil)' unless defined $r;
    return "ERR:" . $r->message if ref $r eq 'RLTest::Redis::Error';
    return join ' ', map { format_reply($_) } @$r if ref $r eq 'ARRAY';
    return $r;
}

package RLTest::Redis::Error;

sub new { bless { msg => $_[1] }, $_[0] }
sub message { $_[0]{msg} }

package RLTest::Redis::Client;

use strict;
use warnings;
use IO::Select;
use Time::HiRes qw(time);

sub new {
    my ($class, %o) = @_;
    my $sock = $o{path}
        ? IO::Socket::UNIX->new(Type => IO::Socket::SOCK_STREAM(), Peer => $o{path})
        : IO::Socket::INET->new(PeerAddr => $o{host} || '127.0.0.1', PeerPort => $o{port},
              Proto => 'tcp', Timeout => 5);
    die "redis connect: $!\n" unless $sock;
    binmode $sock;
    my $self = bless { sock => $sock, buf => '', timeout => $o{timeout} || 10 }, $class;
    # Named so that connection counting can tell the harness apart from nginx.
    $self->cmd('CLIENT', 'SETNAME', $o{name} || 'rltest');
    return $self;
}

sub encode {
    my (@args) = @_;
    my $s = '*' . @args . "\r\n";
    $s .= '$' . length($_) . "\r\n$_\r\n" for map { defined $_ ? "$_" : '' } @args;
    return $s;
}

sub send_cmd {
    my ($self, @args) = @_;
    my $data = encode(@args);
    while (length $data) {
        my $n = syswrite $self->{sock}, $data;
        die "redis write: $!\n" unless defined $n;
        substr($data, 0, $n, '');
    }
}

sub cmd {
    my ($self, @args) = @_;
    $self->send_cmd(@args);
    return $self->read_reply;
}

# Blocking read of one reply with a deadline; an error reply comes back as
# an RLTest::Redis::Error object rather than an exception so that tests can
# assert on it.
sub read_reply {
    my ($self) = @_;
    my $deadline = time + $self->{timeout};
    my $sel = IO::Select->new($self->{sock});
    while (1) {
        my ($reply, $used) = parse($self->{buf}, 0);
        if (defined $used) {
            substr($self->{buf}, 0, $used, '');
            return $reply;
        }
        my $left = $deadline - time;
        die "redis read timed out\n" if $left <= 0;
        next unless $sel->can_read($left);
        my $n = sysread $self->{sock}, $self->{buf}, 65536, length $self->{buf};
        die "redis read: " . (defined $n ? 'EOF' : $!) . "\n" unless $n;
    }
}

# For event loops: one read (call it when select says readable), then
# (1, reply) if a whole reply is buffered, else ().
sub poll_reply {
    my ($self) = @_;
    my $n = sysread $self->{sock}, $self->{buf}, 65536, length $self->{buf};
    die "redis read: " . (defined $n ? 'EOF' : $!) . "\n" unless $n || $!{EAGAIN};
    my ($reply, $used) = parse($self->{buf}, 0);
    return unless defined $used;
    substr($self->{buf}, 0, $used, '');
    return (1, $reply);
}

# Incremental RESP2 parser: returns (value, end offset) or () if incomplete.
sub parse {
    my ($buf, $pos) = @_;
    my $eol = index $buf, "\r\n", $pos;
    return if $eol < 0;
    my $type = substr $buf, $pos, 1;
    my $line = substr $buf, $pos + 1, $eol - $pos - 1;
    my $next = $eol + 2;
    if ($type eq '+') { return ($line, $next) }
    if ($type eq '-') { return (RLTest::Redis::Error->new($line), $next) }
    if ($type eq ':') { return ($line + 0, $next) }
    if ($type eq '$') {
        return (undef, $next) if $line < 0;
        return if length($buf) < $next + $line + 2;
        return (substr($buf, $next, $line), $next + $line + 2);
    }
    if ($type eq '*') {
        return (undef, $next) if $line < 0;
        my @a;
        for (1 .. $line) {
            my ($v, $p) = parse($buf, $next);
            return unless defined $p;
            push @a, $v;
            $next = $p;
        }
        return (\@a, $next);
    }
    die "bad RESP type '$type'\n";
}

sub sock { $_[0]{sock} }
sub close { close $_[0]{sock} }

1;

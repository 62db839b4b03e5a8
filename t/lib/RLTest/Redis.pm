package RLTest::Redis;

# A real redis-server per test file plus a minimal RESP2 client.  No mock:
# the module under test must face the same server the users run.

use strict;
use warnings;
use IO::Socket::INET;
use IO::Socket::UNIX;
use RLTest::Proc qw(free_port);
use RLTest::Servers;

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
    # The socket must be usable by nginx workers, which run as nobody.
    my @argv = (RLTest::Servers::redis_server(), '--port', $self->{port}, '--bind', '127.0.0.1',
        '--unixsocket', $self->{socket}, '--unixsocketperm', '777',
        '--save', '', '--appendonly', 'no', '--dir', $self->{dir},
        '--enable-debug-command', 'local', '--daemonize', 'no',
        '--logfile', "$self->{dir}/redis.log", '--maxclients', '4000',
        @{ $self->{args} });
    # A set of one: the fork, the wait and the stop are the test beds' too.
    my $srv = $self->{servers} ||= RLTest::Servers->new(what => 'redis',
        logs => "$self->{dir}/redis.log");
    $self->{pid} = $srv->spawn($self->{port}, @argv);
    return $self if eval { $srv->wait_ping($self->{port}) };
    $self->stop;
    die "redis-server did not come up on port $self->{port}; see $self->{dir}/redis.log\n";
}

sub stop {
    my ($self) = @_;
    return unless $self->{pid};
    $self->{servers}->stop($self->{port});
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

# Over the harness's own connection, re-opened once if a test cut it.
sub cmd {
    my ($self, @args) = @_;
    $self->{servers} ||= RLTest::Servers->new(what => 'redis');
    return $self->{servers}->cmd($self->{port}, @args);
}

# A fresh database and script cache, as every test block expects.
sub reset {
    my ($self) = @_;
    kill 'CONT', $self->{pid} if $self->{pid};
    # The persistent client may have been cut by CLIENT KILL tests.
    $self->{servers}->drop_client($self->{port}) if $self->{servers};
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

# Connections that enabled key tracking (CLIENT LIST's flag t): a worker's tracker, once ready.
sub tracking_clients {
    my ($self) = @_;
    return scalar grep { ($_->{flags} // '') =~ /t/ } $self->foreign_clients;
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

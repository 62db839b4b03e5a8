package RLTest::Nginx;

# One nginx instance under test: its own prefix directory, port, config and
# logs.  Started daemonised as users run it; stopped gracefully (QUIT) so
# that shutdown problems ("open socket ... left") reach error.log.

use strict;
use warnings;
use File::Path qw(make_path remove_tree);
use File::Basename qw(dirname);
use Cwd qw(abs_path);
use POSIX ();
use Time::HiRes qw(sleep time);
use RLTest::Proc qw(free_port alive kill_and_wait children_of wait_for_port);

my $repo = abs_path(dirname(__FILE__) . '/../../..');

sub repo_root { $repo }

# build/ holds what `make build` produced.  Without it (a developer's tree
# after a plain `cargo build`) the newest cargo module is used with an nginx
# binary of the same profile, and the choice is printed so that a stale
# artefact does not go unnoticed.
my %found;
sub artefacts {
    return %found if %found;
    my $abs = sub { my $p = shift; $p =~ m{^/} ? $p : "$repo/$p" };
    my $newest = sub { (sort { -M $a <=> -M $b } grep { -f } map { glob $_ } @_)[0] };
    my $module = $ENV{TEST_NGINX_MODULE} && $abs->($ENV{TEST_NGINX_MODULE});
    my $binary = $ENV{TEST_NGINX_BINARY} && $abs->($ENV{TEST_NGINX_BINARY});
    my $guessed;
    if (!$module && !-e "$repo/build/ngx_http_ratelimit_module.so") {
        $module = $newest->("$repo/target/*/libngx_http_ratelimit.so");
        $guessed = 1 if $module;
    }
    $module ||= "$repo/build/ngx_http_ratelimit_module.so";
    if (!$binary && !-e "$repo/build/nginx") {
        my ($profile) = $module =~ m{^(.*/target/[^/]+)/[^/]+$};
        $binary = $newest->(($profile || "$repo/target/*")
            . '/build/nginx-sys-*/out/objs/nginx');
        $guessed = 1 if $binary;
    }
    $binary ||= "$repo/build/nginx";
    print STDERR "# build/ incomplete; testing $binary with $module\n" if $guessed;
    return %found = (module => $module, binary => $binary);
}

sub binary { my %a = artefacts(); $a{binary} }

# Valgrind (t/valgrind.sh).  TEST_NGINX_VALGRIND=1, or the path of a
# suppressions file to use instead of t/valgrind.supp, runs every nginx this
# harness starts (nginx -t too) under memcheck.  Valgrind stays in the
# processes nginx forks (the daemon child, the workers, after a HUP the new
# workers), and each writes <prefix>/valgrind.s<start>.t<test>.<pid>.log
# (start count of the instance, Test::More test number at the start, pid);
# t/valgrind-check.pl reads them.  TEST_NGINX_VALGRIND_OPTS adds options
# (for example --track-origins=yes).  Everything is ~20-50x slower, so the
# harness's own deadlines (pid file, port, workers, graceful quit) are
# multiplied by $SLOW; they only cost time when something hangs.
my $valgrind = $ENV{TEST_NGINX_VALGRIND};
$valgrind = undef if defined $valgrind && $valgrind =~ /^0?$/;
our $SLOW = $valgrind ? 10 : 1;

sub valgrind { $valgrind ? 1 : 0 }

sub valgrind_cmd {
    my ($self) = @_;
    return () unless $valgrind;
    my $supp = $valgrind eq '1' ? "$repo/t/valgrind.supp" : $valgrind;
    my $tag = sprintf 's%d.t%d', ++$self->{vg_runs},
        eval { Test::More->builder->current_test } // 0;
    return ('valgrind', '--tool=memcheck', '--trace-children=no',
        '--child-silent-after-fork=no', '--error-exitcode=0', '--num-callers=30',
        '--leak-check=full', '--show-leak-kinds=definite', '--errors-for-leak-kinds=definite',
        "--suppressions=$supp", "--log-file=$self->{prefix}/valgrind.$tag.%p.log",
        split(' ', $ENV{TEST_NGINX_VALGRIND_OPTS} // ''));
}

sub module_path {
    return undef if $ENV{TEST_NGINX_NO_MODULE};
    my %a = artefacts();
    return $a{module};
}

sub new {
    my ($class, %o) = @_;
    my $self = bless {
        prefix   => $o{prefix},
        port     => $o{port} || free_port(),
        html_dir => $o{html_dir} || "$o{prefix}/html",
        workers  => $o{workers} || $ENV{TEST_NGINX_WORKERS} || 1,
        name     => $o{name} || 'nginx',
        # In another network namespace (RLTest::Netns::nginx_options): the
        # command prefix that runs nginx there and the address it listens on.
        prefix_cmd => $o{prefix_cmd} || [],
        host     => $o{host} || '127.0.0.1',
    }, $class;
    return $self;
}

sub port     { $_[0]{port} }
sub host     { $_[0]{host} }
# What http_get(-port => ...) and http_request(port => ...) take.
sub addr     { $_[0]{host} eq '127.0.0.1' ? $_[0]{port} : "$_[0]{host}:$_[0]{port}" }
sub prefix   { $_[0]{prefix} }
sub html_dir { $_[0]{html_dir} }
sub pid      { $_[0]{pid} }

# Replace $TEST_NGINX_* by their values; this instance's own port and prefix
# win over the environment so that two instances can share one config text.
sub expand {
    my ($self, $text) = @_;
    return $text unless defined $text;
    my %v = (%ENV, TEST_NGINX_SERVER_PORT => $self->{port},
        TEST_NGINX_SERVROOT => $self->{prefix}, TEST_NGINX_HTML_DIR => $self->{html_dir});
    $text =~ s/\$(TEST_NGINX_[A-Z0-9_]+)/defined $v{$1} ? $v{$1} : "\$$1"/ge;
    return $text;
}

# The whole nginx.conf from Test::Nginx-style sections.
sub build_conf {
    my ($self, %s) = @_;
    my $main = $s{main_config} // '';
    my $module = module_path();
    my $workers = $s{workers} || $self->{workers};
    my $level = $s{log_level} || 'info';
    my $c = '';
    # Modules ours is tested beside (Debian's nginx: ndk + lua), loaded first.
    $c .= "load_module $_;\n" for split ' ', $ENV{TEST_NGINX_LOAD_MODULES} // '';
    $c .= "load_module $module;\n" if $module;
    $c .= "daemon on;\n" unless $main =~ /^\s*daemon\s/m;
    $c .= "master_process on;\n" unless $main =~ /^\s*master_process\s/m;
    $c .= "worker_processes $workers;\n" unless $main =~ /^\s*worker_processes\s/m;
    $c .= "pid logs/nginx.pid;\n";
    $c .= "error_log logs/error.log $level;\n";
    $c .= "$main\n";
    my $events = $s{events} // 'worker_connections 1024;';
    $c .= "events {\n    $events\n}\n\n";
    $c .= "http {\n";
    $c .= "    default_type text/plain;\n";
    $c .= "    access_log logs/access.log;\n";
    $c .= "    keepalive_timeout 10s;\n";
    $c .= ($s{http_config} // '') . "\n";
    $c .= "    server {\n";
    $c .= "        listen $self->{host}:$self->{port};\n";
    $c .= "        server_name localhost;\n";
    $c .= "        root $self->{html_dir};\n";
    $c .= ($s{config} // '') . "\n";
    $c .= "    }\n}\n";
    return $self->expand($c);
}

# Static files every test may serve; the access phase runs before the
# content handler, so a limited location needs a real file (not "return").
sub write_html {
    my ($self, $files) = @_;
    make_path($self->{html_dir});
    my %f = ('index.html' => "ok\n", 't' => "ok\n", 'u' => "ok\n", 'api' => "ok\n",
        %{ $files || {} });
    for my $name (keys %f) {
        my $path = "$self->{html_dir}/$name";
        make_path(dirname($path));
        open my $fh, '>', $path or die "$path: $!";
        print $fh $f{$name};
        close $fh;
    }
}

sub write_conf {
    my ($self, $text) = @_;
    make_path("$self->{prefix}/conf", "$self->{prefix}/logs");
    my $file = "$self->{prefix}/conf/nginx.conf";
    open my $fh, '>', $file or die "$file: $!";
    print $fh $text;
    close $fh;
    $self->{conf_text} = $text;
    return $file;
}

sub conf_file { "$_[0]{prefix}/conf/nginx.conf" }

sub run_binary {
    my ($self, @args) = @_;
    my $out = "$self->{prefix}/logs/nginx.stderr";
    my @cmd = (@{ $self->{prefix_cmd} }, $self->valgrind_cmd, binary());
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDOUT, '>', $out;
        open STDERR, '>&', \*STDOUT;
        open STDIN, '<', '/dev/null';
        { exec @cmd, '-p', "$self->{prefix}/", '-c', 'conf/nginx.conf', @args }
        POSIX::_exit(127);
    }
    # nginx -t and the daemonising parent both exit within moments.
    my $deadline = time + 30 * $SLOW;
    my $rc;
    while (time < $deadline) {
        my $r = waitpid $pid, 1;
        if ($r == $pid) { $rc = $? >> 8; last }
        sleep 0.01;
    }
    unless (defined $rc) { kill 'KILL', $pid; waitpid $pid, 0; $rc = -1 }
    local $/;
    open my $fh, '<', $out;
    my $text = <$fh> // '';
    return ($rc, $text);
}

# nginx -t: (exit code, combined output).  The config is written as given
# (after $TEST_NGINX_ expansion) so that file:line in messages is predictable.
sub test_conf {
    my ($self, $text) = @_;
    $self->write_conf($self->expand($text));
    return $self->run_binary('-t');
}

sub start {
    my ($self, $text) = @_;
    $self->stop if $self->{pid};
    remove_tree("$self->{prefix}/logs");
    $self->write_conf($self->expand($text));
    $self->write_html unless -e "$self->{html_dir}/index.html";
    unlink "$self->{prefix}/logs/nginx.pid";
    my ($rc, $out) = $self->run_binary;
    die "nginx failed to start (exit $rc): $out\n" if $rc;
    my $pidfile = "$self->{prefix}/logs/nginx.pid";
    my $deadline = time + 10 * $SLOW;
    while (time < $deadline) {
        if (open my $fh, '<', $pidfile) {
            my $p = <$fh>;
            if ($p && $p =~ /^(\d+)/) { $self->{pid} = $1; last }
        }
        sleep 0.01;
    }
    die "nginx wrote no pid file; stderr: $out\n" unless $self->{pid};
    RLTest::Proc::register_pid($self->{pid}, "nginx $self->{name}");
    wait_for_port($self->addr, 10 * $SLOW) or die "nginx is not listening on " . $self->addr . "\n";
    $self->wait_workers($self->count_workers);
    return $self;
}

sub count_workers {
    my ($self) = @_;
    my $conf = $self->{conf_text};
    return 0 if $conf =~ /^\s*master_process\s+off/m;
    return $conf =~ /^\s*worker_processes\s+(\d+)/m ? $1 : 1;
}

# Wait until $n workers run (and, after a reload, none of @old remain among
# the children), so that the next request meets the configuration asked for.
sub wait_workers {
    my ($self, $n, @old) = @_;
    my %old = map { $_ => 1 } @old;
    my $deadline = time + 10 * $SLOW;
    while (time < $deadline) {
        my @w = grep { !$old{$_} } $self->worker_pids;
        return @w if @w >= $n;
        sleep 0.02;
    }
    return;
}

sub worker_pids {
    my ($self) = @_;
    return () unless $self->{pid};
    return grep { alive($_) } children_of($self->{pid});
}

# HUP with an optional new config; returns once the new workers are up.
# The old ones may still be finishing in-flight requests.
sub reload {
    my ($self, $text) = @_;
    $self->write_conf($self->expand($text)) if defined $text;
    my @old = $self->worker_pids;
    kill 'HUP', $self->{pid};
    return $self->wait_workers($self->count_workers, @old);
}

# Graceful stop.  Returns 1 if the master left within $timeout seconds of
# QUIT; otherwise it is terminated and 0 is returned.
sub stop {
    my ($self, %o) = @_;
    my $pid = delete $self->{pid} or return 1;
    my @workers = children_of($pid);
    my $ok = kill_and_wait($pid, $o{signal} || 'QUIT', ($o{timeout} || 15) * $SLOW);
    unless ($ok) {
        kill 'KILL', grep { alive($_) } @workers;
    }
    RLTest::Proc::unregister_pid($pid);
    return $ok;
}

sub read_file {
    my ($self, $name) = @_;
    my $path = $name =~ m{^/} ? $name : "$self->{prefix}/$name";
    open my $fh, '<', $path or return '';
    local $/;
    return <$fh> // '';
}

sub error_log_text  { $_[0]->read_file('logs/error.log') }
sub access_log_text { $_[0]->read_file('logs/' . ($_[1] || 'access.log')) }

# The line numbers nginx reports are those of the written file.
sub line_of {
    my ($self, $needle) = @_;
    my @lines = split /\n/, $self->{conf_text} // '';
    for my $i (0 .. $#lines) {
        return $i + 1 if index($lines[$i], $needle) >= 0;
    }
    return undef;
}

1;

package RLTest;

# Test::Nginx::Socket-like runner for this module's suites.  Blocks are read
# by Test::Base (`=== TEST n`, `--- section`); every block gets a fresh nginx
# (real binary, real module) and a flushed real redis-server.  The plain
# helpers below are exported too, for suites written as ordinary Perl.

use strict;
use warnings;
use File::Path qw(make_path remove_tree);
use File::Basename qw(basename);
use Time::HiRes qw(sleep time);
use Test::More ();
BEGIN { *done_testing = \&Test::More::done_testing; *note = \&Test::More::note;
        *explain = \&Test::More::explain; *subtest = \&Test::More::subtest; }
use RLTest::Proc qw(free_port);
use RLTest::Redis;
use RLTest::Nginx;
use RLTest::HTTP qw(http_request http_start http_finish http_parallel http_pipelined header);

our @EXPORT = qw(
    run_tests repeat_each workers log_level
    setup servroot html_dir server_port
    start_redis stop_redis redis redis_cmd redis_client
    nginx start_nginx stop_nginx reload_nginx nginx_t
    http_get http_request http_start http_finish http_parallel http_pipelined header
    error_log_text access_log_text check_no_alerts wait_until nginx_has
    free_port done_testing note explain subtest
);

sub import {
    my $caller = caller;
    # Test::Base supplies plan/blocks/filters and Test::More's functions to
    # the test file, which is also where it finds __DATA__.
    eval "package $caller; use Test::Base; 1" or die $@;
    no strict 'refs';
    *{"${caller}::$_"} = \&{"RLTest::$_"} for @EXPORT;
}

my ($servroot, $redis, %nginx, $repeat, $default_workers, $default_log_level);

sub repeat_each { $repeat = shift if @_; $repeat || 1 }
sub workers     { $default_workers = shift }
sub log_level   { $default_log_level = shift }

# Per test file: its own servroot (kept after the run for inspection),
# Redis, ports, and the TEST_NGINX_* variables configs may use.
sub setup {
    return $servroot if $servroot;
    my $name = basename($0);
    $name =~ s/\.t$//;
    $servroot = $ENV{TEST_NGINX_SERVROOT_BASE}
        ? "$ENV{TEST_NGINX_SERVROOT_BASE}/$name"
        : RLTest::Nginx::repo_root() . "/t/servroot/$name";
    remove_tree($servroot);
    make_path($servroot);
    my $n = nginx();
    $n->write_html;
    $ENV{TEST_NGINX_SERVER_PORT} = $n->port;
    $ENV{TEST_NGINX_HTML_DIR}    = $n->html_dir;
    $ENV{TEST_NGINX_SERVROOT}    = $servroot;
    $ENV{TEST_NGINX_REPO}        = RLTest::Nginx::repo_root();
    # Nothing listens here: a Redis that is down.
    $ENV{TEST_NGINX_DEAD_PORT}   = free_port();
    start_redis();
    return $servroot;
}

sub servroot    { setup() }
sub html_dir    { setup(); nginx()->html_dir }
sub server_port { setup(); nginx()->port }

sub start_redis {
    setup() unless $servroot;
    return $redis if $redis && $redis->pid;
    $redis ||= RLTest::Redis->new(dir => "$servroot/redis");
    $redis->start;
    $ENV{TEST_NGINX_REDIS_PORT}   = $redis->port;
    $ENV{TEST_NGINX_REDIS_SOCKET} = $redis->socket_path;
    return $redis;
}

sub stop_redis   { $redis->stop if $redis }
sub redis        { setup(); $redis }
sub redis_cmd    { redis()->cmd(@_) }
sub redis_client { redis()->client(@_) }

# Named instances; the default one lives in the servroot itself so that
# $TEST_NGINX_SERVROOT/logs/error.log is its log.
sub nginx {
    my $name = $_[0] || 'nginx';
    setup();
    return $nginx{$name} ||= RLTest::Nginx->new(
        name => $name,
        prefix => $name eq 'nginx' ? $servroot : "$servroot/$name",
        html_dir => "$servroot/html",
    );
}

# start_nginx(http_config => ..., config => ..., name => 'b') or
# start_nginx($whole_conf_text, name => 'b').
sub conf_args {
    my @args = @_;
    my $text = @args % 2 ? shift @args : undef;
    my %o = @args;
    my $n = nginx($o{name});
    $text //= $n->build_conf(workers => $default_workers,
        log_level => $default_log_level, %o);
    return ($n, $text);
}

sub start_nginx {
    setup();
    my ($n, $text) = conf_args(@_);
    return $n->start($text);
}

sub stop_nginx   { nginx($_[0])->stop(@_[1 .. $#_]) }

sub reload_nginx {
    my ($n, $text) = @_ ? conf_args(@_) : (nginx(), undef);
    return $n->reload($text);
}

# nginx -t on a config: returns (exit code, output, instance); the instance
# knows the written file, for line_of().
sub nginx_t {
    setup();
    my ($n, $text) = conf_args(@_, name => 'conftest');
    my ($rc, $out) = $n->test_conf($text);
    return ($rc, $out, $n);
}

# Whether the nginx under test has a module: built in (nginx -V) or loaded
# through TEST_NGINX_LOAD_MODULES.
my $nginx_v;
sub nginx_has {
    my ($module) = @_;
    $nginx_v //= do {
        my $bin = RLTest::Nginx::binary();
        `$bin -V 2>&1`;
    };
    return 1 if $nginx_v =~ /--with-\Q$module\E\b/;
    return ($ENV{TEST_NGINX_LOAD_MODULES} // '') =~ /\Q$module\E/ ? 1 : 0;
}

sub http_get {
    my ($path, %headers) = @_;
    my $port = delete $headers{-port} || server_port();
    return http_request(port => $port, request => "GET $path",
        headers => [map { [$_, $headers{$_}] } sort keys %headers]);
}

sub error_log_text  { nginx($_[0])->error_log_text }
sub access_log_text { nginx()->access_log_text(@_) }

# Poll $code until it returns true or $timeout seconds pass.
sub wait_until {
    my ($timeout, $code, $step) = @_;
    my $deadline = time + $timeout;
    while (time < $deadline) {
        my $v = $code->();
        return $v if $v;
        sleep($step || 0.05);
    }
    return $code->();
}

# The check every block ends with: nothing at alert/crit/emerg level, no
# leaked connection, no crashed worker.  %allow names levels a test expects.
sub check_no_alerts {
    my ($text, $name, %allow) = @_;
    my @bad = grep {
        (/\[(alert|crit|emerg)\]/ && !$allow{$1}) || /open socket/ || /exited on signal/
    } split /\n/, $text;
    Test::More::ok(!@bad, "$name - no alerts")
        or Test::More::diag(join "\n", @bad[0 .. ($#bad < 9 ? $#bad : 9)]);
}

sub run_tests {
    setup();
    my @blocks = Test::Base::blocks();
    for my $block (@blocks) {
        for my $r (1 .. repeat_each()) {
            my $fails = grep { !$_ } Test::More->builder->summary;
            eval { run_block($block, $r) };
            Test::More::fail($block->name . " - harness: $@") if $@;
            nginx()->stop;
            if ((grep { !$_ } Test::More->builder->summary) > $fails) {
                my @log = split /\n/, nginx()->error_log_text;
                splice @log, 0, @log - 40 if @log > 40;
                Test::More::diag("error.log tail:\n" . join "\n", @log);
            }
        }
    }
    Test::More::done_testing() unless Test::More->builder->has_plan;
}

# Section value(s): undef when absent; a list (one per request) when the
# section was an eval'ed array, else the scalar.
sub section {
    my ($block, $name) = @_;
    return undef unless exists $block->{$name};
    my $v = $block->$name;
    return $v;
}

sub per_request {
    my ($v, $i) = @_;
    return ref $v eq 'ARRAY' ? $v->[$i] : $v;
}

sub expand { nginx()->expand($_[0]) }

sub lines {
    my ($v) = @_;
    return () unless defined $v;
    return map { ref $_ ? $_ : expand($_) } @$v if ref $v eq 'ARRAY';
    return $v if ref $v eq 'Regexp';
    return grep { /\S/ } map { s/^\s+|\s+$//gr } split /\n/, expand($v);
}

sub find_in_text {
    my ($text, $pat) = @_;
    return ref $pat eq 'Regexp' ? scalar($text =~ $pat) : index($text, $pat) >= 0;
}

sub run_block {
    my ($block, $round) = @_;
    my $name = $block->name . ($round > 1 ? " (repeat $round)" : '');
    if (exists $block->{skip_nginx}) {
        Test::More::note("$name skipped: " . ($block->skip_nginx // ''));
        return;
    }
    # Test::Nginx's form "N: expr"; the count is not needed with done_testing.
    if (defined(my $cond = section($block, 'skip_eval'))) {
        $cond =~ s/^\s*\d+\s*:\s*//;
        my $skip = eval "package main; $cond";
        die "skip_eval: $@" if $@;
        if ($skip) { Test::More::note("$name skipped: $cond"); return }
    }
    $redis->reset;
    for my $line (lines(section($block, 'redis'))) {
        my $r = $redis->cmd(RLTest::Redis::split_command($line));
        Test::More::fail("$name - redis setup '$line': " . $r->message)
            if ref $r eq 'RLTest::Redis::Error';
    }

    my %conf = (
        workers => $block->{workers} ? $block->workers : $default_workers,
        log_level => $block->{log_level} ? $block->log_level : $default_log_level,
        map { exists $block->{$_} ? ($_ => $block->$_) : () }
            qw(main_config http_config config),
    );
    chomp $conf{$_} for grep { defined $conf{$_} } qw(workers log_level);
    my $n = nginx();
    write_user_files($n, section($block, 'user_files'));

    if (exists $block->{must_die}) {
        my ($rc, $out) = nginx_t(%conf);
        Test::More::ok($rc != 0, "$name - nginx -t fails") or Test::More::diag($out);
        for my $pat (lines(section($block, 'error_log'))) {
            Test::More::ok(find_in_text($out, $pat), "$name - nginx -t says '$pat'")
                or Test::More::diag($out);
        }
        return;
    }

    my $started = eval { $n->start($n->build_conf(%conf)); 1 };
    unless ($started) {
        Test::More::fail("$name - nginx starts: $@");
        return;
    }
    if (defined(my $code = section($block, 'init'))) {
        eval "package main; $code; 1" or Test::More::fail("$name - init: $@");
    }

    my $reqs = section($block, 'request');
    my @reqs = ref $reqs eq 'ARRAY' ? @$reqs : defined $reqs ? ($reqs) : ();
    my $timeout = section($block, 'timeout');
    $timeout = defined $timeout ? $timeout + 0 : 10;
    my $abort = exists $block->{abort};
    for my $i (0 .. $#reqs) {
        my $tag = @reqs > 1 ? " (req $i)" : '';
        my $req = expand($reqs[$i]);
        $req =~ s/\s+\z//;
        my $res = http_request(port => $n->port, request => $req,
            headers => expand(per_request(section($block, 'more_headers'), $i)),
            $abort ? (abort_after => $timeout) : (timeout => $timeout));
        next if $abort && $res->{aborted};
        check_response($block, $res, $i, "$name$tag");
    }

    if (defined(my $w = section($block, 'wait'))) { sleep $w }

    for my $line (lines(section($block, 'redis_check'))) {
        my ($cmd, $op, $want) = $line =~ /^(.*?)\s+(=>|=~)\s+(.*)$/
            or do { Test::More::fail("$name - bad redis_check line '$line'"); next };
        my $got = RLTest::Redis::format_reply($redis->cmd(RLTest::Redis::split_command($cmd)));
        if ($op eq '=>') { Test::More::is($got, $want, "$name - redis: $cmd") }
        else { Test::More::like($got, qr/$want/, "$name - redis: $cmd") }
    }

    # Stopping first lets shutdown alerts and buffered log lines count.
    my $stopped = $n->stop;
    Test::More::ok($stopped, "$name - nginx quits gracefully");
    my $log = $n->error_log_text;
    my %allow;
    for my $pat (lines(section($block, 'error_log'))) {
        # A block that expects an alert-level line is not failed for it.
        $allow{$1} = 1 if "$pat" =~ /\[\\?(alert|crit|emerg)\\?\]/;
        Test::More::ok(find_in_text($log, $pat), "$name - error_log has '$pat'");
    }
    for my $pat (lines(section($block, 'no_error_log'))) {
        Test::More::ok(!find_in_text($log, $pat), "$name - error_log lacks '$pat'");
    }
    my $alog = $n->access_log_text;
    for my $pat (lines(section($block, 'access_log'))) {
        Test::More::ok(find_in_text($alog, $pat), "$name - access_log has '$pat'")
            or Test::More::diag("access.log:\n$alog");
    }
    check_no_alerts($log, $name, %allow);
}

# Test::Nginx's format: ">>> path" lines, each followed by its content.
sub write_user_files {
    my ($n, $text) = @_;
    return unless defined $text;
    my %files;
    my $cur;
    for my $line (split /^/, $text) {
        if ($line =~ /^>>> (\S+)/) { $cur = $1; $files{$cur} = ''; next }
        $files{$cur} .= $line if defined $cur;
    }
    $n->write_html({ map { $_ => expand($files{$_}) } keys %files });
}

sub check_response {
    my ($block, $res, $i, $name) = @_;
    if ($res->{error}) {
        Test::More::fail("$name - response: $res->{error}");
        return;
    }
    if (defined(my $code = per_request(section($block, 'error_code'), $i))) {
        chomp $code;
        Test::More::is($res->{status}, $code, "$name - status code ok");
    }
    my $hdrs = per_request(section($block, 'response_headers'), $i);
    for my $line (lines($hdrs)) {
        if ($line =~ /^!\s*(\S+)$/) {
            Test::More::ok(!defined header($res, $1), "$name - header $1 absent")
                or Test::More::diag("$1: " . header($res, $1));
        } elsif ($line =~ /^([^:\s]+)\s*:\s*(.*)$/) {
            Test::More::is(header($res, $1), $2, "$name - header $1");
        }
    }
    for my $line (lines(per_request(section($block, 'response_headers_like'), $i))) {
        my ($h, $re) = $line =~ /^([^:\s]+)\s*:\s*(.*)$/ or next;
        Test::More::like(header($res, $h) // '', qr/$re/, "$name - header $h like");
    }
    my $body = per_request(section($block, 'response_body'), $i);
    Test::More::is($res->{body}, expand($body), "$name - response_body") if defined $body;
    my $like = per_request(section($block, 'response_body_like'), $i);
    if (defined $like) {
        my $re = ref $like ? $like : do { chomp(my $s = expand($like)); qr/$s/s };
        Test::More::like($res->{body}, $re, "$name - response_body_like");
    }
}

# A fake Redis for protocol faults (t/lib/RLTest/FakeRedis.pm), started on a
# free port with its event log under the servroot:
# fake_redis(mode => 'garbage', name => 'g', split_delay => ..., close_after => ...).
use RLTest::FakeRedis;
push @EXPORT, 'fake_redis';
my %fakes;
sub fake_redis {
    my (%o) = @_;
    my $name = delete $o{name} // 'fake';
    my $dir = setup() . "/$name";
    $fakes{$name}->stop if $fakes{$name};
    my $f = RLTest::FakeRedis->new(dir => $dir, %o);
    $f->start;
    return $fakes{$name} = $f;
}

1;

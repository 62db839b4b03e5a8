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
use RLTest::Measure qw(cmdstat_calls metric_value proc_status_kb);

our @EXPORT = qw(
    run_tests repeat_each workers log_level
    setup servroot html_dir server_port
    start_redis stop_redis redis redis_cmd redis_client
    nginx start_nginx stop_nginx reload_nginx nginx_t
    http_get http_request http_start http_finish http_parallel http_pipelined header
    error_log_text access_log_text check_no_alerts wait_until nginx_has
    redis_calls metric proc_kb
    free_port done_testing note explain subtest
);

# RLTEST_HARNESS=test-nginx: files with blocks run them under the real
# Test::Nginx::Socket (RLTest/TestNginx.pm); files without run as always.
sub bridged {
    return 0 unless ($ENV{RLTEST_HARNESS} // 'rltest') eq 'test-nginx';
    open my $fh, '<', $0 or return 0;
    local $/;
    return <$fh> =~ /^__DATA__$/m ? 1 : 0;
}

sub import {
    my $caller = caller;
    my %theirs;
    if (bridged()) {
        require RLTest::TestNginx;
        %theirs = map { $_ => 1 } RLTest::TestNginx::load_into($caller);
    } else {
        die "RLTEST_HARNESS must be rltest or test-nginx\n"
            if ($ENV{RLTEST_HARNESS} // 'rltest') !~ /^(rltest|test-nginx)$/;
        # Test::Base supplies plan/blocks/filters and Test::More's functions
        # to the test file, which is also where it finds __DATA__.
        eval "package $caller; use Test::Base; 1" or die $@;
    }
    no strict 'refs';
    no warnings qw(redefine prototype);
    *{"${caller}::$_"} = \&{"RLTest::$_"} for grep { !$theirs{$_} } @EXPORT;
    *{"${caller}::run_tests"} = \&RLTest::TestNginx::run_tests if %theirs;
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
# $TEST_NGINX_SERVROOT/logs/error.log is its log.  Options after the name
# apply when the instance is first made: nginx('gw1', $netns->nginx_options(1))
# runs it in a network namespace (RLTest::Netns).
sub nginx {
    my ($name, %o) = @_;
    $name ||= 'nginx';
    setup();
    return $nginx{$name} ||= RLTest::Nginx->new(
        name => $name,
        prefix => $name eq 'nginx' ? $servroot : "$servroot/$name",
        html_dir => "$servroot/html",
        %o,
    );
}

# start_nginx(http_config => ..., config => ..., name => 'b') or
# start_nginx($whole_conf_text, name => 'b').
sub conf_args {
    my @args = @_;
    my $text = @args % 2 ? shift @args : undef;
    my %o = @args;
    my $n = nginx($o{name}, map { exists $o{$_} ? ($_ => delete $o{$_}) : () } qw(prefix_cmd host));
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

# Readings that die when they cannot read (RLTest::Measure): Redis' calls of
# a command since the block's CONFIG RESETSTAT (`called => 1`: it must have
# a line), one sample of the metrics page at $path (`-port => ...`), a kB
# field of /proc/<pid>/status.
sub redis_calls {
    my ($cmd, %o) = @_;
    return cmdstat_calls(redis_cmd('INFO', 'commandstats'), $cmd, %o);
}

sub metric {
    my ($path, $series, %o) = @_;
    my $r = http_get($path, $o{-port} ? (-port => $o{-port}) : ());
    die "metrics: GET $path answered " . ($r->{status} // 'nothing') . "\n"
        unless ($r->{status} // 0) == 200;
    return metric_value($r->{body}, $series);
}

sub proc_kb { proc_status_kb(@_) }

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

# Sections.  Those Test::Nginx::Socket also has mean what they mean there
# (t/README.md lists where that matters); this harness's own all start with
# rl_, so none can be taken for one of Test::Nginx's.  Any other name fails
# the block: Test::Nginx would ignore it, and with it an assertion.
my %SHARED = map { $_ => 1 } qw(main_config http_config config log_level user_files
    request more_headers timeout abort error_code error_code_like
    response_headers response_headers_like response_body response_body_like
    error_log no_error_log access_log wait init must_die skip_eval ignore_response
    ONLY SKIP LAST);
my %OWN = map { $_ => 1 } qw(rl_redis_setup rl_redis_check rl_workers
    rl_error_log rl_no_error_log rl_access_log);
# The names these sections had before (t/rename-sections.pl converts a file).
my %RENAMED = (redis => 'rl_redis_setup', redis_check => 'rl_redis_check',
    workers => 'rl_workers');
my %FOREIGN = (skip_nginx => "Test::Nginx's skip_nginx compares nginx versions "
    . "('N: < 1.21.1'); use skip_eval");
# Test::Nginx checks only the first section of each pair (an if/elsif).
my @EXCLUSIVE = (['error_code_like', 'error_code'],
    ['response_headers', 'response_headers_like'],
    ['response_body', 'response_body_like']);

sub check_sections {
    my ($block) = @_;
    my @err;
    for my $s (@{ $block->{_section_order}[0] || [] }) {
        next if $SHARED{$s} || $OWN{$s};
        push @err, $RENAMED{$s} ? "section '$s' is now '$RENAMED{$s}'"
            : $FOREIGN{$s} ? "section '$s': $FOREIGN{$s}"
            : "unknown section '$s'";
    }
    for (@EXCLUSIVE) {
        my ($first, $second) = @$_;
        push @err, "'$first' and '$second' in one block: Test::Nginx checks only '$first'"
            if exists $block->{$first} && exists $block->{$second};
    }
    die join('; ', @err) . "\n" if @err;
}

# The file's blocks, each checked for sections before anything runs.
sub checked_blocks {
    my @blocks = Test::Base::blocks();
    for my $block (@blocks) {
        eval { check_sections($block); 1 }
            or die $block->name . ": $@";
    }
    return @blocks;
}

# error_log and no_error_log are checked, as in Test::Nginx, after every
# request against what that request logged; check_accum_error_log() (before
# run_tests) makes each check see the block's whole log so far instead.
my $accum_error_log;
sub check_accum_error_log { $accum_error_log = 1 }
push @EXPORT, 'check_accum_error_log';

sub run_tests {
    setup();
    my @blocks = checked_blocks();
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

# Section value: undef when absent; an array when the section was eval'ed to one.
sub section {
    my ($block, $name) = @_;
    return undef unless exists $block->{$name};
    return $block->$name;
}

# Test::Nginx's rule for expectations: with several requests, a section is
# an array with one value per request; with one, a scalar (or a 1-array).
sub expected {
    my ($block, $name, $i, $n) = @_;
    my $v = section($block, $name);
    return undef unless defined $v;
    if ($n > 1) {
        die "'$name' must be an array with one value per request ($n requests), "
            . "as Test::Nginx requires\n" unless ref $v eq 'ARRAY';
        return $v->[$i];
    }
    return ref $v eq 'ARRAY' ? $v->[0] : $v;
}

# $TEST_NGINX_* in this harness's own sections and in the config: the default
# instance's port and prefix win (RLTest::TestNginx sets its own expander).
our $expander = sub { nginx()->expand($_[0]) };
sub expand { $expander->($_[0]) }

# Patterns of error_log-like sections: lines of a scalar (not expanded, as in
# Test::Nginx; use eval and %ENV for variables), or an eval'ed list/regex.
sub patterns {
    my ($v) = @_;
    return () unless defined $v;
    return grep { defined } @$v if ref $v eq 'ARRAY';
    return $v if ref $v eq 'Regexp';
    chomp $v;
    return grep { length } split /\n+/, $v;
}

# Lines of this harness's own sections, with $TEST_NGINX_* expanded.
sub lines {
    my ($v) = @_;
    return () unless defined $v;
    return map { ref $_ ? $_ : expand($_) } @$v if ref $v eq 'ARRAY';
    return $v if ref $v eq "Regexp";
    return grep { /\S/ } map { s/^\s+|\s+$//gr } split /\n/, expand($v);
}

sub find_in_text {
    my ($text, $pat) = @_;
    return ref $pat eq 'Regexp' ? scalar($text =~ $pat) : index($text, $pat) >= 0;
}

# Test::Nginx's time values: "2", "1.5s", "500ms".
sub parse_time {
    my ($t) = @_;
    return undef unless defined $t;
    $t =~ s/^\s+|\s+$//g;
    return $t =~ /^(.*?)ms$/ ? $1 / 1000 : $t =~ /^(.*?)s$/ ? $1 + 0 : $t + 0;
}

# A level in an expected error_log pattern is allowed in the final alert check.
sub allowed_levels {
    my ($block) = @_;
    my %allow;
    for my $pat (patterns(section($block, 'error_log')), lines(section($block, 'rl_error_log'))) {
        $allow{$1} = 1 if "$pat" =~ /\[\\?(alert|crit|emerg)/;
    }
    return %allow;
}

sub run_block {
    my ($block, $round) = @_;
    my $name = $block->name . ($round > 1 ? " (repeat $round)" : '');
    # Test::Nginx's form "N: expr" (N: the tests it stands for, not needed with done_testing).
    if (defined(my $cond = section($block, 'skip_eval'))) {
        $cond =~ s/^\s*\d+\s*:\s*//
            or die "skip_eval must read 'N: expr', as Test::Nginx requires\n";
        my $skip = eval "package main; $cond";
        die "skip_eval: $@" if $@;
        if ($skip) { Test::More::note("$name skipped: $cond"); return }
    }
    $redis->reset;
    for my $line (lines(section($block, 'rl_redis_setup'))) {
        my $r = $redis->cmd(RLTest::Redis::split_command($line));
        Test::More::fail("$name - redis setup '$line': " . $r->message)
            if ref $r eq 'RLTest::Redis::Error';
    }

    my %conf = (
        workers => $block->{rl_workers} ? $block->rl_workers : $default_workers,
        log_level => $block->{log_level} ? $block->log_level : $default_log_level,
        map { exists $block->{$_} ? ($_ => $block->$_) : () }
            qw(main_config http_config config),
    );
    chomp $conf{$_} for grep { defined $conf{$_} } qw(workers log_level);
    # Under valgrind a new worker's first decision (its connection, the script's load, the
    # call) can outlast the default 200 ms timeout and pass by ratelimit_fail: a block that
    # names no timeout gets SLOW times the default there, and only there.
    if (RLTest::Nginx::valgrind() && defined $conf{http_config}) {
        my $ms = 200 * $RLTest::Nginx::SLOW;
        $conf{http_config} =~ s{(\bratelimit_redis\b[^;]*?)\s*;}
            {my $line = $1; $line =~ /\btimeout=/ ? "$line;" : "$line timeout=${ms}ms;"}ge;
    }
    my $n = nginx();
    write_user_files($n, section($block, 'user_files'));

    if (exists $block->{must_die}) {
        my ($rc, $out) = nginx_t(%conf);
        Test::More::ok($rc != 0, "$name - nginx -t fails") or Test::More::diag($out);
        for my $pat (patterns(section($block, 'error_log'))) {
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
    my $timeout = parse_time(section($block, 'timeout')) // 10;
    my $wait = parse_time(section($block, 'wait'));
    my $abort = exists $block->{abort};
    my $more = section($block, 'more_headers');
    my $log_pos = 0;
    for my $i (0 .. $#reqs) {
        my $tag = @reqs > 1 ? " (req $i)" : '';
        my $req = $reqs[$i];
        $req =~ s/\s+\z//;
        my $headers = ref $more eq 'ARRAY' ? $more->[$i] : $more;
        die "more_headers has no entry for request $i, as Test::Nginx requires\n"
            if ref $more eq 'ARRAY' && !defined $headers;
        my $res = http_request(port => $n->port, request => $req, headers => $headers,
            $abort ? (abort_after => $timeout) : (timeout => $timeout));
        # Given up on: no response, which only ignore_response makes no failure.
        $res = { status => '', headers => {}, body => '' } if $res->{aborted};
        check_response($block, $res, $i, scalar @reqs, "$name$tag")
            unless exists $block->{ignore_response};
        sleep $wait if $wait;
        $log_pos = check_request_logs($block, $n, $log_pos, "$name$tag");
    }

    for my $line (lines(section($block, 'rl_redis_check'))) {
        my ($cmd, $op, $want) = $line =~ /^(.*?)\s+(=>|=~)\s+(.*)$/
            or do { Test::More::fail("$name - bad rl_redis_check line '$line'"); next };
        my $got = RLTest::Redis::format_reply($redis->cmd(RLTest::Redis::split_command($cmd)));
        if ($op eq '=>') { Test::More::is($got, $want, "$name - redis: $cmd") }
        else { Test::More::like($got, qr/$want/, "$name - redis: $cmd") }
    }

    # Stopping first lets shutdown alerts and buffered log lines count.
    my $stopped = $n->stop;
    Test::More::ok($stopped, "$name - nginx quits gracefully");
    my $log = $n->error_log_text;
    for my $pat (lines(section($block, 'rl_error_log'))) {
        Test::More::ok(find_in_text($log, $pat), "$name - whole error.log has '$pat'");
    }
    for my $pat (lines(section($block, 'rl_no_error_log'))) {
        Test::More::ok(!find_in_text($log, $pat), "$name - whole error.log lacks '$pat'");
    }
    if (my @access = lines(section($block, 'rl_access_log'))) {
        my $alog = $n->access_log_text;
        for my $pat (@access) {
            Test::More::ok(find_in_text($alog, $pat), "$name - whole access.log has '$pat'")
                or Test::More::diag("access.log:\n$alog");
        }
    }
    check_no_alerts($log, $name, allowed_levels($block));
}

# After each request, as Test::Nginx does: error_log and no_error_log against
# what was logged since the previous request (or everything, with
# check_accum_error_log), access_log against the whole access log.  Returns
# the new error.log position.
sub check_request_logs {
    my ($block, $n, $pos, $name) = @_;
    my @want = patterns(section($block, 'error_log'));
    my @unwanted = patterns(section($block, 'no_error_log'));
    my @access = patterns(section($block, 'access_log'));
    return $pos unless @want || @unwanted || @access;
    # Lines of the log phase are written after the response has been sent.
    sleep 0.05;
    my $text = $n->error_log_text;
    my $part = $accum_error_log ? $text : substr($text, $pos);
    for my $pat (@want) {
        Test::More::ok(find_in_text($part, $pat), "$name - error_log has '$pat'");
    }
    for my $pat (@unwanted) {
        Test::More::ok(!find_in_text($part, $pat), "$name - error_log lacks '$pat'");
    }
    if (@access) {
        my $alog = $n->access_log_text;
        for my $pat (@access) {
            Test::More::ok(find_in_text($alog, $pat), "$name - access_log has '$pat'")
                or Test::More::diag("access.log:\n$alog");
        }
    }
    return length $text;
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

# Test::Nginx::Socket's response checks: the status (200 when the block names
# none), headers, body.
sub check_response {
    my ($block, $res, $i, $n, $name) = @_;
    if ($res->{error}) {
        Test::More::fail("$name - response: $res->{error}");
        return;
    }
    if (exists $block->{error_code_like}) {
        my $re = expected($block, 'error_code_like', $i, $n);
        die "undef in error_code_like for request $i\n" unless defined $re;
        chomp $re;
        Test::More::like($res->{status}, qr/$re/sm, "$name - status code ok");
    } else {
        my $code = exists $block->{error_code} ? expected($block, 'error_code', $i, $n) : 200;
        die "undef in error_code for request $i: Test::Nginx would compare the status with "
            . "undef and fail; use error_code_like\n" unless defined $code;
        chomp $code;
        Test::More::is($res->{status}, $code, "$name - status code ok");
    }
    for my $line (header_lines(expected($block, 'response_headers', $i, $n))) {
        my ($h, $v) = @$line;
        if (!defined $v) {
            Test::More::ok(!defined header($res, $h), "$name - header $h absent")
                or Test::More::diag("$h: " . header($res, $h));
        } else {
            Test::More::is(header($res, $h) // '', $v, "$name - header $h");
        }
    }
    for my $line (header_lines(expected($block, 'response_headers_like', $i, $n))) {
        # "!Name" (no value), as in Test::Nginx: matches an absent or empty header.
        my ($h, $re) = ($line->[0], $line->[1] // "");
        Test::More::like(header($res, $h) // '', qr/^$re$/, "$name - header $h like");
    }
    if (exists $block->{response_body}) {
        my $body = expected($block, 'response_body', $i, $n);
        die "undef in response_body for request $i: Test::Nginx would compare the body with "
            . "undef and fail\n" unless defined $body;
        if (ref $body) { Test::More::like($res->{body}, $body, "$name - response_body") }
        else { Test::More::is($res->{body}, expand($body), "$name - response_body") }
    }
    my $like = expected($block, 'response_body_like', $i, $n);
    if (defined $like) {
        chomp $like unless ref $like;
        Test::More::like($res->{body}, qr/$like/s, "$name - response_body_like");
    }
}

# Test::Nginx's parse_headers: "Name: value" ([name, value]) and "!Name"
# ([name, undef]: absent), one per line.
sub header_lines {
    my ($text) = @_;
    return () unless defined $text;
    my @out;
    for (split /\n/, $text) {
        s/^\s+|\s+$//g;
        next unless length;
        if (s/^!\s*//) { push @out, [$_, undef]; next }
        my ($k, $v) = split /\s*:\s*/, $_, 2;
        push @out, [$k, $v // ''];
    }
    return @out;
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

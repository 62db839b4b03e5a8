package RLTest::TestNginx;

# Runs a suite's blocks under the real Test::Nginx::Socket (openresty/
# test-nginx) instead of RLTest's own runner: RLTEST_HARNESS=test-nginx
# (make test TEST_HARNESS=test-nginx).  Test::Nginx then starts nginx, sends
# the requests and checks every section it knows, with its own meaning;
# this module adds what the suites need besides, through Test::Nginx's hooks:
#
#   - our module loaded (TEST_NGINX_LOAD_MODULES), master process on (blocks
#     with rl_workers need workers), no automatic "location /" (the blocks
#     write their own), log level info and a 10 s timeout (RLTest's
#     defaults), a random port and servroot per file (prove -j2);
#   - RLTest's Redis, flushed before each block (add_block_preprocessor),
#     $TEST_NGINX_REDIS_PORT & co. and $TEST_NGINX_HTML_DIR for the configs;
#   - the rl_ sections: rl_redis_setup and rl_workers before nginx starts
#     (add_block_preprocessor); rl_redis_check, rl_error_log,
#     rl_no_error_log and rl_access_log after the last response of the block
#     (add_response_body_check; after the block's `wait`, which Test::Nginx
#     sleeps once more after that hook);
#   - the sections RLTest refuses (unknown, renamed, pairs of which Test::Nginx
#     would check only one) fail the block here too, so that no assertion is
#     dropped silently.
#
# The html directory gets RLTest's default files (t, u, api, index.html, each
# "ok\n") through user_files, since Test::Nginx writes it anew per block.

use strict;
use warnings;
use Time::HiRes qw(sleep);

my %DEFAULT_HTML = ('index.html' => "ok\n", t => "ok\n", u => "ok\n", api => "ok\n");

# Called by RLTest::import for a file with blocks: loads Test::Nginx::Socket
# into the test file's package, then lets RLTest add the helpers that
# Test::Nginx does not have.  Returns the names Test::Nginx exported there.
sub load_into {
    my ($caller) = @_;
    require RLTest::Nginx;
    my $module = RLTest::Nginx::module_path();
    # Read by Test::Nginx::Util when it loads.
    $ENV{TEST_NGINX_BINARY} //= RLTest::Nginx::binary();
    $ENV{TEST_NGINX_RANDOMIZE} //= 1;
    eval "package $caller; use Test::Nginx::Socket; 1"
        or die "RLTEST_HARNESS=test-nginx: cannot load Test::Nginx::Socket "
            . "(make deps-test-nginx, or TEST_NGINX_LIB=/path/to/test-nginx/lib): $@";
    # Our module after those of TEST_NGINX_LOAD_MODULES (ndk and lua for Debian's
    # nginx), which RLTest's own instances keep loading as they are.
    $Test::Nginx::Util::LoadModules = join ' ', grep { defined && length }
        $ENV{TEST_NGINX_LOAD_MODULES}, $module;
    Test::Nginx::Util::master_on();
    Test::Nginx::Util::no_root_location();
    Test::Nginx::Util::log_level('info');
    Test::Nginx::Util::timeout(10);
    no strict 'refs';
    return grep { defined &{"${caller}::$_"} } @Test::Nginx::Socket::EXPORT;
}

sub requests_of {
    my ($block) = @_;
    my $r = RLTest::section($block, 'request');
    return ref $r eq 'ARRAY' ? scalar @$r : 1;
}

sub read_file {
    open my $fh, '<', $_[0] or return '';
    local $/;
    return scalar <$fh>;
}

sub run_tests {
    RLTest::setup();
    # The configs' variables: Test::Nginx's own server and html dir
    # ($TEST_NGINX_SERVROOT stays RLTest's, where Redis and its socket live).
    $ENV{TEST_NGINX_SERVER_PORT} = $Test::Nginx::Util::ServerPort;
    $ENV{TEST_NGINX_HTML_DIR}    = Test::Nginx::Util::html_dir();
    # rl_ sections see these, as the configs do (Test::Nginx's expansion).
    $RLTest::expander = sub {
        my ($text) = @_;
        $text =~ s/\$(TEST_NGINX_[A-Z0-9_]+)/$ENV{$1} \/\/ "\$$1"/ge if defined $text;
        return $text;
    };
    my $default_workers = $ENV{TEST_NGINX_WORKERS} || 1;
    Test::Nginx::Util::add_block_preprocessor(sub {
        my ($block) = @_;
        eval { RLTest::check_sections($block); 1 } or die $block->name . ": $@";
        my $redis = RLTest::redis();
        $redis->reset;
        for my $line (RLTest::lines(RLTest::section($block, 'rl_redis_setup'))) {
            my $r = $redis->cmd(RLTest::Redis::split_command($line));
            die $block->name . ": redis setup '$line': " . $r->message . "\n"
                if ref $r eq 'RLTest::Redis::Error';
        }
        my $w = RLTest::section($block, 'rl_workers');
        $w =~ s/\s+//g if defined $w;
        Test::Nginx::Util::workers($w || $default_workers);
        my $files = join '', map { ">>> $_\n$DEFAULT_HTML{$_}" } sort keys %DEFAULT_HTML;
        $block->set_value(user_files => $files . (RLTest::section($block, 'user_files') // ''));
    });
    Test::Nginx::Socket::add_response_body_check(sub {
        my ($block, $body, $req_idx, $repeated_req_idx, $dry_run) = @_;
        return if $dry_run || $req_idx != requests_of($block) - 1;
        after_requests($block);
    });
    Test::Nginx::Socket::run_tests();
    Test::More::done_testing() unless Test::More->builder->has_plan;
}

# The rl_ sections checked after the block's requests, as RLTest::run_block
# does (there after nginx has quit; here while it still runs).
sub after_requests {
    my ($block) = @_;
    my $name = $block->name;
    if (defined(my $w = RLTest::parse_time(RLTest::section($block, 'wait')))) { sleep $w }
    my $redis = RLTest::redis();
    for my $line (RLTest::lines(RLTest::section($block, 'rl_redis_check'))) {
        my ($cmd, $op, $want) = $line =~ /^(.*?)\s+(=>|=~)\s+(.*)$/
            or do { Test::More::fail("$name - bad rl_redis_check line '$line'"); next };
        my $got = RLTest::Redis::format_reply($redis->cmd(RLTest::Redis::split_command($cmd)));
        if ($op eq '=>') { Test::More::is($got, $want, "$name - redis: $cmd") }
        else { Test::More::like($got, qr/$want/, "$name - redis: $cmd") }
    }
    my @want = RLTest::lines(RLTest::section($block, 'rl_error_log'));
    my @unwanted = RLTest::lines(RLTest::section($block, 'rl_no_error_log'));
    my @access = RLTest::lines(RLTest::section($block, 'rl_access_log'));
    return unless @want || @unwanted || @access;
    sleep 0.05;    # log-phase lines come after the response
    my $alog = read_file($Test::Nginx::Util::AccLogFile);
    for my $pat (@access) {
        Test::More::ok(RLTest::find_in_text($alog, $pat), "$name - whole access.log has '$pat'")
            or Test::More::diag("access.log:\n$alog");
    }
    my $log = read_file($Test::Nginx::Util::ErrLogFile);
    for my $pat (@want) {
        Test::More::ok(RLTest::find_in_text($log, $pat), "$name - whole error.log has '$pat'");
    }
    for my $pat (@unwanted) {
        Test::More::ok(!RLTest::find_in_text($log, $pat), "$name - whole error.log lacks '$pat'");
    }
}

1;

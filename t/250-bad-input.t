# Hostile keys: bytes that mean something to RESP, to logs or to C strings
# (CR, LF, NUL), spaces, quotes, bytes that are not UTF-8, a 64 KiB header,
# and 100,000 distinct keys.  For each: the right decisions (limit 2: two
# admitted, then 429), a Redis key holding exactly the key's bytes, and no
# protocol injection (no command but the module's own ever reaches Redis, a
# sentinel key survives, nothing called "injected" appears).
#
# Where hostile bytes can come from in nginx:
#   $remote_user  base64-decoded from "Authorization: Basic": any byte,
#                 NUL, CR and LF included (no auth_basic needed);
#   $uri          percent-decoded: CR, LF, quotes, 0x80-0xff (nginx refuses
#                 %00 itself, with 400);
#   $arg_k        NOT decoded: "%0d%0a" stays those six characters;
#   $http_x_key   raw header bytes: 0x80-0xff, quotes, inner spaces, tabs
#                 (never CR, LF or NUL: nginx refuses NUL with 400);
#   $binary_remote_addr  127.0.0.1 is 7f 00 00 01, ::1 is fifteen NULs and 01.
#
# Also: hostile values for variable limits, windows and costs (refused,
# logged escaped); MONITOR shows that nginx sends nothing but EVALSHA/EVAL/
# SCRIPT LOAD and the script touches only rl: keys; every error.log line
# starts with a timestamp.  Then 100,000 distinct keys, and 100,000
# rejections through the deny cache: DBSIZE and worker RSS stay bounded.
# TEST_RL_KEYS=2000 makes that part quick.
use lib 't/lib';
use RLTest;
use MIME::Base64 qw(encode_base64);
use Digest::SHA qw(sha1_hex);
use IO::Select;
use IO::Socket::IP;
use Time::HiRes qw(time sleep);

my $http = <<'EOF';
    large_client_header_buffers 4 128k;
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=5s;
    ratelimit_zone hdr  key=$http_x_key  limit=2 window=10m;
    ratelimit_zone user key=$remote_user limit=2 window=10m;
    ratelimit_zone uri  key=$uri         limit=2 window=10m;
    ratelimit_zone arg  key=$arg_k       limit=2 window=10m;
    ratelimit_zone ip   key=$binary_remote_addr limit=2 window=10m;
    ratelimit_zone alog key=$remote_user limit=2 window=10m;
    ratelimit_zone actr key=$remote_user limit=2 window=10m algorithm=sliding_counter;
    ratelimit_zone agcr key=$remote_user limit=2 window=10m algorithm=gcra burst=2;
    ratelimit_zone many key=$http_x_key  limit=1 window=10m;
    ratelimit_zone vl   key=$arg_k limit=$http_x_limit window=$http_x_window;
    ratelimit_zone vu   key=$arg_k limit=$remote_user window=10m;
    ratelimit_fail closed;
EOF
my $config = <<'EOF';
    listen [::1]:$TEST_NGINX_SERVER_PORT;
    add_header X-RL $ratelimit_status always;
    location /h   { ratelimit hdr;  try_files /t =500; }
    location /usr { ratelimit user; try_files /t =500; }
    location /k/  { ratelimit uri;  try_files /t =500; }
    location /a   { ratelimit arg;  try_files /t =500; }
    location /ip  { ratelimit ip;   try_files /t =500; }
    location /alg { ratelimit alog; ratelimit actr; ratelimit agcr; try_files /t =500; }
    location /m   { ratelimit many; try_files /t =500; }
    location /v   { ratelimit vl cost=$http_x_cost; try_files /t =500; }
    location /vu  { ratelimit vu; try_files /t =500; }
EOF

my $have_v6 = IO::Socket::IP->new(LocalHost => '::1', Proto => 'tcp', Listen => 1) ? 1 : 0;
my $cfg = $config;
$cfg =~ s/^\s*listen \[::1\].*\n//m unless $have_v6;

sub rl { header($_[0], 'X-RL') // '(none)' }
sub basic { "Basic " . encode_base64("$_[0]:secret", '') }
sub esc { my $s = shift; $s =~ s/([^\x21-\x7e])/sprintf '\\x%02x', ord $1/ge; $s }

sub get {
    my ($path, @headers) = @_;
    return http_request(port => server_port(), request => "GET $path", headers => [@headers]);
}

sub all_keys { my $k = redis_cmd('KEYS', '*'); return sort @$k }

# Four requests for one key: admitted, admitted, rejected by Redis, then
# (short keys) rejected from the deny cache.  The new Redis keys must be
# exactly @want.
sub limited_twice {
    my ($name, $send, $want, %o) = @_;
    my %before = map { $_ => 1 } all_keys();
    my @res = map { $send->() } 1 .. 4;
    my @st = map { $_->{status} // "error: $_->{error}" } @res;
    is_deeply(\@st, [200, 200, 429, 429], "$name: limit 2 admits 2, then 429");
    my $fourth = $o{uncached} ? 'REJECTED' : 'REJECTED_CACHED';
    is_deeply([map { rl($_) } @res], ['PASSED', 'PASSED', 'REJECTED', $fourth],
        "$name: \$ratelimit_status");
    my @new = grep { !$before{$_} } all_keys();
    is_deeply([map { esc($_) } @new], [map { esc($_) } sort @$want],
        "$name: Redis holds exactly the expected key bytes");
    for my $k (@$want) {
        my $type = redis_cmd('TYPE', $k);
        my $n = $type eq 'zset' ? redis_cmd('ZCARD', $k) : undef;
        is($n, 2, "$name: " . esc($k) . " holds the 2 admitted requests") if $type eq 'zset';
    }
    no_injection($name);
}

sub no_injection {
    my ($name) = @_;
    is(redis_cmd('EXISTS', 'injected'), 0, "$name: no key 'injected'");
    is(redis_cmd('GET', 'sentinel'), 'intact', "$name: the sentinel key survived");
}

# Every command Redis executes, seen through MONITOR: top-level commands of
# nginx's connections and the commands the script runs ("lua").
sub monitor_start {
    my $m = redis_client(name => 'monitor');
    $m->cmd('MONITOR');
    return $m;
}
sub monitor_lines {
    my ($m) = @_;
    my @lines;
    my $sel = IO::Select->new($m->sock);
    my $deadline = time + 10;
    while (time < $deadline && $sel->can_read(0.5)) {
        my $n = sysread $m->sock, $m->{buf}, 65536, length $m->{buf};
        last unless $n;
        while ($m->{buf} =~ s/^\+([^\r\n]*)\r\n//) { push @lines, $1 }
    }
    $m->close;
    return @lines;
}
# ('src', 'cmd', 'first arg', 'raw line') per MONITOR line.
sub parse_monitor {
    my ($line) = @_;
    my ($src, $rest) = $line =~ /^\S+ \[\d+ ([^\]]+)\] (.*)$/ or return;
    my @w = $rest =~ /"((?:[^"\\]|\\.)*)"/g;
    return [$src, lc($w[0] // ''), $w[1], $line];
}

start_nginx(http_config => $http, config => $cfg, workers => 1);    # one deny cache
redis_cmd('SET', 'sentinel', 'intact');
my ($harness_addr) = redis_cmd('CLIENT', 'INFO') =~ /\baddr=(\S+)/;
my $monitor = monitor_start();

# --- CR, LF and RESP in the key ($remote_user carries any byte) ------------
for my $u ("u1\r\nSET injected 1\r\n",
           "u2\r\n*3\r\n\$3\r\nSET\r\n\$8\r\ninjected\r\n\$1\r\n1\r\n",
           "u3\r\nFLUSHALL\r\n*1\r\n\$8\r\nFLUSHALL\r\n",
           "u4\nSET injected 1\n",
           "\r\n") {
    limited_twice('user ' . esc($u), sub { get('/usr', [Authorization => basic($u)]) },
        ["rl:user:$u"]);
}

# --- NUL: kept, and not a terminator ---------------------------------------
limited_twice('user with NUL', sub { get('/usr', [Authorization => basic("n\0one")]) },
    ["rl:user:n\0one"]);
limited_twice('user differing only after a NUL',
    sub { get('/usr', [Authorization => basic("n\0two")]) }, ["rl:user:n\0two"]);
limited_twice('user that is NULs only', sub { get('/usr', [Authorization => basic("\0\0\0")]) },
    ["rl:user:\0\0\0"]);
limited_twice('user NUL CR LF FLUSHALL',
    sub { get('/usr', [Authorization => basic("\0\r\nFLUSHALL\r\n\0")]) },
    ["rl:user:\0\r\nFLUSHALL\r\n\0"]);

# --- bytes that are not UTF-8, in a header ---------------------------------
# Two keys that a lossy UTF-8 conversion would both turn into U+FFFD.
limited_twice('header \xff\xfe', sub { get('/h', ['X-Key' => "\xff\xfe"]) }, ["rl:hdr:\xff\xfe"]);
limited_twice('header \xfe\xff', sub { get('/h', ['X-Key' => "\xfe\xff"]) }, ["rl:hdr:\xfe\xff"]);
limited_twice('header with an overlong and a truncated sequence',
    sub { get('/h', ['X-Key' => "\xc0\xaf\xc3\x28\xe2\x82"]) },
    ["rl:hdr:\xc0\xaf\xc3\x28\xe2\x82"]);
limited_twice('header with valid UTF-8', sub { get('/h', ['X-Key' => "\xc3\xa9\xe2\x82\xac"]) },
    ["rl:hdr:\xc3\xa9\xe2\x82\xac"]);

# --- spaces, tabs, quotes, RESP and Lua-looking text in a header -----------
for my $k (qq{a b  c}, qq{tab\there}, qq{"quoted" 'single' `back`}, q{$3 *1 :0 -ERR +OK},
           q{]] .. redis.call("SET","injected","1") .. [[}, q{%s%n%x\\0}, q{{tag}:x:y}) {
    limited_twice('header ' . esc($k), sub { get('/h', ['X-Key' => $k]) }, ["rl:hdr:$k"]);
}

# --- $uri is percent-decoded: CR, LF, quotes, 0xff -------------------------
limited_twice('uri with %0D%0A', sub { get('/k/x%0D%0ASET%20injected%201%0D%0A%22%27%FF%FE') },
    ["rl:uri:/k/x\r\nSET injected 1\r\n\"'\xff\xfe"]);
limited_twice('uri with FLUSHALL', sub { get('/k/%0D%0AFLUSHALL%0D%0A') },
    ["rl:uri:/k/\r\nFLUSHALL\r\n"]);

# --- $arg_k is not decoded --------------------------------------------------
limited_twice('arg with %0d%0a', sub { get('/a?k=a%0d%0aSET%20injected%201%0d%0a') },
    ['rl:arg:a%0d%0aSET%20injected%201%0d%0a']);

# --- $binary_remote_addr: NUL bytes from the address itself ----------------
limited_twice('binary_remote_addr 127.0.0.1', sub { get('/ip') }, ["rl:ip:\x7f\0\0\x01"]);
SKIP: {
    skip 'no IPv6 loopback', 1 unless $have_v6;
    my $get6 = sub {
        my $s = IO::Socket::IP->new(PeerHost => '::1', PeerPort => server_port(), Proto => 'tcp',
            Timeout => 5) or return { error => "connect: $!" };
        return http_request(sock => $s, request => 'GET /ip', timeout => 10);
    };
    limited_twice('binary_remote_addr ::1', $get6, ["rl:ip:" . ("\0" x 15) . "\x01"]);
}

# --- one hostile key in three zones, one per algorithm ---------------------
{
    my $u = "alg\0\r\nSET injected 1\r\n\xff";
    limited_twice('three algorithms', sub { get('/alg', [Authorization => basic($u)]) },
        ["rl:alog:$u", "rl:actr:$u", "rl:agcr:$u"]);
    is(redis_cmd('TYPE', "rl:alog:$u"), 'zset', 'sliding_log key is a sorted set');
    is(redis_cmd('TYPE', "rl:actr:$u"), 'string', 'sliding_counter key is a string');
    is(redis_cmd('TYPE', "rl:agcr:$u"), 'string', 'gcra key is a string');
}

# --- long keys: 1000 bytes (raw, past the deny cache's 256), 64 KiB (SHA-1, which the
# deny cache keeps like any short key) -
{
    my $k = join '', map { chr(($_ * 7 + 1) % 256 || 32) } 1 .. 1000;
    $k =~ tr/\r\n\0/xyz/;          # a header cannot carry these
    $k = "K${k}K";                 # nginx trims spaces around the value
    limited_twice('1000-byte binary header key', sub { get('/h', ['X-Key' => $k]) },
        ["rl:hdr:$k"], uncached => 1);
}
for my $tail ("A", "B") {
    my $k = ("\xffk \"" x 16383) . "end$tail";    # 65,536 bytes
    is(length $k, 65536, '64 KiB key');
    limited_twice("64 KiB header key ending $tail", sub { get('/h', ['X-Key' => $k]) },
        ["rl:hdr:" . sha1_hex($k)]);
}

# --- hostile values for a variable limit, window or cost ---------------------
# Each is refused (ratelimit_fail closed: 503, FAILED_CLOSED), nothing is
# written to Redis (100001: past what a sliding_log zone keeps), and the log
# line quotes the value escaped.  (nginx trims spaces around a header value,
# so " 2" cannot be sent as one.)
{
    my %before = map { $_ => 1 } all_keys();
    # First: failure lines are logged at most once a second per worker.
    my $r = get('/vu?k=var-user', [Authorization => basic("2\r\nSET injected 1\r\n")]);
    is($r->{status} . ' ' . rl($r), '503 FAILED_CLOSED', 'a limit with CR LF: refused');
    my @bad = (
        [limit => '+2'], [limit => '0x10'], [limit => '1e3'],
        [limit => '-1'], [limit => '0'], [limit => '1000000001'], [limit => '100001'],
        [limit => '99999999999999999999999'], [limit => "\xff"], [limit => "\xef\xbc\x92"],
        [limit => "2\t"], [window => '10x'], [window => '0'], [window => '1y 1s'],
        [window => "\xff"], [window => '18446744073709551616'], [cost => '+1'], [cost => '-0'],
        [cost => "1\xff"], [cost => '1000000001'],
    );
    for my $b (@bad) {
        my %h = (limit => 2, window => '10m', cost => 1, $b->[0] => $b->[1]);
        my $r = get("/v?k=var-$b->[0]", map { ["X-\u$_" => $h{$_}] } sort keys %h);
        is($r->{status} . ' ' . rl($r), '503 FAILED_CLOSED', "variable $b->[0] " . esc($b->[1])
            . ': refused, ratelimit_fail closed');
    }
    my $ok = get('/v?k=var-ok', ['X-Limit' => 2], ['X-Window' => '10m'], ['X-Cost' => 1]);
    is($ok->{status} . ' ' . rl($ok), '200 PASSED', 'valid variable figures: admitted');
    my @new = grep { !$before{$_} } all_keys();
    is_deeply([map { esc($_) } @new], ['rl:vl:var-ok'], 'only the valid request wrote a key');
    like(error_log_text(), qr/ratelimit: invalid limit "2\\r\\nSET injected 1\\r\\n" for zone "vu"/,
        'the log quotes the bad limit with CR LF escaped');
    no_injection('hostile variable values');
}

# --- NUL where nginx does not take it: refused before the limiter ----------
{
    my ($before) = redis_cmd('INFO', 'commandstats') =~ /^cmdstat_evalsha:calls=(\d+)/m;
    my $dbsize = redis_cmd('DBSIZE');
    my $r = http_request(port => server_port(), raw => "GET /h HTTP/1.1\r\nHost: x\r\n"
        . "X-Key: a\0b\r\nConnection: close\r\n\r\n");
    is($r->{status}, 400, 'NUL in a header value: 400 from nginx');
    $r = get('/k/a%00b');
    is($r->{status}, 400, '%00 in the path: 400 from nginx');
    my ($after) = redis_cmd('INFO', 'commandstats') =~ /^cmdstat_evalsha:calls=(\d+)/m;
    is($after // 0, $before // 0, 'neither reached the limiter');
    is(redis_cmd('DBSIZE'), $dbsize, 'and no key was written');
}

my @seen = grep { $_ } map { parse_monitor($_) } monitor_lines($monitor);
my @nginx_cmds = grep { $_->[0] ne 'lua' && $_->[0] ne $harness_addr } @seen;
my @lua_cmds = grep { $_->[0] eq 'lua' } @seen;
cmp_ok(scalar @nginx_cmds, '>=', 50, scalar(@nginx_cmds) . ' commands from nginx seen by MONITOR');
# Besides the decisions, the deny cache's tracking: CLIENT ID and TRACKING, SUBSCRIBE, and an
# EXISTS of each remembered key.
my @odd_top = grep {
    $_->[1] !~ /^(evalsha|eval|script|client|subscribe)$/
        && !($_->[1] eq 'exists' && ($_->[2] // '') =~ /^rl:/)
} @nginx_cmds;
is(scalar @odd_top, 0, 'nginx sent Redis nothing but script calls and the deny cache\'s tracking')
    or diag(join "\n", map { $_->[3] } @odd_top[0 .. ($#odd_top < 9 ? $#odd_top : 9)]);
my @odd_lua = grep {
    $_->[1] =~ /^(flushall|flushdb|swapdb|del|unlink|rename|config|script|eval|evalsha)$/
        || ($_->[1] ne 'time' && ($_->[2] // '') !~ /^rl:/)
} @lua_cmds;
cmp_ok(scalar @lua_cmds, '>=', 100, scalar(@lua_cmds) . ' commands run by the script');
is(scalar @odd_lua, 0, 'the script only touched rl: keys, and ran no destructive command')
    or diag(join "\n", map { $_->[3] } @odd_lua[0 .. ($#odd_lua < 9 ? $#odd_lua : 9)]);
no_injection('after all hostile keys');

ok(stop_nginx(), 'nginx quits gracefully');
my $log = error_log_text();
check_no_alerts($log, 'hostile keys');
my @odd = grep { !/^\d{4}\/\d\d\/\d\d \d\d:\d\d:\d\d \[/ } split /\n/, $log;
is(scalar @odd, 0, 'every error.log line starts with a timestamp (no key bytes split a line)')
    or diag(join "\n", map { esc($_) } @odd[0 .. ($#odd < 5 ? $#odd : 5)]);
my @failed = grep { /\[error\].*ratelimit/ && !/limiting requests|invalid (limit|window|cost)/ }
    split /\n/, $log;
is(scalar @failed, 0, 'no Redis error: every decision was a real one')
    or diag(join "\n", map { esc($_) } @failed[0 .. ($#failed < 5 ? $#failed : 5)]);

# --- 100,000 distinct keys ----------------------------------------------------
# One worker, pipelined keep-alive requests on 8 connections at a time (500
# per connection, under keepalive_requests).  Then the same keys again: all
# rejected, so 100,000 rejections pass through the deny cache (10,000 LRU
# entries at most), then once more in reverse order: only the most recent
# 10,000 can be answered from memory.
my $N = $ENV{TEST_RL_KEYS} || 100_000;

sub blast {
    my (@keys) = @_;
    my $per = 500;
    my @chunks;
    push @chunks, [splice @keys, 0, $per] while @keys;
    my (%status, %rl, %conn, $errors);
    my $sel = IO::Select->new;
    my $deadline = time + 600;
    my $open = sub {
        my $chunk = shift @chunks or return;
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => server_port(),
            Proto => 'tcp', Timeout => 5) or do { $errors += @$chunk; return };
        my $raw = join '', map {
            "GET /m HTTP/1.1\r\nHost: x\r\nX-Key: $chunk->[$_]\r\n"
                . ($_ == $#$chunk ? "Connection: close\r\n" : '') . "\r\n"
        } 0 .. $#$chunk;
        $s->blocking(0);
        $conn{fileno $s} = { s => $s, out => $raw, buf => '', want => scalar @$chunk, got => 0 };
        $sel->add($s);
    };
    $open->() for 1 .. 8;
    while ($sel->count && time < $deadline) {
        my @w = grep { length $conn{fileno $_}{out} } $sel->handles;
        my ($r, $w) = IO::Select->select($sel, @w ? IO::Select->new(@w) : undef, undef, 5);
        for my $s (@{ $w || [] }) {
            my $c = $conn{fileno $s};
            my $n = syswrite $s, $c->{out};
            substr($c->{out}, 0, $n, '') if $n;
        }
        for my $s (@{ $r || [] }) {
            my $c = $conn{fileno $s};
            my $n = sysread $s, $c->{buf}, 262144, length $c->{buf};
            next if !defined $n && $!{EAGAIN};
            while (my $res = RLTest::HTTP::parse_response($c->{buf}, !$n)) {
                last if $res->{error};
                substr($c->{buf}, 0, $res->{consumed}, '');
                $status{ $res->{status} }++;
                $rl{ rl($res) }++;
                last if ++$c->{got} == $c->{want};
            }
            if (!$n || $c->{got} == $c->{want}) {
                $errors += $c->{want} - $c->{got};
                $sel->remove($s);
                delete $conn{fileno $s};
                close $s;
                $open->();
            }
        }
    }
    $errors += $_->{want} - $_->{got} for values %conn;
    $errors += @$_ for @chunks;
    return (\%status, \%rl, $errors // 0);
}

sub worker_rss_kb {
    my ($pid) = nginx()->worker_pids;
    open my $fh, '<', "/proc/$pid/status" or return 0;
    while (<$fh>) { return $1 if /^VmRSS:\s+(\d+)/ }
    return 0;
}

redis_cmd('FLUSHALL');
start_nginx(http_config => $http, config => $cfg, workers => 1);
my @keys = map { "key-$_" } 1 .. $N;
get('/m', ['X-Key' => 'warm-up']) for 1 .. 3;
my $rss0 = worker_rss_kb();

my $t0 = time;
my ($st, $rl, $err) = blast(@keys);
my $took = time - $t0;
note(sprintf "%d distinct keys in %.1f s (%.0f/s)", $N, $took, $N / ($took || 1));
is($err, 0, "$N distinct keys: every request answered");
is($st->{200} // 0, $N, "$N distinct keys: all admitted") or diag(explain $st);
is($rl->{PASSED} // 0, $N, "$N distinct keys: all PASSED") or diag(explain $rl);
is(redis_cmd('DBSIZE'), $N + 1, "DBSIZE: $N keys (and the warm-up key)");
is(redis_cmd('ZCARD', "rl:many:key-$N"), 1, 'the last key holds one entry');
my $rss1 = worker_rss_kb();

($st, $rl, $err) = blast(@keys);
is($err, 0, 'the same keys again: every request answered');
is($st->{429} // 0, $N, 'the same keys again: all rejected') or diag(explain $st);
is($rl->{REJECTED} // 0, $N, 'each by Redis (the first rejection of each key)')
    or diag(explain $rl);
my $rss2 = worker_rss_kb();

($st, $rl, $err) = blast(reverse @keys);
is($err, 0, 'in reverse order: every request answered');
is($st->{429} // 0, $N, 'in reverse order: all rejected');
my $cached = $rl->{REJECTED_CACHED} // 0;
note("answered from the deny cache in reverse order: $cached");
cmp_ok($cached, '>', 0, 'the most recent rejections are answered from memory');
cmp_ok($cached, '<=', 10_000, 'no more than the 10,000 entries the deny cache keeps')
    or diag(explain $rl);
is(redis_cmd('DBSIZE'), $N + 1, 'DBSIZE unchanged by the rejections');
my $rss3 = worker_rss_kb();

note(sprintf "worker VmRSS: %d KiB before, %d after %d keys, %d after %d rejections, "
    . "%d after %d more",
    $rss0, $rss1, $N, $rss2, $N, $rss3, $N);
ok($rss0 > 0, 'worker RSS measured');
cmp_ok($rss3 - $rss0, '<', 50 * 1024, 'worker RSS grew by less than 50 MB over 300,000 requests')
    or diag("RSS $rss0 -> $rss3 KiB");
cmp_ok($rss3 - $rss2, '<', 10 * 1024, 'and by less than 10 MB over the last 100,000 (flat)');

ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), "$N keys");

# ratelimit_fail local while Redis is down: distinct 4,000-byte keys cost the worker a slot of
# fixed size each, within ratelimit_fail_local_size, not their length (this took 400 MB for
# 100,000 keys when keys were stored whole).
stop_redis();
start_nginx(http_config => <<'EOF', config => <<'EOF', workers => 1);
    ratelimit_redis 127.0.0.1:$TEST_NGINX_REDIS_PORT timeout=200ms fail_threshold=1 fail_backoff=1h;
    ratelimit_zone many key=$http_x_key limit=1 window=1h;
    ratelimit_fail local;
EOF
    add_header X-RL $ratelimit_status always;
    location /m { ratelimit many; try_files /t =500; }
EOF
my $L = $N < 20_000 ? $N : 20_000;
my $pad = 'k' x 3990;
get('/m', ['X-Key' => "warm-up-$_"]) for 1 .. 3;
$rss0 = worker_rss_kb();
($st, $rl, $err) = blast(map { sprintf '%s%08d', $pad, $_ } 1 .. $L);
$rss1 = worker_rss_kb();
is($err, 0, "$L keys of 4,000 bytes, Redis down: every request answered");
is($rl->{PASSED_LOCAL} // 0, $L, 'each admitted by the local limiter') or diag(explain $rl);
note(sprintf 'worker VmRSS: %d KiB before, %d after %d long keys decided locally',
    $rss0, $rss1, $L);
SKIP: {
    skip "valgrind's own memory is in the worker's RSS", 1 if $ENV{TEST_NGINX_VALGRIND};
    # The table is the default ratelimit_fail_local_size, 16m, touched all over by hashed keys.
    cmp_ok($rss1 - $rss0, '<', 30 * 1024,
        sprintf 'worker RSS grew by less than 30 MB (the keys: %d MB)', 4 * $L / 1000);
}
ok(stop_nginx(), 'nginx quits gracefully');
check_no_alerts(error_log_text(), 'local keys', crit => 1);

done_testing();

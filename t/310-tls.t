# TLS to Redis: ssl=on and the ssl_* parameters of ratelimit_redis against a
# redis-server with a TLS port (certificates made with openssl here, in the
# servroot). Exact limits over TLS; the certificate checked by IP SAN and by
# DNS name; a wrong CA, a wrong name, a plain-text port and a silent port each
# fail within the timeout with a log line that says why; mutual TLS; session
# reuse on reconnect; a Redis restart under traffic; nginx -t errors.
use lib 't/lib';
use RLTest;
use IO::Socket::INET;
use Time::HiRes qw(time sleep);
use POSIX ();

my $dir = servroot() . '/tls';
mkdir $dir;

sub sh { my $cmd = shift; system("$cmd >>$dir/openssl.log 2>&1") == 0 or die "failed: $cmd\n" }
for my $ca (qw(ca other-ca)) {
    sh("openssl req -x509 -newkey rsa:2048 -nodes -keyout $dir/$ca.key -out $dir/$ca.crt"
        . " -days 2 -subj '/CN=Test $ca'");
}
sub sign {
    my ($name, $cn, $ext) = @_;
    sh("openssl req -newkey rsa:2048 -nodes -keyout $dir/$name.key -out $dir/$name.csr -subj '/CN=$cn'");
    my $extfile = '';
    if ($ext) {
        open my $fh, '>', "$dir/$name.ext" or die;
        print $fh "$ext\n";
        close $fh;
        $extfile = "-extfile $dir/$name.ext";
    }
    sh("openssl x509 -req -in $dir/$name.csr -CA $dir/ca.crt -CAkey $dir/ca.key -CAcreateserial"
        . " -out $dir/$name.crt -days 2 $extfile");
}
sign('redis', 'redis.test', 'subjectAltName=DNS:redis.test,IP:127.0.0.1');
sign('client', 'gateway');

my $tls_port = free_port();
my $tls = RLTest::Redis->new(dir => servroot() . '/redis-tls', args => [
    '--tls-port', $tls_port, '--tls-cert-file', "$dir/redis.crt",
    '--tls-key-file', "$dir/redis.key", '--tls-ca-cert-file', "$dir/ca.crt",
    '--tls-auth-clients', 'no']);
$tls->start;
$ENV{TEST_NGINX_TLS_PORT} = $tls_port;
$ENV{TEST_NGINX_TLS_DIR} = $dir;

sub rl { header($_[0], 'X-RL') // '(none)' }
sub statuses { my ($k, $n) = @_; join ' ', map { rl(http_get("/t?k=$k")) } 1 .. $n }

my $config = <<'EOF';
    location /t { ratelimit api; add_header X-RL $ratelimit_status always; }
EOF
sub http_conf {
    my ($redis) = @_;
    return <<"EOF";
    ratelimit_redis $redis;
    ratelimit_zone api key=\$arg_k limit=5 window=60s;
EOF
}
# Under valgrind a full handshake alone takes longer than the default 200ms
# timeout: the cases that must succeed get more, the "within" bounds too.
my $vg = $ENV{TEST_NGINX_VALGRIND};
my $ca = 'ssl=on ssl_trusted_certificate=$TEST_NGINX_TLS_DIR/ca.crt' . ($vg ? ' timeout=5s' : '');
my $within = $vg ? 10 : 1;

# One nginx per case: its statuses, its log, and how long the worst request took.
sub case {
    my ($what, $redis, $key, $n, %o) = @_;
    start_nginx(http_config => http_conf($redis), config => $config,
        log_level => $o{log_level} || 'info');
    my ($st, $worst) = ('', 0);
    for (1 .. $n) {
        my $t0 = time;
        $st .= ($st eq '' ? '' : ' ') . rl(http_get("/t?k=$key"));
        $worst = time - $t0 if time - $t0 > $worst;
    }
    $o{between}->() if $o{between};
    ok(stop_nginx(), "$what: nginx quits gracefully");
    my $log = error_log_text();
    check_no_alerts($log, $what, %{ $o{allow} || {} });
    return ($st, $log, $worst);
}

# --- works: IP SAN, DNS SAN, exact limits
my ($st, $log) = case('IP SAN', "127.0.0.1:\$TEST_NGINX_TLS_PORT $ca", 'ip', 7);
like($st, qr/^(PASSED ){5}REJECTED REJECTED(_CACHED)?$/,
    'over TLS, verified by the IP SAN: limit 5 gives 5 then rejections');
is($tls->cmd('ZCARD', 'rl:api:ip'), 5, 'the 5 admitted requests are in the TLS Redis');

($st, $log) = case('DNS SAN', "127.0.0.1:\$TEST_NGINX_TLS_PORT $ca ssl_name=redis.test",
    'dns', 6);
is($st, 'PASSED PASSED PASSED PASSED PASSED REJECTED', 'ssl_name=redis.test, a DNS SAN: works');

# Many decisions at once over TLS, two workers, pipelined and batched on
# several connections per worker: exact all the same.
{
    my $http = http_conf("127.0.0.1:\$TEST_NGINX_TLS_PORT $ca timeout=5s")
        =~ s/limit=5 /limit=50 /r;
    start_nginx(http_config => $http, config => $config, workers => 2);
    my $res = http_parallel([map { { port => server_port(), request => 'GET /t?k=many' } } 1 .. 300],
        timeout => 60);
    my %rl;
    $rl{ header($_, 'X-RL') // '-' }++ for @$res;
    is($rl{PASSED}, 50, '300 requests at once over TLS, limit 50: exactly 50 admitted')
        or diag(explain(\%rl));
    is(($rl{REJECTED} // 0) + ($rl{REJECTED_CACHED} // 0), 250, 'and 250 rejected');
    ok(stop_nginx(), 'many at once: nginx quits gracefully');
    check_no_alerts(error_log_text(), 'many at once');
}

# AUTH is queued behind the handshake, never written before it.
$tls->cmd('CONFIG', 'SET', 'requirepass', 'tls-S3cret');
($st, $log) = case('AUTH over TLS',
    "127.0.0.1:\$TEST_NGINX_TLS_PORT $ca password=tls-S3cret", 'auth', 6);
is($st, 'PASSED PASSED PASSED PASSED PASSED REJECTED', 'password= over TLS: works');
$tls->cmd('AUTH', 'tls-S3cret');
$tls->cmd('CONFIG', 'SET', 'requirepass', '');

# --- faults: each follows ratelimit_fail within the timeout and says why
my $fast = ($vg ? 'timeout=1s' : 'timeout=300ms') . ' fail_threshold=100';
my ($worst);
($st, $log, $worst) = case('wrong CA',
    "127.0.0.1:\$TEST_NGINX_TLS_PORT ssl=on ssl_trusted_certificate=$dir/other-ca.crt $fast",
    'ca', 3);
is($st, 'FAILED_OPEN FAILED_OPEN FAILED_OPEN', 'wrong CA: every request follows ratelimit_fail');
like($log, qr/ratelimit: redis "127\.0\.0\.1:\d+" TLS certificate verify failed: [^,]+, requests follow ratelimit_fail/,
    'wrong CA: the log says the certificate failed verification, and why');
like($log, qr/TLS certificate verify failed: (self-signed|unable to get local issuer)/,
    'wrong CA: with OpenSSL\'s reason');
cmp_ok($worst, '<', $within, 'wrong CA: answered within the timeout');

($st, $log, $worst) = case('wrong name',
    "127.0.0.1:\$TEST_NGINX_TLS_PORT $ca ssl_name=other.test $fast", 'name', 3);
is($st, 'FAILED_OPEN FAILED_OPEN FAILED_OPEN', 'wrong ssl_name: follows ratelimit_fail');
like($log, qr/ratelimit: redis "127\.0\.0\.1:\d+" TLS certificate does not match "other\.test" \(ssl_name\), requests follow ratelimit_fail/,
    'wrong ssl_name: the log names the name');

($st, $log, $worst) = case('plain-text port',
    "127.0.0.1:\$TEST_NGINX_REDIS_PORT $ca $fast", 'plain', 3);
is($st, 'FAILED_OPEN FAILED_OPEN FAILED_OPEN', 'ssl=on to a plain-text Redis: follows ratelimit_fail');
# Redis takes the ClientHello for the start of an inline command and waits for
# its end of line: nothing comes back.
like($log, qr/ratelimit: redis "127\.0\.0\.1:\d+" TLS handshake timed out, requests follow ratelimit_fail/,
    'plain-text port: the log says the handshake timed out');
cmp_ok($worst, '<', $within, 'plain-text port: answered within the timeout');

# A port that accepts (the kernel's backlog) and never answers.
my $silent = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 16,
    ReuseAddr => 1) or die "listen: $!";
my $silent_port = $silent->sockport;
($st, $log, $worst) = case('silent port', "127.0.0.1:$silent_port $ca $fast", 'silent', 3);
is($st, 'FAILED_OPEN FAILED_OPEN FAILED_OPEN', 'a port that never answers: follows ratelimit_fail');
like($log, qr/ratelimit: redis "127\.0\.0\.1:\d+" TLS handshake timed out, requests follow ratelimit_fail/,
    'silent port: the log says the handshake timed out');
cmp_ok($worst, '<', $within, 'silent port: answered within the timeout (300ms)');
close $silent;

# A server that answers the ClientHello with something else than TLS.
my $garbage = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 16,
    ReuseAddr => 1) or die "listen: $!";
my $garbage_port = $garbage->sockport;
my $gpid = fork // die "fork: $!";
if ($gpid == 0) {
    while (my $c = $garbage->accept) {
        sysread $c, my $buf, 4096;
        syswrite $c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
        close $c;
    }
    POSIX::_exit(0);
}
RLTest::Proc::register_pid($gpid, 'garbage server');
close $garbage;
($st, $log, $worst) = case('not TLS', "127.0.0.1:$garbage_port $ca $fast", 'garbage', 3);
is($st, 'FAILED_OPEN FAILED_OPEN FAILED_OPEN', 'a server answering not TLS: follows ratelimit_fail');
like($log, qr/\[error\] .*SSL_do_handshake\(\) failed .*\n.*ratelimit: redis "127\.0\.0\.1:\d+" TLS handshake failed, requests follow ratelimit_fail/,
    'not TLS: nginx\'s handshake error at error level, then the module\'s line');
my $ssl_lines = () = $log =~ /SSL_do_handshake\(\) failed/g;
is($ssl_lines, 1, 'not TLS: nginx\'s handshake error once per outage, not per connection');
cmp_ok($worst, '<', $within, 'not TLS: answered within the timeout');
kill 'TERM', $gpid;
waitpid $gpid, 0;
RLTest::Proc::unregister_pid($gpid);

# --- mutual TLS
# With TLS 1.3 the server refuses the missing certificate after the client's
# side of the handshake is done: nginx reports its alert on the first read
# (when it arrives before Redis closes), at crit, as for a proxied upstream;
# once per outage, like the module's own line.
$tls->cmd('CONFIG', 'SET', 'tls-auth-clients', 'yes');
($st, $log) = case('mTLS without a client certificate',
    "127.0.0.1:\$TEST_NGINX_TLS_PORT $ca $fast", 'mtls0', 4, allow => { crit => 1 });
is($st, 'FAILED_OPEN FAILED_OPEN FAILED_OPEN FAILED_OPEN',
    'tls-auth-clients yes, no client certificate: fails');
like($log, qr/ratelimit: redis "127\.0\.0\.1:\d+" (TLS handshake failed|closed the connection|i\/o error)/,
    'no client certificate: logged');
my $crit = () = $log =~ /\[crit\]/g;
cmp_ok($crit, '<=', 1, 'no client certificate: nginx\'s alert line at most once per outage');
($st, $log) = case('mTLS', "127.0.0.1:\$TEST_NGINX_TLS_PORT $ca"
    . " ssl_certificate=$dir/client.crt ssl_certificate_key=$dir/client.key", 'mtls', 6);
is($st, 'PASSED PASSED PASSED PASSED PASSED REJECTED', 'with ssl_certificate=: works');
$tls->cmd('CONFIG', 'SET', 'tls-auth-clients', 'no');

# --- session reuse: the idle connection is closed, the next one resumes.
for my $reuse ('on', 'off') {
    start_nginx(http_config => http_conf("127.0.0.1:\$TEST_NGINX_TLS_PORT $ca"
        . " keepalive_timeout=200ms ssl_session_reuse=$reuse"), config => $config,
        log_level => 'debug');
    for (1 .. 3) {
        is(rl(http_get("/t?k=reuse$reuse")), 'PASSED', "reuse=$reuse: request $_");
        sleep 0.5;    # past keepalive_timeout: the connection is closed
    }
    ok(stop_nginx(), "reuse=$reuse: nginx quits gracefully");
    my $log = error_log_text();
    my $new = () = $log =~ /redis tls handshake done, session new/g;
    my $reused = () = $log =~ /redis tls handshake done, session reused/g;
    if ($reuse eq 'on') {
        is("$new $reused", '1 2', 'ssl_session_reuse=on: one full handshake, then resumed ones');
    } else {
        is("$new $reused", '3 0', 'ssl_session_reuse=off: a full handshake every time');
    }
    check_no_alerts($log, "reuse=$reuse");
}

# --- Redis restarted under traffic: the next connection handshakes again.
start_nginx(http_config => http_conf("127.0.0.1:\$TEST_NGINX_TLS_PORT $ca fail_backoff=100ms"),
    config => $config);
is(rl(http_get('/t?k=restart')), 'PASSED', 'restart: before');
$tls->restart;
my @after = map { rl(http_get('/t?k=restart2')) } 1 .. 3;
unlike("@after", qr/FAILED_OPEN.*PASSED.*FAILED_OPEN/, 'restart: no flapping');
my $back = wait_until(5, sub { rl(http_get('/t?k=restart3')) eq 'PASSED' });
ok($back, 'restart: decisions over TLS again after the restart');
# A reload builds a new TLS context; the old workers close their connections.
ok(reload_nginx(http_config => http_conf("127.0.0.1:\$TEST_NGINX_TLS_PORT $ca ssl_name=redis.test"),
    config => $config), 'reload: new workers');
my @reload = map { rl(http_get('/t?k=reload')) } 1 .. 6;
is("@reload", 'PASSED PASSED PASSED PASSED PASSED REJECTED', 'reload: exact over TLS in the new workers');
ok(stop_nginx(), 'restart: nginx quits gracefully');
check_no_alerts(error_log_text(), 'restart and reload');

# --- nginx -t
my @bad = (
    ["127.0.0.1:6380 ssl=on",
        qr/"ssl=on" of the "ratelimit_redis" directive verifies the server's certificate and needs "ssl_trusted_certificate=" with a CA file, or an explicit "ssl_verify=off" in \S+nginx\.conf:\d+/,
        'ssl=on without a CA'],
    ["127.0.0.1:6380 ssl=on ssl_verify=off ssl_certificate=$dir/client.crt",
        qr/"ssl_certificate=" of the "ratelimit_redis" directive needs "ssl_certificate_key=" in \S+nginx\.conf:\d+/,
        'a certificate without its key'],
    ["127.0.0.1:6380 ssl=on ssl_verify=off ssl_protocols=TLSv1.2:TLSv1.4",
        qr/invalid value "ssl_protocols=TLSv1\.2:TLSv1\.4" in "ratelimit_redis" directive in \S+nginx\.conf:\d+/,
        'an unknown protocol'],
    ["unix:/tmp/redis.sock ssl=on ssl_verify=off",
        qr/"ssl=on" of the "ratelimit_redis" directive is not for a unix: address .* in \S+nginx\.conf:\d+/,
        'ssl=on with a unix: address'],
    ["127.0.0.1:6380 ssl_name=redis.test",
        qr/"ssl_name=" of the "ratelimit_redis" directive needs "ssl=on" in \S+nginx\.conf:\d+/,
        'ssl_* without ssl=on'],
    ["127.0.0.1:6380 ssl=on ssl_trusted_certificate=$dir/missing.crt",
        qr/cannot load "ssl_trusted_certificate=\S+missing\.crt" of the "ratelimit_redis" directive in \S+nginx\.conf:\d+/,
        'a CA file that does not exist'],
    ["127.0.0.1:6380 ssl=yes ssl_verify=off",
        qr/invalid value "ssl=yes" in "ratelimit_redis" directive/, 'ssl=yes'],
);
for my $b (@bad) {
    my ($redis, $re, $what) = @$b;
    my ($rc, $out) = nginx_t(http_config => http_conf($redis), config => $config);
    isnt($rc, 0, "nginx -t fails: $what");
    like($out, $re, "nginx -t: $what, named with file:line");
}
my ($rc, $out) = nginx_t(http_config => http_conf("127.0.0.1:6380 ssl=on ssl_verify=off"),
    config => $config);
is($rc, 0, 'ssl_verify=off, written out, is accepted') or diag($out);

# --- relative paths: the configuration directory (nginx's conf prefix), as for
# proxy_ssl_trusted_certificate and proxy_ssl_certificate; not the prefix (-p).
{
    use File::Copy qw(copy);
    use File::Path qw(make_path);
    my $conf_dir = servroot() . '/conf';
    make_path("$conf_dir/rel", servroot() . '/conftest/conf/rel', servroot() . '/conftest/prefix-only');
    copy("$dir/ca.crt", "$conf_dir/rel/ca.crt") or die;
    for my $f (qw(client.crt client.key)) {
        copy("$dir/$f", servroot() . "/conftest/conf/rel/$f") or die;
        copy("$dir/$f", servroot() . "/conftest/prefix-only/$f") or die;
    }
    ($st, $log) = case('relative CA', "127.0.0.1:\$TEST_NGINX_TLS_PORT ssl=on"
        . " ssl_trusted_certificate=rel/ca.crt" . ($vg ? ' timeout=5s' : ''), 'rel', 6);
    is($st, 'PASSED PASSED PASSED PASSED PASSED REJECTED',
        'ssl_trusted_certificate=rel/ca.crt is read from the configuration directory');
    my ($rc, $out) = nginx_t(http_config => http_conf("127.0.0.1:6380 ssl=on ssl_verify=off"
        . " ssl_certificate=rel/client.crt ssl_certificate_key=rel/client.key"), config => $config);
    is($rc, 0, 'ssl_certificate= and its key relative to the configuration directory') or diag($out);
    ($rc, $out) = nginx_t(http_config => http_conf("127.0.0.1:6380 ssl=on ssl_verify=off"
        . " ssl_certificate=prefix-only/client.crt ssl_certificate_key=prefix-only/client.key"),
        config => $config);
    isnt($rc, 0, 'not relative to the prefix');
    like($out, qr/cannot load "ssl_certificate=prefix-only\/client\.crt"/, 'nginx -t says which file');
}

$tls->stop;
done_testing();

#!/usr/bin/env bash
# Why the suites of a failed prove run failed: for each suite in the "Test Summary Report" of
# prove's saved output, the "#   Failed test ..." lines of its stderr with the "# ..." lines that
# follow each of them; for a suite that failed none (it died, its plan was wrong) the end of its
# stderr. The stderr of each suite is the copy t/prove-exec.sh kept: under prove -j2 the
# stderr of two suites is mixed in the output. The Makefile prints this after prove's summary,
# so that the tail of a CI log says why a test failed, not only which.
#
#   t/prove-failures.sh build/test-logs/prove-vendored.log build/test-logs/prove-vendored.stderr
set -euo pipefail
out=${1:?usage: t/prove-failures.sh PROVE_OUTPUT STDERR_DIR}
dir=${2:?usage: t/prove-failures.sh PROVE_OUTPUT STDERR_DIR}
# Lines shown per failure (RLTest's error.log tails are 40), and of a suite's stderr otherwise.
max=${PROVE_FAILURES_MAX_LINES:-60}
tail_lines=20

suites=$(awk '/^Test Summary Report/ { s = 1; next } s && $1 ~ /\.t$/ && $2 ~ /^\(Wstat:/ { print $1 }' "$out")
[ -n "$suites" ] || exit 0
echo
echo "==> why: the diagnostics of the failed suites (all of prove's output: $out)"
for suite in $suites; do
    err="$dir/${suite//\//_}.stderr"
    echo "--- $suite"
    if [ ! -f "$err" ]; then
        echo "    (no stderr copy $err)"
    elif grep -q '^#   Failed test' "$err"; then
        awk -v max="$max" -v err="$err" '
            /^#   Failed test/ { n = 0; on = 1 }
            on && !/^#/ { on = 0 }
            on && ++n <= max { print }
            on && n == max + 1 { print "    (more in " err ")" }
        ' "$err"
    else
        echo "    (no \"#   Failed test\" line; the end of its stderr, $err:)"
        tail -n "$tail_lines" "$err"
    fi
done

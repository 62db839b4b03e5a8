#!/usr/bin/env bash
# prove --exec: runs one suite as prove would (perl FILE) and keeps a copy of its stderr, which
# still goes to prove's stderr as well, in $PROVE_STDERR_DIR/<suite>.stderr (t_215-cluster-node.t.stderr).
# Under prove -j2 two suites share one stderr; t/prove-failures.sh reads a failed suite's own.
set -uo pipefail
suite=${!#}
dir=${PROVE_STDERR_DIR:?PROVE_STDERR_DIR: where the stderr copies go}
mkdir -p "$dir"
# stdout (the TAP) straight to prove through fd 3; stderr through tee. The status is perl's.
{ "${PERL:-perl}" "$@" 2>&1 >&3 3>&- | tee "$dir/${suite//\//_}.stderr" >&2 3>&-; } 3>&1

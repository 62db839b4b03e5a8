#!/bin/sh
# Bounded fuzzing of the RESP decoder (src/codec/resp/mod.rs), for CI and by hand.
#
#   fuzz/run.sh [seconds] [engine]
#
#   seconds  how long to fuzz (default 60), not counting the build (about a minute the first
#            time: libFuzzer's C++ sources are compiled once)
#   engine   libfuzzer  cargo-fuzz + libFuzzer, coverage-guided, on stable Rust
#                       (--sanitizer none: the decoder is safe Rust, so ASan adds nothing and
#                       would need nightly); corpus in fuzz/corpus/resp, seeded from fuzz/seeds
#            prop       the libFuzzer-free driver (examples/resp_prop.rs): structure-aware random
#                       replies, corrupted, cut at random and at line ends
#            auto       (default) libfuzzer when cargo-fuzz is installed, else prop
#            both       each for the full time, libfuzzer first
#
# Exit status 0: no input broke a property (see src/check.rs). Otherwise the failing input is
# in fuzz/artifacts/ (libFuzzer: artifacts/resp/crash-*; prop: artifacts/resp_prop/failure-*),
# in the target's input format: byte 0 = number of cuts n, n little-endian u16 cut points, data.
# Replay one with: cargo fuzz run --sanitizer none resp <file>
#
# Set FUZZ_INSTALL=1 to `cargo install cargo-fuzz` when it is missing (needs crates.io).
set -eu

secs=${1:-60}
engine=${2:-auto}
case $secs in '' | *[!0-9]*) echo "usage: $0 [seconds] [auto|libfuzzer|prop|both]" >&2; exit 2 ;; esac
cd "$(dirname "$0")"

have_cargo_fuzz() {
    cargo fuzz --version >/dev/null 2>&1 && return 0
    [ "${FUZZ_INSTALL:-0}" = 1 ] && cargo install cargo-fuzz --locked && return 0
    return 1
}

run_libfuzzer() {
    mkdir -p corpus/resp artifacts/resp
    echo "== libFuzzer (cargo fuzz, --sanitizer none), ${secs}s"
    # -max_len above the decoder's 4096-byte line cap, so over-long lines are reachable.
    cargo fuzz run --sanitizer none --debug-assertions resp corpus/resp seeds -- \
        -max_total_time="$secs" -max_len=16384 -dict=resp.dict -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1
}

run_prop() {
    echo "== property driver (examples/resp_prop.rs), ${secs}s"
    cargo run --release --example resp_prop -- "$secs"
}

case $engine in
    libfuzzer) run_libfuzzer ;;
    prop) run_prop ;;
    both) run_libfuzzer && run_prop ;;
    auto)
        if have_cargo_fuzz; then run_libfuzzer
        else
            echo "cargo-fuzz not found (FUZZ_INSTALL=1 installs it): using the property driver" >&2
            run_prop
        fi ;;
    *) echo "unknown engine '$engine'" >&2; exit 2 ;;
esac

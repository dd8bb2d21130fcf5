#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (default 5 s each, what
# `cargo test` runs through tests/fuzz.rs: the corpus replayed and a short
# exploration; .ci/run then runs 60 s each; first argument or
# TESSERA_FUZZ_SECONDS), starting from the seeds in fuzz/seeds/
# and the corpus kept in fuzz/corpus/ (ignored by git). A crash fails the
# run and leaves its input in fuzz/artifacts/<target>/: turn it into a case
# of `fuzzing::tests` in src/fuzzing.rs.
#
# cargo-fuzz (libFuzzer) on the machine's stable toolchain: coverage-guided,
# without AddressSanitizer, which needs a nightly compiler this machine
# cannot fetch. tessera has no unsafe code (#![forbid(unsafe_code)]), so
# what the targets look for is panics, overflows, runaway recursion and
# their own assertions (see src/fuzzing.rs).
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-${TESSERA_FUZZ_SECONDS:-5}}
CARGO_FUZZ_VERSION=0.13.2
if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
    echo "fuzz: installing cargo-fuzz $CARGO_FUZZ_VERSION" >&2
    cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION" --quiet
fi
targets=(jsonrpc sse headers route raw_head redact h1)
# All targets in one build (run would build them one by one).
cargo fuzz build --sanitizer none -O >&2
# The logs go in fuzz/target, which the build above does not make when
# CARGO_TARGET_DIR points elsewhere.
mkdir -p target
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    # libFuzzer's last line: "Done N runs in S second(s)".
    cargo fuzz run --sanitizer none -O "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=0 2>"target/$t.log" || {
        tail -n 40 "target/$t.log" >&2
        echo "fuzz: $t FAILED; its input is in fuzz/artifacts/$t/" >&2
        exit 1
    }
    echo "fuzz $t: $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "target/$t.log" | tail -n 1)"
done

#!/usr/bin/env bash
# A soak run: 10,000 idle SSE streams held through one tessera process while
# a steady request load runs (60 s at 500 requests/s by default); prints the
# memory per open stream, the errors, and whether memory and the open-stream
# count came back after the streams closed.
#
#   bench/soak.sh [--streams N] [--seconds S] [--rate R] [--h2]
#
# Each stream costs tessera two sockets over HTTP/1.1 (caller and
# upstream); with --h2 the upstream is reached over TLS with HTTP/2, all
# streams on one connection, so 10,000 streams fit a 20,000-fd limit.
#
# Uses the benchmark's tools (oha; bench/run.sh installs it) and builds in
# release mode. Not part of CI: run it when the request path changes.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v oha >/dev/null || cargo install oha --locked --version 1.16.0 --quiet
cargo build --release --quiet --bin tessera --example bench-upstream --example bench-sse
ulimit -n "$(ulimit -Hn)"
exec python3 bench/soak.py "$@"

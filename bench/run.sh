#!/usr/bin/env bash
# tessera against nginx doing the same job, next to a direct connection.
#
#   bench/run.sh            full run (5 rounds of 5 s), writes BENCHMARKS.md
#   bench/run.sh --smoke    one-second runs that check the benchmark works
#                           (what CI runs); writes nothing
#   bench/run.sh --rounds 3 --duration 10 --streams 10000 ...
#
# Installs what it needs when missing (nginx and wrk from Debian, oha from
# crates.io), builds tessera and the benchmark's upstream and SSE client in
# release mode, and hands over to bench/bench.py.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v nginx >/dev/null || need_apt+=(nginx-light)
command -v wrk >/dev/null || need_apt+=(wrk)
command -v taskset >/dev/null || need_apt+=(util-linux)
if ((${#need_apt[@]})); then
    echo "bench: installing ${need_apt[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if ! command -v oha >/dev/null; then
    echo "bench: installing oha" >&2
    cargo install oha --locked --version 1.16.0 --quiet
fi
if [ "$(nproc)" -lt 2 ]; then
    echo "bench: needs 2 cores (client and upstream on one, the proxy on the other)" >&2
    exit 1
fi

cargo build --release --quiet --bin tessera --example bench-upstream --example bench-sse \
    --example bench-relay

# 10,000 streams through a proxy hold 20,000 sockets in it and 10,000 in
# the client and the upstream each. Raise the soft limit as far as the hard
# limit allows (raising the hard limit needs CAP_SYS_RESOURCE); bench.py
# opens fewer streams, and says so, when the hard limit is lower.
ulimit -n "$(ulimit -Hn)"

exec python3 bench/bench.py "$@"

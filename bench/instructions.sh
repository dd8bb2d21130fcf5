#!/usr/bin/env bash
# Instructions tessera spends per proxied request, counted by callgrind:
# repeatable to within about 2% whatever else the machine is doing, where
# the timed benchmark (bench/run.sh) can move by more than the change being
# measured.
#
#   bench/instructions.sh                       this tree's release build
#   bench/instructions.sh --compare OTHER_BIN   and another build, same load
#   bench/instructions.sh --requests 5000 --binary BIN
#
# Each build serves 1,000 warm-up requests, then its counters are zeroed
# and it serves --requests realistic tools/call POSTs (8 at a time, through
# oha) to the benchmark's upstream, with the access log and the audit trail
# on. The count covers every thread (the audit writer's SQLite thread too)
# in user space; system calls are not counted. valgrind's CPU has no SHA
# extensions, so SHA-256 runs in software here and counts for more than it
# costs on a CPU with them (about 14,000 of the instructions per request).
set -euo pipefail
cd "$(dirname "$0")/.."

requests=5000 binary="" compare=""
while (($#)); do
    case $1 in
    --requests) requests=$2; shift 2 ;;
    --binary) binary=$2; shift 2 ;;
    --compare) compare=$2; shift 2 ;;
    *) echo "usage: $0 [--requests N] [--binary BIN] [--compare BIN]" >&2; exit 2 ;;
    esac
done
command -v valgrind >/dev/null || { echo "bench: needs valgrind" >&2; exit 1; }
command -v oha >/dev/null || cargo install oha --locked --version 1.16.0 --quiet
cargo build --release --quiet --bin tessera --example bench-upstream
rel=${CARGO_TARGET_DIR:-target}/release
binary=${binary:-$rel/tessera}

work=$(mktemp -d /tmp/tessera-instructions-XXXX)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
export TESSERA_ALLOW_PRIVATE_UPSTREAMS=true TESSERA_CALLER_RATE=0 TESSERA_CALLER_MAX_IN_FLIGHT=0
export BENCH_UPSTREAM_SECRET="ghp_bench_$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
BODY='{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"update_issue","arguments":{"owner":"acme","repo":"widgets","issue_number":42,"labels":["bug","triage"],"body":"Steps to reproduce:\n1. open the app\n2. click save\nExpected: saved. Actual: error 500."},"_meta":{"progressToken":"p-7","io.modelcontextprotocol/protocolVersion":"2025-11-25"}}}'

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
    for _ in $(seq 200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return
        sleep 0.1
    done
    echo "bench: nothing listens on port $1" >&2
    exit 1
}

up_port=$(free_port)
"$rel/examples/bench-upstream" "127.0.0.1:$up_port" >/dev/null &
pids+=($!)
wait_port "$up_port"

send() { # url token count
    local out
    out=$(oha -n "$3" -c 8 --no-tui -m POST -d "$BODY" -H "Authorization: Bearer $2" \
        -H "Content-Type: application/json" "$1")
    grep -q "\[200\] $3 responses" <<<"$out" || { echo "bench: not every request got 200:" >&2; echo "$out" >&2; exit 1; }
}

# Prints the instructions per request of one build.
count() {
    local bin=$1 data port token url vg
    data=$(mktemp -d "$work/data-XXXX")
    port=$(free_port)
    export TESSERA_DATA_DIR=$data
    "$bin" credential add bench --upstream "http://127.0.0.1:$up_port/mcp" \
        --secret-env BENCH_UPSTREAM_SECRET >/dev/null
    token=$("$bin" caller add agent | tail -1)
    url=$("$bin" connection add --caller agent --credential bench \
        --public-url "http://127.0.0.1:$port" | tail -1)
    RUST_LOG=info valgrind --tool=callgrind --callgrind-out-file="$data/cg.out" \
        "$bin" serve --listen "127.0.0.1:$port" --worker-threads 1 2>"$data/log" &
    vg=$!
    pids+=($vg)
    wait_port "$port"
    send "$url" "$token" 1000
    callgrind_control -z "$vg" >/dev/null 2>&1
    send "$url" "$token" "$requests"
    # The audit writer lingers 20 ms for a batch, the log buffer 1 s.
    sleep 1.5
    callgrind_control -d "$vg" >/dev/null 2>&1
    kill -TERM "$vg"
    wait "$vg" || true
    local total
    total=$(callgrind_annotate "$data/cg.out.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')
    echo $((total / requests))
}

printf 'instructions per proxied request (callgrind, %s requests, every thread):\n' "$requests"
this=$(count "$binary")
printf '  %-40s %8d\n' "$binary" "$this"
if [ -n "$compare" ]; then
    other=$(count "$compare")
    printf '  %-40s %8d\n' "$compare" "$other"
    awk -v a="$this" -v b="$other" 'BEGIN { printf "  change: %+.1f%%\n", (a - b) * 100 / b }'
fi

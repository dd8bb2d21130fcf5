#!/usr/bin/env bash
# Instructions tessera spends per proxied request, counted by callgrind:
# repeatable to within about 2% whatever else the machine is doing, where
# the timed benchmark (bench/run.sh) can move by more than the change being
# measured. nginx doing the same job (bench/nginx.conf) and the byte relay
# (bench/relay.rs, the floor) are measured the same way, so that
# tessera/nginx is a figure that repeats too, where the timed ratio moves
# with the machine's load.
#
#   bench/instructions.sh                       tessera, nginx and the relay
#   bench/instructions.sh --compare OTHER_BIN   and another tessera build
#   bench/instructions.sh --tessera-only        tessera (and --compare) only
#   bench/instructions.sh --requests 5000 --binary BIN
#   bench/instructions.sh --keep                keep the callgrind files (to
#                                               callgrind_annotate them)
#
# Each arm serves 1,000 warm-up requests, then its counters are zeroed and
# it serves --requests realistic tools/call POSTs (8 at a time, through
# oha) to the benchmark's upstream, which answers 200 only to the injected
# credential: an arm that fails to forward or to inject stops the script.
# tessera runs with the access log and the audit trail on, nginx with its
# buffered access log, as in bench/run.sh. The count covers every thread
# (tessera's audit writer's SQLite thread too) and every process of an arm
# in user space; system calls are not counted. valgrind's CPU has no SHA
# extensions, so SHA-256 runs in software here and counts for more than it
# costs on a CPU with them (about 14,000 of tessera's instructions per
# request; nginx's arm matches the caller token as a plain string and does
# no SHA-256).
set -euo pipefail
cd "$(dirname "$0")/.."

requests=5000 binary="" compare="" others=1 keep=0
while (($#)); do
    case $1 in
    --requests) requests=$2; shift 2 ;;
    --binary) binary=$2; shift 2 ;;
    --compare) compare=$2; shift 2 ;;
    --tessera-only) others=0; shift ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--requests N] [--binary BIN] [--compare BIN] [--tessera-only] [--keep]" >&2; exit 2 ;;
    esac
done
command -v valgrind >/dev/null || { echo "bench: needs valgrind" >&2; exit 1; }
command -v curl >/dev/null || { echo "bench: needs curl" >&2; exit 1; }
command -v oha >/dev/null || cargo install oha --locked --version 1.16.0 --quiet
if ((others)) && ! command -v nginx >/dev/null; then
    # The same package bench/run.sh installs.
    echo "bench: installing nginx-light" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null
fi
cargo build --release --quiet --bin tessera --example bench-upstream --example bench-relay
rel=${CARGO_TARGET_DIR:-target}/release
binary=${binary:-$rel/tessera}

work=$(mktemp -d /tmp/tessera-instructions-XXXX)
pids=()
cleanup() {
    kill "${pids[@]}" 2>/dev/null || true
    if ((keep)); then echo "bench: callgrind files kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
export TESSERA_ALLOW_PRIVATE_UPSTREAMS=true TESSERA_CALLER_RATE=0 TESSERA_CALLER_MAX_IN_FLIGHT=0
# No ops listener: its fixed port would collide between arms (older builds ignore this).
export TESSERA_OPS_LISTEN=off
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

# Sends COUNT POSTs and stops the script unless every one got a 200, which
# only the upstream gives (and only with the injected credential): oha's
# status code distribution must be that one line, with no connection
# errors.
send() { # url token count
    local out
    out=$(oha -n "$3" -c 8 --no-tui -m POST -d "$BODY" -H "Authorization: Bearer $2" \
        -H "Content-Type: application/json" "$1")
    if ! grep -q "\[200\] $3 responses" <<<"$out" || grep -q "Error distribution" <<<"$out"; then
        echo "bench: not every request to $1 got 200:" >&2
        echo "$out" >&2
        exit 1
    fi
}

# One request by curl, before the warm-up, to see that a proxy does the job
# as bench/bench.py's check_arm does: the upstream's answer gets through,
# its Set-Cookie and WWW-Authenticate do not, and a wrong caller token is
# refused (tessera answers 403, the nginx configuration 401). The relay
# copies bytes and is only checked for the 200.
check_job() { # name url token is_proxy
    local headers status
    headers=$(curl -s -D - -o /dev/null -X POST -d "$BODY" -H "Authorization: Bearer $3" \
        -H "Content-Type: application/json" "$2")
    status=$(awk 'NR == 1 {print $2}' <<<"$headers")
    [ "$status" = 200 ] || { echo "bench: $1: a valid request got $status" >&2; exit 1; }
    if (($4 == 0)); then return; fi
    if grep -qi '^\(set-cookie\|www-authenticate\):' <<<"$headers"; then
        echo "bench: $1 passed Set-Cookie or WWW-Authenticate back to the caller" >&2
        exit 1
    fi
    status=$(curl -s -o /dev/null -w '%{http_code}' -X POST -d "$BODY" \
        -H "Authorization: Bearer wrong-token" -H "Content-Type: application/json" "$2")
    case $status in 401 | 403) ;; *) echo "bench: $1: a wrong caller token got $status" >&2; exit 1 ;; esac
}

# callgrind_control, quiet unless it fails.
cgctl() {
    local out
    out=$(callgrind_control "$@" 2>&1) || { echo "bench: callgrind_control $*: $out" >&2; exit 1; }
}

# Runs the load against an arm already started under callgrind (its
# process is $1, with --callgrind-out-file=$2/cg.out.%p) and sets
# `result` to its instructions per request. Every process of the arm is
# zeroed and dumped, and their dumps summed (callgrind_control is given
# the pids, not left to find every callgrind on the machine: another
# run may be going on).
measure() { # pid dir url token
    local vg=$1 dir=$2 procs p total=0 n f
    send "$3" "$4" 1000
    procs=$(pgrep -d ' ' -P "$vg" || true)
    procs="$vg $procs"
    for p in $procs; do cgctl -z "$p"; done
    send "$3" "$4" "$requests"
    # tessera's audit writer lingers 20 ms for a batch, its log buffer and
    # nginx's access log buffer 1 s.
    sleep 1.5
    for p in $procs; do cgctl -d "$p"; done
    kill -TERM $procs
    wait "$vg" || true
    # One dump per process, named cg.out.PID.1 (the part since the zeroing).
    for f in "$dir"/cg.out.*.1; do
        [ -e "$f" ] || { echo "bench: no callgrind dump in $dir" >&2; exit 1; }
        n=$(callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')
        total=$((total + n))
    done
    result=$((total / requests))
}

# tessera: sets `result`, `token` and `url` (its caller token and
# connection URL).
tessera() { # binary
    local bin=$1 data port vg
    data=$(mktemp -d "$work/tessera-XXXX")
    port=$(free_port)
    export TESSERA_DATA_DIR=$data
    "$bin" credential add bench --upstream "http://127.0.0.1:$up_port/mcp" \
        --secret-env BENCH_UPSTREAM_SECRET >/dev/null
    token=$("$bin" caller add agent | tail -1)
    url=$("$bin" connection add --caller agent --credential bench \
        --public-url "http://127.0.0.1:$port" | tail -1)
    RUST_LOG=info valgrind --tool=callgrind --callgrind-out-file="$data/cg.out.%p" \
        "$bin" serve --listen "127.0.0.1:$port" --worker-threads 1 2>"$data/log" &
    vg=$!
    pids+=($vg)
    wait_port "$port"
    check_job tessera "$url" "$token" 1
    measure "$vg" "$data" "$url" "$token"
}

# nginx with bench/nginx.conf, filled in as bench/bench.py fills it in,
# plus `master_process off;`: the job bench/run.sh gives its one worker
# process, done here by one process that callgrind runs from the start
# (with a master, the worker would be a forked child; measure zeroes and
# dumps any child too, and --trace-children=yes follows an exec, so that
# nothing would go uncounted if nginx ever did start one).
nginx_arm() {
    local dir port conf vg
    dir=$(mktemp -d "$work/nginx-XXXX")
    port=$(free_port)
    conf=$(<bench/nginx.conf)
    conf=${conf//@DIR@/"$dir"}
    conf=${conf//@UPSTREAM_PORT@/"$up_port"}
    conf=${conf//@NGINX_PORT@/"$port"}
    conf=${conf//@CALLER_TOKEN@/"$nginx_token"}
    conf=${conf//@CONNECTION_ID@/"$nginx_conn"}
    conf=${conf//@UPSTREAM_SECRET@/"$BENCH_UPSTREAM_SECRET"}
    # bench.py fills in the fd limit; valgrind keeps the top 12 descriptors
    # for itself, and nginx warns when worker_connections exceeds the rest.
    conf=${conf//@NOFILE@/"$(($(ulimit -n) - 12))"}
    conf=${conf/$'\n'daemon off;/$'\n'daemon off;$'\n'master_process off;}
    grep -q '^master_process off;$' <<<"$conf" || {
        echo "bench: bench/nginx.conf has no 'daemon off;' line to add 'master_process off;' to" >&2
        exit 1
    }
    printf '%s\n' "$conf" >"$dir/nginx.conf"
    valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$dir/cg.out.%p" \
        nginx -c "$dir/nginx.conf" -p "$dir" -e "$dir/error.log" 2>"$dir/valgrind.log" &
    vg=$!
    pids+=($vg)
    wait_port "$port"
    check_job nginx "http://127.0.0.1:$port/c/$nginx_conn" "$nginx_token" 1
    measure "$vg" "$dir" "http://127.0.0.1:$port/c/$nginx_conn" "$nginx_token"
}

# The relay copies bytes: the caller sends the upstream's credential
# itself, as in bench/bench.py.
relay_arm() {
    local dir port vg
    dir=$(mktemp -d "$work/relay-XXXX")
    port=$(free_port)
    valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out.%p" \
        "$rel/examples/bench-relay" "127.0.0.1:$port" "127.0.0.1:$up_port" \
        >/dev/null 2>"$dir/valgrind.log" &
    vg=$!
    pids+=($vg)
    wait_port "$port"
    check_job relay "http://127.0.0.1:$port/mcp" "$BENCH_UPSTREAM_SECRET" 0
    measure "$vg" "$dir" "http://127.0.0.1:$port/mcp" "$BENCH_UPSTREAM_SECRET"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
row() { printf '  %-10s %22s %12s\n' "$@"; }

printf 'instructions per proxied request (callgrind, %s requests, every thread):\n' "$requests"
row arm instructions/request tessera/arm
tessera "$binary"
# nginx's arm is given this build's caller token and connection id, so that
# its callers send the same requests as tessera's.
this=$result nginx_token=$token nginx_conn=${url##*/}
row tessera "$this" 1.00
if [ -n "$compare" ]; then
    tessera "$compare"
    other=$result
    row before "$other" "$(ratio "$this" "$other")"
fi
if ((others)); then
    nginx_arm
    nginx_count=$result
    row nginx "$result" "$(ratio "$this" "$result")"
    relay_arm
    relay_count=$result
    row relay "$result" "$(ratio "$this" "$result")"
fi
if [ -n "$compare" ]; then
    awk -v a="$this" -v b="$other" 'BEGIN { printf "  change: %+.1f%% (tessera against before)\n", (a - b) * 100 / b }'
fi
echo "  tessera: $binary"
if [ -n "$compare" ]; then echo "  before:  $compare"; fi
if ((others)); then
    echo "  nginx:   $(nginx -v 2>&1 | sed 's/^nginx version: //'), bench/nginx.conf with master_process off"
    echo "  relay:   bench/relay.rs (bytes copied, no parsing)"
fi
# For bench/bench.py's table: the last full count of this build (with
# nginx and the relay), and the tree it was counted at.
if ((others)) && [ "$binary" = "$rel/tessera" ]; then
    {
        echo "tree $(git describe --always --dirty 2>/dev/null || echo unknown)"
        echo "requests $requests"
        echo "tessera $this"
        echo "nginx $nginx_count"
        echo "relay $relay_count"
    } >"$rel/instructions.txt"
fi

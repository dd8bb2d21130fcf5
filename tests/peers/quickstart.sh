#!/usr/bin/env bash
# The README's Quickstart, run as written: every ```sh block of its
# "## Quickstart" section, in order, in a fresh folder, with the defaults a
# new user has (no TESSERA_* variable, ports 3001, 7470 and 7471). A block
# that ends in a long-running command (the upstream, `tessera serve`) runs
# in the background, as in its own terminal; the last block runs in the
# foreground and must print the upstream's initialize answer. Two shims
# stand in for what a user has on their PATH: `tessera` is the binary under
# test, and `npx -y @modelcontextprotocol/server-everything` is the pinned
# copy in tests/peers/node_modules (run by Node 22 with loopback.mjs, which
# keeps it on 127.0.0.1 and records what it received).
#
# Called by run.sh with TESSERA_BIN, PEERS_NODE and a scratch folder; prints
# one line and exits non-zero on failure.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
readme="$here/../../README.md"
work=$1
mkdir -p "$work/quickstart"
cd "$work/quickstart"
export QUICKSTART_TESSERA=$TESSERA_BIN
for v in $(env | grep -o '^TESSERA_[A-Z_]*'); do unset "$v"; done

for port in 3001 7470 7471; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "port $port is taken; the Quickstart uses the defaults"
        exit 1
    fi
done

# The blocks, NUL-separated.
awk '
    /^## / { inside = ($0 == "## Quickstart") }
    inside && /^```sh$/ { block = 1; next }
    inside && block && /^```$/ { block = 0; printf "%c", 0; next }
    inside && block { print }
' "$readme" >blocks
mapfile -d '' blocks <blocks
[ "${#blocks[@]}" -ge 3 ] || { echo "README's Quickstart has ${#blocks[@]} sh blocks"; exit 1; }

tessera() { "$QUICKSTART_TESSERA" "$@"; }
npx() {
    [ "$1" = -y ] && shift
    [ "$1" = @modelcontextprotocol/server-everything ] || { echo "npx shim: $1" >&2; return 1; }
    shift
    "$PEERS_NODE" --import "$here/loopback.mjs" \
        "$here/node_modules/@modelcontextprotocol/server-everything/dist/index.js" "$@"
}
export -f tessera npx
export PEERS_UPSTREAM_LOG="$work/quickstart/upstream.jsonl" here

pids=()
# Each background block is its own process group, ended whole.
trap 'for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null; done' EXIT
wait_for() {
    for _ in $(seq 100); do
        curl -s -o /dev/null "$1" && return 0
        sleep 0.1
    done
    return 1
}
last=$((${#blocks[@]} - 1))
for i in "${!blocks[@]}"; do
    if [ "$i" -lt "$last" ]; then
        setsid bash -e -c "${blocks[$i]}" >"block$i.log" 2>&1 &
        pids+=($!)
    fi
    case $i in
    0) wait_for http://127.0.0.1:3001/mcp || { echo "block 0: no upstream on 3001: $(tail -n 5 block0.log)"; exit 1; } ;;
    1) wait_for http://127.0.0.1:7470/ || { echo "block 1: no tessera on 7470: $(tail -n 5 block1.log)"; exit 1; } ;;
    esac
done
out=$(bash -e -c "${blocks[$last]}" 2>&1)
if ! grep -q '"serverInfo"' <<<"$out"; then
    echo "the last block did not print an initialize answer: $out"
    exit 1
fi
# What crossed: the stored secret reached the upstream, the caller's token
# did not.
if ! grep -q 'demo-secret' upstream.jsonl || grep -q 'tsr_' upstream.jsonl; then
    echo "the upstream saw: $(cat upstream.jsonl)"
    exit 1
fi
grep -q '^tsa_' block1.log && curl -sf -o /dev/null http://127.0.0.1:7471/ui/login ||
    { echo "no admin token printed, or no console on 7471: $(head -n 5 block1.log)"; exit 1; }
echo "the README's Quickstart ran as written"

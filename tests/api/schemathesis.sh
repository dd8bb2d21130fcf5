#!/usr/bin/env bash
# Checks the running admin API against the OpenAPI document it serves, with
# schemathesis (PyPI, pinned): every operation is called with generated
# valid and invalid input, and every answer must match the document (status
# codes, content types, bodies), never be a 5xx, and honour the admin token.
#
# Usage: tests/api/schemathesis.sh [--max-examples N]
# `cargo test` runs it (tests/api.rs) with TESSERA_BIN set to the binary it
# built; run alone, it builds the debug binary first.
set -euo pipefail

SCHEMATHESIS_VERSION=4.32.5
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="${SCHEMATHESIS_VENV:-$root/target/tools/schemathesis-$SCHEMATHESIS_VERSION}"
max_examples=25
[ "${1:-}" = "--max-examples" ] && max_examples=$2

if [ ! -x "$venv/bin/schemathesis" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "schemathesis==$SCHEMATHESIS_VERSION"
fi

tessera=${TESSERA_BIN:-}
if [ -z "$tessera" ]; then
    cargo build --quiet --bin tessera
    tessera="${CARGO_TARGET_DIR:-$root/target}/debug/tessera"
fi
work=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
admin_port=$(free_port)
export TESSERA_DATA_DIR="$work/data"
unset TESSERA_DATABASE_URL TESSERA_MASTER_KEY
# Credentials the fuzzer registers may name loopback upstreams.
export TESSERA_ALLOW_PRIVATE_UPSTREAMS=true
token=$("$tessera" admin-token add schemathesis | tail -n 1)
"$tessera" serve --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin_port" \
    --ops-listen 127.0.0.1:0 2>"$work/serve.log" &
pid=$!
for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$admin_port/healthz" >/dev/null && break
    sleep 0.1
done

# From the scratch dir: schemathesis keeps a cache in its working directory.
cd "$work"
"$venv/bin/schemathesis" --config-file "$root/tests/api/schemathesis.toml" run "http://127.0.0.1:$admin_port/openapi.json" \
    --header "Authorization: Bearer $token" \
    --max-examples "$max_examples" \
    --seed 7 \
    --workers 1 \
    --no-color

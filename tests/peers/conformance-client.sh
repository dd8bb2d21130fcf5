#!/usr/bin/env bash
# The client the conformance runner starts for its client scenarios, as
# `conformance-client.sh SERVER_URL` with MCP_CONFORMANCE_SCENARIO set. The
# runner's test server becomes an upstream of tessera: the admin registers
# it with the CLI and hands the client the connection URL and the caller's
# token, and the client (TypeScript SDK 1.x, conformance-client.mjs) talks
# to the test server only through tessera.
# Environment from run.sh: TESSERA_BIN, TESSERA_DATA_DIR, TESSERA_PUBLIC_URL,
# PEERS_CALLER, PEERS_CALLER_TOKEN, PEERS_NODE.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
upstream=$1
name="conformance-${MCP_CONFORMANCE_SCENARIO//[^a-z0-9]/-}-${upstream##*:}"
name=${name%%/*}
SECRET=conformance-stored-secret "$TESSERA_BIN" credential add "$name" \
    --upstream "$upstream" --secret-env SECRET >/dev/null
url=$("$TESSERA_BIN" connection add --caller "$PEERS_CALLER" --credential "$name" | tail -n 1)
# The serving process picks the new connection up within its refresh
# interval: wait until it knows the address. The probe is not JSON, so it
# is refused (400) before anything reaches the test server.
for _ in $(seq 100); do
    code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$url" \
        -H "Authorization: Bearer $PEERS_CALLER_TOKEN" -H 'Content-Type: application/json' -d '{oops')
    [ "$code" = 400 ] && break
    sleep 0.05
done
exec "$PEERS_NODE" "$here/conformance-client.mjs" "$url"

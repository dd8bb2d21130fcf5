"""The Python SDK `mcp` 2.x client in its default `auto` mode through
tessera: it probes server/discover, settles on 2026-07-28 with the fastmcp
upstream and falls back to the initialize handshake with server-everything
(2025-11-25 only). The caller's token goes in the httpx2.AsyncClient the
streamable HTTP client is given.

It also calls `echo_headers` on gzip_server.py, which gzips every answer
whatever it is asked: httpx2 keeps its default `Accept-Encoding: gzip,
deflate` and decodes what comes back, so a gzip answer tessera passed on
unread would be gunzipped here, secret and all.

Environment: PEERS_FASTMCP_URL, PEERS_EVERYTHING_URL, PEERS_CALLER_TOKEN,
PEERS_STORED_SECRET (the fastmcp credential), PEERS_FASTMCP_LOG,
PEERS_GZIP_URL, PEERS_GZIP_SECRET, PEERS_GZIP_LOG (the gzip server's),
PEERS_SSE_URL (server-everything on the 2024-11-05 transport).
Prints `ok NAME` or `FAIL NAME: why` per check, like report.mjs.
"""

import asyncio
import base64
import json
import os
import time
import traceback

import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

caller = os.environ["PEERS_CALLER_TOKEN"]
stored = os.environ["PEERS_STORED_SECRET"]


async def check(name, fn):
    """NAME may be a function, called once the check has run (a name that
    records what the check saw)."""
    label = name if callable(name) else (lambda: name)
    try:
        await fn()
        print(f"ok {label()}", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is reported
        why = "".join(traceback.format_exception_only(e)).strip().replace("\n", " | ")
        while isinstance(e, BaseExceptionGroup) and e.exceptions:  # the SDK's task groups: say what failed
            e = e.exceptions[0]
            why += " | " + "".join(traceback.format_exception_only(e)).strip().replace("\n", " | ")
        print(f"FAIL {label()}: {why}", flush=True)


def client(url, http):
    return Client(streamable_http_client(url, http_client=http))


def upstream_log(var="PEERS_FASTMCP_LOG"):
    with open(os.environ[var]) as f:
        return [json.loads(line) for line in f if line.strip()]


async def modern():
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {caller}"}) as http:
        async with client(os.environ["PEERS_FASTMCP_URL"], http) as c:
            v = c.session.protocol_version
            assert v == "2026-07-28", f"negotiated {v}"

            r = await c.call_tool("add", {"a": 2, "b": 3})
            assert not r.is_error and r.structured_content == {"result": 5}, r

            seen = []
            start = time.monotonic()

            async def progress(p, total, message):
                seen.append(time.monotonic() - start)

            r = await c.call_tool("count", {"to": 10}, progress_callback=progress)
            done = time.monotonic() - start
            assert "counted to 10" in str(r.content), r
            assert len(seen) == 10, f"{len(seen)} progress notifications"
            assert done - seen[0] > 0.3, f"first progress at {seen[0]:.3f} s, result at {done:.3f} s"

            before = len(upstream_log())
            r = await c.call_tool("seen_headers", {})
            assert stored not in str(r), "the stored secret came back to the caller"
            h = upstream_log()[before]
            assert h.get("authorization") == f"Bearer {stored}", "the upstream did not get the stored credential"
            assert caller not in json.dumps(h), "the caller's token reached the upstream"
            assert h.get("mcp-method") == "tools/call", h.get("mcp-method")


async def refused():
    """A call tessera's policy denies and one it holds for a person are
    results the model reads (isError, with resultType on 2026-07-28: the
    SDK throws a result without it away), and neither ran upstream."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {caller}"}) as http:
        async with client(os.environ["PEERS_FASTMCP_URL"], http) as c:
            assert c.session.protocol_version == "2026-07-28", c.session.protocol_version
            r = await c.call_tool("delete_note", {"name": "n"})
            assert r.is_error, r
            assert "refused" in r.content[0].text, r
            r = await c.call_tool("write_note", {"text": "t"})
            assert r.is_error, r
            assert "approval" in r.content[0].text, r
    ran = [e for e in upstream_log() if "ran" in e]
    assert not ran, f"the upstream ran {ran}"


async def legacy():
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {caller}"}) as http:
        async with client(os.environ["PEERS_EVERYTHING_URL"], http) as c:
            v = c.session.protocol_version
            assert v == "2025-11-25", f"negotiated {v}"
            r = await c.call_tool("echo", {"message": "from python"})
            assert "from python" in str(r.content), r


async def legacy_sse():
    """The 2024-11-05 HTTP+SSE transport (`sse_client`): the endpoint tessera
    announces must stay on tessera's origin (the SDK refuses another)."""
    from mcp.client.sse import sse_client

    auth = {"Authorization": f"Bearer {caller}"}
    async with Client(sse_client(os.environ["PEERS_SSE_URL"], headers=auth)) as c:
        r = await c.call_tool("get-sum", {"a": 40, "b": 2})
        assert "The sum of 40 and 2 is 42" in str(r.content), r


MARKER = "[redacted-by-tessera]"


def not_revealed(text, secret, where):
    """The secret in none of the forms a client could decode: itself, its
    base64 (standard; of its longest prefix of whole 3-byte groups, so that
    what follows it cannot change the text) and its hex."""

    def b64(s):
        return base64.b64encode(s[: len(s) - len(s) % 3].encode()).decode()

    forms = {
        "plain": secret,
        "base64": b64(secret),
        "base64 of the header": b64(f"Bearer {secret}"),
        "hex": secret.encode().hex(),
        "upper-case hex": secret.encode().hex().upper(),
    }
    for form, s in forms.items():
        assert s not in text, f"the stored secret ({form}) is in {where}"


gzip_upstream = "not seen"


async def gzip():
    global gzip_upstream
    secret = os.environ["PEERS_GZIP_SECRET"]
    # Every answer tessera gave this client: its Content-Encoding and, for
    # a JSON one (every answer of the stateless revision), its body as
    # httpx2 decoded it (read here; the SDK reads it again from the cache).
    answers = []

    async def record(response):
        body = None
        if response.headers.get("content-type", "").startswith("application/json"):
            await response.aread()
            body = response.text
        answers.append((response.headers.get("content-encoding"), body))

    async with httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {caller}"}, event_hooks={"response": [record]}
    ) as http:
        assert "gzip" in http.headers.get("accept-encoding", ""), http.headers.get("accept-encoding")
        failure = None
        before = len(upstream_log("PEERS_GZIP_LOG"))
        try:
            async with client(os.environ["PEERS_GZIP_URL"], http) as c:
                r = await c.call_tool("echo_headers", {})
                assert not r.is_error, f"the call failed: {r}"
                text = r.content[0].text
                assert MARKER in text, f"no {MARKER} in the echo (did it happen?): {text}"
                echoed = json.loads(text)
                auth = echoed.get("authorization", "")
                assert auth.startswith(f"Bearer {MARKER}") and len(auth) == len(f"Bearer {secret}"), (
                    f"the echoed Authorization is {auth!r}"
                )
                not_revealed(text, secret, "the result text")
                not_revealed("\n".join(echoed.values()), secret, "the result text decoded as JSON")
                not_revealed(str(r), secret, "the whole result")
                assert caller not in text, "the caller's token reached the upstream"
        except Exception as e:  # noqa: BLE001 - reported below, after the answers are judged
            failure = e
    calls = [e for e in upstream_log("PEERS_GZIP_LOG")[before:] if e["method"] == "tools/call"]
    gzip_upstream = "; ".join(
        f"{e['content_type']} with Content-Encoding {e['content_encoding']}, asked for {e['accept_encoding']}"
        for e in calls
    )
    # Whatever the SDK made of them, no answer held the secret.
    for coding, body in answers:
        if body is not None:
            not_revealed(body, secret, f"an answer tessera gave the client (Content-Encoding {coding})")
    if failure:
        raise failure
    assert len(calls) == 1, f"the upstream logged {len(calls)} tools/call answers"
    assert calls[0]["content_encoding"] == "gzip", "the upstream did not compress: the decoding was not exercised"
    assert answers and all(c is None for c, _ in answers), f"tessera's answers carried Content-Encoding {[c for c, _ in answers]}"


async def main():
    await check("python-sdk-2 auto: discovers 2026-07-28 on fastmcp, tools and progress", modern)
    await check("python-sdk-2 auto: falls back to initialize on server-everything", legacy)
    await check("python-sdk-2: tools/call over the 2024-11-05 HTTP+SSE transport (sse_client)", legacy_sse)
    await check("python-sdk-2 auto (2026-07-28): a denied and a held call are tool errors the model reads", refused)
    await check(
        lambda: f"python-sdk-2 auto: echo_headers on the gzip server comes back decoded and redacted (upstream answer: {gzip_upstream})",
        gzip,
    )


asyncio.run(main())

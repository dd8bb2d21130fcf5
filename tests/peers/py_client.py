"""The Python SDK `mcp` 2.x client in its default `auto` mode through
tessera: it probes server/discover, settles on 2026-07-28 with the fastmcp
upstream and falls back to the initialize handshake with server-everything
(2025-11-25 only). The caller's token goes in the httpx2.AsyncClient the
streamable HTTP client is given.

Environment: PEERS_FASTMCP_URL, PEERS_EVERYTHING_URL, PEERS_CALLER_TOKEN,
PEERS_STORED_SECRET (the fastmcp credential), PEERS_FASTMCP_LOG.
Prints `ok NAME` or `FAIL NAME: why` per check, like report.mjs.
"""

import asyncio
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
    try:
        await fn()
        print(f"ok {name}", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is reported
        why = "".join(traceback.format_exception_only(e)).strip().replace("\n", " | ")
        print(f"FAIL {name}: {why}", flush=True)


def client(url, http):
    return Client(streamable_http_client(url, http_client=http))


def upstream_log():
    with open(os.environ["PEERS_FASTMCP_LOG"]) as f:
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


async def legacy():
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {caller}"}) as http:
        async with client(os.environ["PEERS_EVERYTHING_URL"], http) as c:
            v = c.session.protocol_version
            assert v == "2025-11-25", f"negotiated {v}"
            r = await c.call_tool("echo", {"message": "from python"})
            assert "from python" in str(r.content), r


async def main():
    await check("python-sdk-2 auto: discovers 2026-07-28 on fastmcp, tools and progress", modern)
    await check("python-sdk-2 auto: falls back to initialize on server-everything", legacy)


asyncio.run(main())

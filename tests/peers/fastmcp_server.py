"""An upstream MCP server built with fastmcp (PyPI): it requires a bearer
token (StaticTokenVerifier), so a request without the stored credential is
answered 401 with a WWW-Authenticate challenge, and it answers both the
2025-11-25 initialize handshake and the stateless 2026-07-28 revision.

Its `seen_headers` tool appends the request headers it received to LOG
(one JSON object per line) and returns them, so the test can show what
crossed tessera; `count` reports progress as it goes; `delete_note` and
`write_note` log that they ran (tessera's policy must keep them from it).

Usage: fastmcp_server.py PORT TOKEN LOG
"""

import asyncio
import json
import sys

from fastmcp import Context, FastMCP
from fastmcp.server.auth.providers.jwt import StaticTokenVerifier
from fastmcp.server.dependencies import get_http_headers

port, token, log = int(sys.argv[1]), sys.argv[2], sys.argv[3]
mcp = FastMCP(
    "tessera-peers-fastmcp",
    auth=StaticTokenVerifier(tokens={token: {"client_id": "tessera", "scopes": []}}),
)


@mcp.tool
def seen_headers() -> dict[str, str]:
    """The HTTP request headers this call arrived with."""
    headers = get_http_headers(include_all=True)
    with open(log, "a") as f:
        f.write(json.dumps(headers) + "\n")
    return headers


@mcp.tool
async def count(to: int, ctx: Context) -> str:
    """Count to `to`, reporting progress after each step."""
    for i in range(1, to + 1):
        await ctx.report_progress(i, to)
        await asyncio.sleep(0.05)
    return f"counted to {to}"


@mcp.tool
def add(a: int, b: int) -> int:
    """a + b"""
    return a + b


# tessera's peers policy forbids delete_note and holds write_note for a
# person (tests/peers/run.sh): neither may ever run.
@mcp.tool
def delete_note(name: str) -> str:
    """Delete a note."""
    with open(log, "a") as f:
        f.write(json.dumps({"ran": "delete_note"}) + "\n")
    return f"deleted {name}"


@mcp.tool
def write_note(text: str) -> str:
    """Write a note."""
    with open(log, "a") as f:
        f.write(json.dumps({"ran": "write_note"}) + "\n")
    return "written"


mcp.run(transport="http", host="127.0.0.1", port=port, show_banner=False)

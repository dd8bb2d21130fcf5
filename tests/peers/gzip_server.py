"""An upstream MCP server built on the official Python SDK (`mcp`, its
MCPServer and its own Starlette app) behind Starlette's GZipMiddleware,
as a security review found one leaking the stored secret past a byte
redactor: the answer was gzip and the secret was inside the stream.

It compresses every answer whatever the request asked for: the
middleware runs with minimum_size=0 and no excluded content types (by
default it leaves text/event-stream alone; here the SSE answers are gzip
too, flushed per event), and a wrapper in front of it rewrites the
request's Accept-Encoding to `gzip`. tessera asks upstreams for
`identity`; this models one that ignores that, so what is exercised is
tessera's decoding, not only its request.

It requires `Authorization: Bearer TOKEN` (401 otherwise). Its
`echo_headers` tool returns the request's headers, Authorization
included, as JSON text, as a debugging tool would. Each answer is logged
to LOG (one JSON object per line): the JSON-RPC method, the
Accept-Encoding the request really carried, and the answer's status,
Content-Type and Content-Encoding, so the test can show the path was
exercised. It listens on 127.0.0.1 and needs no network.

Usage: gzip_server.py PORT TOKEN LOG
"""

import json
import sys

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from starlette.middleware.gzip import GZipMiddleware

port, token, log = int(sys.argv[1]), sys.argv[2], sys.argv[3]
mcp = MCPServer("tessera-peers-gzip")


@mcp.tool(structured_output=False)
def echo_headers(ctx: Context) -> str:
    """The HTTP request headers this call arrived with, as JSON."""
    return json.dumps(dict(ctx.headers or {}))


def header(scope, name):
    for k, v in scope["headers"]:
        if k.decode("latin-1").lower() == name:
            return v.decode("latin-1")
    return None


class ForceGzip:
    """Outermost: checks the bearer token, makes GZipMiddleware see
    `Accept-Encoding: gzip` whatever the client sent, and logs what went
    out."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if header(scope, "authorization") != f"Bearer {token}":
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"www-authenticate", b"Bearer"), (b"content-length", b"0")]})
            return await send({"type": "http.response.body", "body": b""})
        asked = header(scope, "accept-encoding")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"accept-encoding"]
        scope = {**scope, "headers": [*headers, (b"accept-encoding", b"gzip")]}
        body = bytearray()

        async def recv():
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
            return message

        async def snd(message):
            if message["type"] == "http.response.start":
                try:
                    method = json.loads(body).get("method")
                except (ValueError, AttributeError):
                    method = None
                h = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message.get("headers", [])}
                with open(log, "a") as f:
                    f.write(json.dumps({
                        "http": scope["method"],
                        "method": method,
                        "accept_encoding": asked,
                        "status": message["status"],
                        "content_type": h.get("content-type"),
                        "content_encoding": h.get("content-encoding"),
                    }) + "\n")
            await send(message)

        await self.app(scope, recv, snd)


app = ForceGzip(GZipMiddleware(mcp.streamable_http_app(), minimum_size=0, exclude_content_types=()))
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")

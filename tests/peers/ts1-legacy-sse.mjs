// The TypeScript SDK 1.x `SSEClientTransport` (the 2024-11-05 HTTP+SSE
// transport: a GET stream whose `endpoint` event names the POST URL)
// talking to server-everything's `sse` mode through tessera.
// Environment: PEERS_URL (the tessera connection, ending in /sse),
// PEERS_CALLER_TOKEN, PEERS_STORED_SECRET, PEERS_SSE_LOG (what the
// upstream received).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { SSEClientTransport } from "@modelcontextprotocol/sdk/client/sse.js";
import { check, expect, env, upstreamLog } from "./report.mjs";

const url = new URL(env("PEERS_URL"));
const caller = env("PEERS_CALLER_TOKEN");
const stored = env("PEERS_STORED_SECRET");
const auth = { Authorization: `Bearer ${caller}` };
const address = url.pathname.replace(/\/sse$/, "");

const transport = new SSEClientTransport(url, { requestInit: { headers: auth } });
const client = new Client({ name: "tessera-peers-legacy-sse", version: "1.0.0" });

await check("legacy sse: the announced endpoint is rewritten under the connection's address", async () => {
  await client.connect(transport);
  const endpoint = transport._endpoint;
  expect(endpoint.origin === url.origin, `endpoint ${endpoint}`);
  expect(endpoint.pathname.startsWith(`${address}/~sse/`), `endpoint ${endpoint.pathname}`);
  expect(endpoint.pathname.endsWith("/message"), `endpoint ${endpoint.pathname}`);
  expect(endpoint.searchParams.get("sessionId"), `endpoint ${endpoint}`);
});

await check("legacy sse: tools/list answered on the stream", async () => {
  const { tools } = await client.listTools();
  expect(tools.some((t) => t.name === "echo"), JSON.stringify(tools.map((t) => t.name)));
});

await check("legacy sse: tools/call get-sum answered on the stream", async () => {
  const r = await client.callTool({ name: "get-sum", arguments: { a: 40, b: 2 } });
  expect(JSON.stringify(r.content).includes("The sum of 40 and 2 is 42"), JSON.stringify(r));
});

await check("legacy sse: the upstream saw the stored credential on the stream and on every POST to its /message", async () => {
  const log = upstreamLog(env("PEERS_SSE_LOG"));
  const gets = log.filter((r) => r.method === "GET" && r.path === "/sse");
  const posts = log.filter((r) => r.method === "POST" && r.path.startsWith("/message?sessionId="));
  expect(gets.length >= 1 && posts.length >= 3, JSON.stringify(log));
  expect(log.every((r) => r.authorization === `Bearer ${stored}`), JSON.stringify(log));
});

await check("legacy sse: another caller's endpoint (a forged tag) is an unknown address", async () => {
  expect(transport._endpoint?.pathname.includes("/~sse/"), `endpoint ${transport._endpoint}`);
  const forged = new URL(transport._endpoint);
  forged.pathname = forged.pathname.replace(/\/~sse\/[^/]+\//, "/~sse/AAAAAAAAAAAAAAAAAAAAAA/");
  const r = await fetch(forged, {
    method: "POST",
    headers: { ...auth, "Content-Type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: 9, method: "ping" }),
  });
  expect(r.status === 404, `status ${r.status}`);
  const walk = new URL(transport._endpoint);
  walk.search = "sessionId=another";
  const r2 = await fetch(walk, {
    method: "POST",
    headers: { ...auth, "Content-Type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: 9, method: "ping" }),
  });
  expect(r2.status === 404, `another session: status ${r2.status}`);
});

await client.close();

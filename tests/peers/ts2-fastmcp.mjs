// The TypeScript SDK 2.x client (`@modelcontextprotocol/client`) in
// version-negotiation `auto` mode talking to the fastmcp upstream through
// tessera: it probes server/discover and settles on 2026-07-28 (no
// session, `_meta` on every request, Mcp-Method/Mcp-Name headers).
// Environment: PEERS_URL, PEERS_CALLER_TOKEN, PEERS_STORED_SECRET,
// PEERS_FASTMCP_LOG (the headers the upstream's seen_headers tool got).
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { check, expect, env, upstreamLog } from "./report.mjs";

const url = new URL(env("PEERS_URL"));
const caller = env("PEERS_CALLER_TOKEN");
const stored = env("PEERS_STORED_SECRET");

const transport = new StreamableHTTPClientTransport(url, {
  requestInit: { headers: { Authorization: `Bearer ${caller}` } },
});
const client = new Client(
  { name: "tessera-peers-ts2", version: "1.0.0" },
  { versionNegotiation: { mode: "auto" } },
);

await check("ts-sdk-2 auto: negotiates 2026-07-28 through tessera", async () => {
  await client.connect(transport);
  const v = client.getNegotiatedProtocolVersion();
  expect(v === "2026-07-28", `negotiated ${v}`);
});

await check("ts-sdk-2 auto: tools/call", async () => {
  const r = await client.callTool({ name: "add", arguments: { a: 40, b: 2 } });
  expect(JSON.stringify(r.content).includes("42"), JSON.stringify(r));
  expect(r.resultType === undefined || r.resultType === "complete", `resultType ${r.resultType}`);
});

await check("ts-sdk-2 auto: progress notifications arrive as they happen", async () => {
  const seen = [];
  const start = performance.now();
  const r = await client.callTool({ name: "count", arguments: { to: 10 } }, {
    onprogress: (p) => seen.push(performance.now() - start),
  });
  const done = performance.now() - start;
  expect(JSON.stringify(r.content).includes("counted to 10"), JSON.stringify(r));
  expect(seen.length === 10, `expected 10 progress notifications, got ${seen.length}`);
  // 50 ms apart upstream: buffered, they would all land with the result.
  expect(done - seen[0] > 300, `first progress at ${seen[0]} ms, result at ${done} ms`);
});

await check("ts-sdk-2 auto: Mcp-Method and Mcp-Name reach the upstream with the stored credential", async () => {
  const before = upstreamLog(env("PEERS_FASTMCP_LOG")).length;
  const r = await client.callTool({ name: "seen_headers", arguments: {} });
  // tessera redacts its stored secret from answers, even when the
  // upstream echoes it back.
  expect(!JSON.stringify(r).includes(stored), "the stored secret came back to the caller");
  const h = upstreamLog(env("PEERS_FASTMCP_LOG"))[before];
  expect(h, "the upstream recorded nothing");
  expect(h["mcp-method"] === "tools/call", `mcp-method ${h["mcp-method"]}`);
  expect(h["mcp-name"] === "seen_headers", `mcp-name ${h["mcp-name"]}`);
  expect(h["mcp-protocol-version"] === "2026-07-28", `mcp-protocol-version ${h["mcp-protocol-version"]}`);
  expect(h.authorization === `Bearer ${stored}`, "the upstream did not get the stored credential");
  expect(!JSON.stringify(h).includes(caller), "the caller's token reached the upstream");
  expect(!h["mcp-session-id"], "a session id on the stateless revision");
});

await check("ts-sdk-2 auto (2026-07-28): a denied and a held call are tool errors the model reads", async () => {
  // tessera writes these results itself; without resultType the 2.x client
  // throws them away and the model never reads the refusal.
  const denied = await client.callTool({ name: "delete_note", arguments: { name: "n" } });
  expect(denied.isError === true, JSON.stringify(denied));
  expect(JSON.stringify(denied.content).includes("refused"), JSON.stringify(denied));
  const held = await client.callTool({ name: "write_note", arguments: { text: "t" } });
  expect(held.isError === true, JSON.stringify(held));
  expect(JSON.stringify(held.content).includes("approval"), JSON.stringify(held));
  const ran = upstreamLog(env("PEERS_FASTMCP_LOG")).filter((e) => e.ran);
  expect(ran.length === 0, `the upstream ran ${JSON.stringify(ran)}`);
});

await client.close();

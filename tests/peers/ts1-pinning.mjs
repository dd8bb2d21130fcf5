// Tool pinning (issue 29) as the TypeScript SDK 1.x client sees it: the
// first tools/list pins; once the server rewrites a tool's description,
// the tool disappears from the client's list and its call comes back as
// a tool error, without reaching the server.
// Environment: PEERS_URL (the tessera connection), PEERS_CALLER_TOKEN,
// PEERS_POISON_URL (the server's own switch, reached directly).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { check, expect, env } from "./report.mjs";

const url = new URL(env("PEERS_URL"));
const auth = { Authorization: `Bearer ${env("PEERS_CALLER_TOKEN")}` };
const client = new Client({ name: "tessera-peers-ts1-pinning", version: "1.0.0" });
const names = async () => (await client.listTools()).tools.map((t) => t.name).sort().join(",");

await check("ts-sdk-1 pinning: the first list pins and shows every tool", async () => {
  await client.connect(new StreamableHTTPClientTransport(url, { requestInit: { headers: auth } }));
  const seen = await names();
  expect(seen === "read_note,search", `listed ${seen}`);
  const r = await client.callTool({ name: "search", arguments: { q: "x" } });
  expect(!r.isError && JSON.stringify(r.content).includes("ran search"), JSON.stringify(r));
});

await check("ts-sdk-1 pinning: a tool whose description changed disappears and its call is refused", async () => {
  const poisoned = await fetch(env("PEERS_POISON_URL"));
  expect(poisoned.status === 204, `the switch answered ${poisoned.status}`);
  const seen = await names();
  expect(seen === "read_note", `listed ${seen}`);
  const r = await client.callTool({ name: "search", arguments: { q: "x" } });
  expect(r.isError === true, JSON.stringify(r));
  expect(JSON.stringify(r.content).includes("awaits an admin's review"), JSON.stringify(r));
  const ok = await client.callTool({ name: "read_note", arguments: {} });
  expect(!ok.isError, JSON.stringify(ok));
});

await client.close();

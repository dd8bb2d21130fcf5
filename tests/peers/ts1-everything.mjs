// The TypeScript SDK 1.x client (2025-11-25: initialize, Mcp-Session-Id,
// the GET stream, DELETE) talking to server-everything through tessera.
// Environment: PEERS_URL (the tessera connection), PEERS_CALLER_TOKEN,
// PEERS_STORED_SECRET (the credential tessera holds), PEERS_UPSTREAM_LOG.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { LoggingMessageNotificationSchema } from "@modelcontextprotocol/sdk/types.js";
import { check, expect, env, upstreamLog } from "./report.mjs";

const url = new URL(env("PEERS_URL"));
const caller = env("PEERS_CALLER_TOKEN");
const stored = env("PEERS_STORED_SECRET");
const auth = { Authorization: `Bearer ${caller}` };

const transport = new StreamableHTTPClientTransport(url, { requestInit: { headers: auth } });
const client = new Client({ name: "tessera-peers-ts1", version: "1.0.0" });
let logged;
const firstLog = new Promise((resolve) => (logged = resolve));
client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => logged(n.params));

// tessera binds the upstream's session id to the caller: the client sees
// `<upstream id>.<tag>`, the upstream its own id.
const upstreamSession = (sid) => sid.slice(0, sid.lastIndexOf("."));

await check("ts-sdk-1: initialize opens a session through tessera", async () => {
  await client.connect(transport);
  expect(transport.sessionId, "no Mcp-Session-Id came back");
  const seen = upstreamLog(env("PEERS_UPSTREAM_LOG")).map((r) => r.session);
  expect(!seen.includes(transport.sessionId), "the upstream saw the caller's bound session id");
  expect(seen.includes(upstreamSession(transport.sessionId)), "the upstream never saw its own session id");
  expect(transport.protocolVersion === "2025-11-25", `negotiated ${transport.protocolVersion}`);
});

await check("ts-sdk-1: tools/call echo", async () => {
  const r = await client.callTool({ name: "echo", arguments: { message: "through tessera" } });
  expect(JSON.stringify(r.content).includes("through tessera"), JSON.stringify(r));
});

await check("ts-sdk-1: progress notifications arrive as they happen", async () => {
  const seen = [];
  const start = performance.now();
  const r = await client.callTool(
    { name: "trigger-long-running-operation", arguments: { duration: 2, steps: 4 } },
    undefined,
    { onprogress: (p) => seen.push({ at: performance.now() - start, progress: p.progress }) },
  );
  const done = performance.now() - start;
  expect(JSON.stringify(r.content).includes("completed"), JSON.stringify(r));
  expect(seen.length === 4, `expected 4 progress notifications, got ${seen.length}`);
  // Steps are 0.5 s apart: a buffered answer would deliver all of them
  // together with the result.
  expect(done - seen[0].at > 1000, `first progress at ${seen[0].at} ms, result at ${done} ms`);
});

await check("ts-sdk-1: a server notification arrives on the GET stream", async () => {
  await client.callTool({ name: "toggle-simulated-logging", arguments: {} });
  await Promise.race([
    firstLog,
    new Promise((_, reject) => setTimeout(() => reject(new Error("no log message in 5 s")), 5000).unref()),
  ]);
  await client.callTool({ name: "toggle-simulated-logging", arguments: {} });
  const gets = upstreamLog(env("PEERS_UPSTREAM_LOG")).filter(
    (r) => r.method === "GET" && r.session === upstreamSession(transport.sessionId),
  );
  expect(gets.length > 0, "the upstream never saw the GET stream");
});

await check("ts-sdk-1: a broken stream resumes with Last-Event-ID", async () => {
  const headers = {
    ...auth,
    "Content-Type": "application/json",
    Accept: "application/json, text/event-stream",
    "Mcp-Session-Id": transport.sessionId,
    "MCP-Protocol-Version": transport.protocolVersion,
  };
  const abort = new AbortController();
  const post = await fetch(url, {
    method: "POST",
    headers,
    signal: abort.signal,
    body: JSON.stringify({
      jsonrpc: "2.0",
      id: 9001,
      method: "tools/call",
      params: {
        name: "trigger-long-running-operation",
        arguments: { duration: 0.6, steps: 3 },
        _meta: { progressToken: "resume-me" },
      },
    }),
  });
  expect(post.status === 200, `POST answered ${post.status}`);
  // Read up to the first progress event, remember its id, then drop the
  // connection as a flaky network would, for a second: long enough for
  // the rest of the operation (0.6 s) to happen while the client is away.
  // (server-everything 2026.8.31 replays only what its event store held
  // when the GET arrived: its replayEventsAfter returns an event id where
  // the SDK expects a stream id, so later events go nowhere.)
  let lastId;
  const seen = [];
  for await (const ev of sse(post.body)) {
    if (ev.id) lastId = ev.id;
    if (ev.data.includes("notifications/progress")) {
      seen.push(JSON.parse(ev.data).params.progress);
      break;
    }
  }
  abort.abort();
  expect(lastId, "no event id before the break");
  await new Promise((r) => setTimeout(r, 1000));
  const get = await fetch(url, {
    headers: { ...headers, "Last-Event-ID": lastId },
    signal: AbortSignal.timeout(10000),
  });
  expect(get.status === 200, `GET with Last-Event-ID answered ${get.status}`);
  let result;
  for await (const ev of sse(get.body)) {
    const msg = ev.data && JSON.parse(ev.data);
    if (msg?.method === "notifications/progress") seen.push(msg.params.progress);
    if (msg?.id === 9001) {
      result = msg;
      break;
    }
  }
  expect(seen.join() === "1,2,3", `progress seen across the break: ${seen}`);
  expect(JSON.stringify(result?.result).includes("completed"), `replay gave ${JSON.stringify(result)}`);
  const replay = upstreamLog(env("PEERS_UPSTREAM_LOG")).find((r) => r.lastEventId === lastId);
  expect(replay, "the upstream never saw the Last-Event-ID");
});

await check("ts-sdk-1: DELETE ends the session upstream", async () => {
  const sid = transport.sessionId;
  await transport.terminateSession();
  const dels = upstreamLog(env("PEERS_UPSTREAM_LOG")).filter(
    (r) => r.method === "DELETE" && r.session === upstreamSession(sid),
  );
  expect(dels.length === 1, `upstream saw ${dels.length} DELETEs`);
  // The ended session is gone upstream (server-everything answers 400).
  const r = await fetch(url, {
    method: "POST",
    headers: {
      ...auth,
      "Content-Type": "application/json",
      Accept: "application/json, text/event-stream",
      "Mcp-Session-Id": sid,
      "MCP-Protocol-Version": "2025-11-25",
    },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list" }),
  });
  expect(r.status === 400 || r.status === 404, `a request on the ended session answered ${r.status}`);
  await client.close();
});

await check("ts-sdk-1: the upstream saw the stored credential on every request, never the caller's token", async () => {
  const log = upstreamLog(env("PEERS_UPSTREAM_LOG"));
  expect(log.length >= 8, `only ${log.length} requests recorded`);
  for (const r of log) {
    expect(r.authorization === `Bearer ${stored}`, `${r.method} ${r.path} carried ${r.authorization === null ? "no Authorization" : "another Authorization"}`);
    expect(!JSON.stringify(r).includes(caller), "the caller's token reached the upstream");
  }
});

// Server-sent events from a fetch body: yields {id, event, data}.
async function* sse(body) {
  const decoder = new TextDecoder();
  let buf = "";
  for await (const chunk of body) {
    buf += decoder.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const ev = { data: "" };
      for (const line of block.split("\n")) {
        const [k, ...v] = line.split(":");
        const val = v.join(":").replace(/^ /, "");
        if (k === "id") ev.id = val;
        else if (k === "event") ev.event = val;
        else if (k === "data") ev.data += val;
      }
      yield ev;
    }
  }
}

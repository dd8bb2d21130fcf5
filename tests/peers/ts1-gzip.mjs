// The TypeScript SDK 1.x client (2025-11-25, a session; the tool's answer
// comes as an SSE stream) calling `echo_headers` on gzip_server.py through
// tessera. Its fetch is Node's own (undici), left to send its default
// Accept-Encoding and to decode whatever coding comes back, as an agent's
// would: a gzip answer tessera passed on unread would be gunzipped here,
// secret and all. The upstream gzips every answer whatever it is asked.
// Environment: PEERS_URL, PEERS_CALLER_TOKEN, PEERS_STORED_SECRET (the
// gzip server's credential), PEERS_GZIP_LOG (what that server answered).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { check, expect, env, upstreamLog } from "./report.mjs";

const MARKER = "[redacted-by-tessera]";
const url = new URL(env("PEERS_URL"));
const caller = env("PEERS_CALLER_TOKEN");
const stored = env("PEERS_STORED_SECRET");

// Every answer tessera gave this client: its Content-Encoding and its
// body as fetch decoded it (read from a clone, as the SDK reads it).
const answers = [];
const transport = new StreamableHTTPClientTransport(url, {
  requestInit: { headers: { Authorization: `Bearer ${caller}` } },
  fetch: async (u, init) => {
    const r = await fetch(u, init);
    const answer = { coding: r.headers.get("content-encoding"), text: "" };
    answers.push(answer);
    if (r.body) {
      const copy = r.clone();
      answer.done = (async () => {
        const decoder = new TextDecoder();
        for await (const chunk of copy.body) answer.text += decoder.decode(chunk, { stream: true });
      })().catch(() => {}); // the GET stream ends in an abort
    }
    return r;
  },
});
const client = new Client({ name: "tessera-peers-ts1-gzip", version: "1.0.0" });

// The upstream's own account of the tools/call answer (gzip_server.py's log).
let upstream = "not seen";

async function echo() {
  await client.connect(transport);
  const r = await client.callTool({ name: "echo_headers", arguments: {} });
  expect(!r.isError, `the call failed: ${JSON.stringify(r)}`);
  const text = r.content?.[0]?.text;
  expect(typeof text === "string", `no text content: ${JSON.stringify(r)}`);
  expect(text.includes(MARKER), `no ${MARKER} in the echo (did it happen?): ${text}`);
  const echoed = JSON.parse(text);
  const auth = echoed.authorization ?? "";
  expect(
    auth.startsWith(`Bearer ${MARKER}`) && auth.length === `Bearer ${stored}`.length,
    `the echoed Authorization is ${JSON.stringify(auth)}`,
  );
  notRevealed(text, stored, "the result text");
  notRevealed(Object.values(echoed).join("\n"), stored, "the result text decoded as JSON");
  notRevealed(JSON.stringify(r), stored, "the whole result");
  expect(!text.includes(caller), "the caller's token reached the upstream");
}

await check(
  () => `ts-sdk-1: echo_headers on the gzip server comes back decoded and redacted (upstream answer: ${upstream})`,
  async () => {
    const before = upstreamLog(env("PEERS_GZIP_LOG")).length;
    let failure;
    try {
      await echo();
    } catch (e) {
      failure = e;
    }
    await client.close(); // ends the GET stream, whatever happened
    const calls = upstreamLog(env("PEERS_GZIP_LOG")).slice(before).filter((e) => e.method === "tools/call");
    upstream = calls
      .map((e) => `${e.content_type} with Content-Encoding ${e.content_encoding}, asked for ${e.accept_encoding}`)
      .join("; ");
    // Whatever the SDK made of them, no answer held the secret.
    await Promise.all(answers.map((a) => Promise.race([a.done, new Promise((r) => setTimeout(r, 500))])));
    for (const a of answers) {
      notRevealed(a.text, stored, `an answer tessera gave the client (Content-Encoding ${a.coding})`);
    }
    if (failure) throw failure;
    expect(calls.length === 1, `the upstream logged ${calls.length} tools/call answers`);
    expect(calls[0].content_encoding === "gzip", "the upstream did not compress: the decoding was not exercised");
    expect(
      answers.length > 0 && answers.every((a) => a.coding === null),
      `tessera's answers carried Content-Encoding ${JSON.stringify(answers.map((a) => a.coding))}`,
    );
  },
);

// The secret in none of the forms a client could decode: itself, its
// base64 (standard; of its longest prefix of whole 3-byte groups, so that
// what follows it cannot change the text) and its hex.
function notRevealed(text, secret, where) {
  const b64 = (s) => Buffer.from(s.slice(0, s.length - (s.length % 3))).toString("base64");
  const forms = {
    plain: secret,
    base64: b64(secret),
    "base64 of the header": b64(`Bearer ${secret}`),
    hex: Buffer.from(secret).toString("hex"),
    "upper-case hex": Buffer.from(secret).toString("hex").toUpperCase(),
  };
  for (const [form, s] of Object.entries(forms)) {
    expect(!text.includes(s), `the stored secret (${form}) is in ${where}`);
  }
}

// A real MCP client (TypeScript SDK 1.x) for the conformance suite's client
// scenarios, run by conformance-client.sh against a tessera connection URL
// with the caller's token in PEERS_CALLER_TOKEN. It does what an agent
// would for each scenario and leaves the judging to the runner.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const scenario = process.env.MCP_CONFORMANCE_SCENARIO;
const transport = new StreamableHTTPClientTransport(new URL(process.argv[2]), {
  requestInit: { headers: { Authorization: `Bearer ${process.env.PEERS_CALLER_TOKEN}` } },
});
const client = new Client({ name: "tessera-peers-conformance", version: "1.0.0" });
await client.connect(transport);
const { tools } = await client.listTools();
if (scenario === "tools_call") {
  await client.callTool({ name: "add_numbers", arguments: { a: 5, b: 3 } });
} else if (scenario === "sse-retry") {
  // The server closes the POST stream before answering; the SDK reconnects
  // with GET and Last-Event-ID after the `retry:` delay it was given.
  const r = await client.callTool({ name: tools[0].name, arguments: {} });
  if (!JSON.stringify(r).includes("Reconnection test completed")) throw new Error(JSON.stringify(r));
} else if (scenario !== "initialize") {
  throw new Error(`no client behaviour for scenario ${scenario}`);
}
await client.close();

// Preloaded into server-everything (`node --import ./loopback.mjs`), which
// would otherwise listen on every interface: every server it starts binds
// 127.0.0.1. It also writes one JSON line per request it receives (method,
// path, Authorization, Mcp-Session-Id, Last-Event-ID) to $PEERS_UPSTREAM_LOG,
// so the test can show what crossed tessera. The server itself is unchanged.
import { appendFileSync } from "node:fs";
import net from "node:net";
import http from "node:http";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number" || typeof args[0] === "string") {
    const port = Number(args[0]);
    const cb = args.find((a) => typeof a === "function");
    return listen.call(this, { port, host: "127.0.0.1" }, cb);
  }
  if (args[0] && typeof args[0] === "object" && !("path" in args[0])) {
    args[0] = { ...args[0], host: "127.0.0.1" };
  }
  return listen.apply(this, args);
};

const log = process.env.PEERS_UPSTREAM_LOG;
if (log) {
  const emit = http.Server.prototype.emit;
  http.Server.prototype.emit = function (event, req, ...rest) {
    if (event === "request") {
      const h = req.headers;
      appendFileSync(
        log,
        JSON.stringify({
          method: req.method,
          path: req.url,
          authorization: h.authorization ?? null,
          session: h["mcp-session-id"] ?? null,
          lastEventId: h["last-event-id"] ?? null,
        }) + "\n",
      );
    }
    return emit.call(this, event, req, ...rest);
  };
}

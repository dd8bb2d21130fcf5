// Preloaded into the conformance runner (`node --import ./caller-auth.mjs`),
// which has no option for extra headers: every HTTP request it makes to
// tessera ($PEERS_TESSERA_ORIGIN) carries the caller's token
// ($PEERS_CALLER_TOKEN), as a configured agent's client would. It installs
// undici's global dispatcher, which both Node's fetch (the SDK client) and
// undici.request (the DNS-rebinding scenario) use; requests elsewhere and
// every other header are left as they are.
import { Agent, setGlobalDispatcher } from "undici";

const origin = new URL(process.env.PEERS_TESSERA_ORIGIN).origin;
const value = `Bearer ${process.env.PEERS_CALLER_TOKEN}`;

function withAuth(headers) {
  if (Array.isArray(headers)) return [...headers, "authorization", value];
  return { ...(headers ?? {}), authorization: value };
}

setGlobalDispatcher(
  new Agent().compose((dispatch) => (opts, handler) => {
    const target = new URL(opts.path, opts.origin).origin;
    return dispatch(target === origin ? { ...opts, headers: withAuth(opts.headers) } : opts, handler);
  }),
);

// One line per check for run.sh to count: `ok NAME` or `FAIL NAME: why`.
// NAME may be a function, called once the check has run (a name that
// records what the check saw).
export async function check(name, fn) {
  const label = () => (typeof name === "function" ? name() : name);
  try {
    await fn();
    console.log(`ok ${label()}`);
  } catch (e) {
    console.log(`FAIL ${label()}: ${e?.stack ?? e}`.replaceAll("\n", " | "));
  }
}

export function expect(cond, why) {
  if (!cond) throw new Error(why);
}

export function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
}

// The requests the upstream recorded (one JSON object per line).
import { readFileSync } from "node:fs";
export function upstreamLog(path) {
  return readFileSync(path, "utf8")
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l));
}

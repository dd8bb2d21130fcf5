#!/usr/bin/env python3
"""tessera against nginx doing the same job, next to a direct connection.

Run through bench/run.sh, which installs the tools, builds in release mode
and raises the fd limit. This script starts the processes, pins them, runs
the arms interleaved, and prints one table (and writes BENCHMARKS.md).

Pinning on a 2-core machine: the load clients and the upstream on core 0,
the proxy under test (tessera with one runtime worker, nginx with one
worker process) on core 1.
"""

import argparse
import datetime
import json
import os
import platform
import re
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where cargo put the builds: CARGO_TARGET_DIR if set, as cargo reads it.
REL = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "release")
TESSERA = os.path.join(REL, "tessera")
# The benchmark's upstream runs on loopback: tessera refuses internal
# upstreams unless allowed (binaries older than that ignore the variable).
os.environ["TESSERA_ALLOW_PRIVATE_UPSTREAMS"] = "true"
# No ops listener: its fixed port would collide between arms and runs (it
# serves no request of the benchmark's; older builds ignore the variable).
os.environ["TESSERA_OPS_LISTEN"] = "off"
# One caller drives the whole load (saturation, 10,000 streams): the
# per-caller limits, which are about many callers sharing a tessera, are
# off here; nginx has none either.
os.environ["TESSERA_CALLER_RATE"] = "0"
os.environ["TESSERA_CALLER_MAX_IN_FLIGHT"] = "0"
UPSTREAM = os.path.join(REL, "examples", "bench-upstream")
SSE = os.path.join(REL, "examples", "bench-sse")
RELAY = os.path.join(REL, "examples", "bench-relay")
CLIENT_CORE, PROXY_CORE = "0", "1"

# A realistic tools/call: a tool with a few arguments (330 bytes).
BODY = (
    '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"update_issue",'
    '"arguments":{"owner":"acme","repo":"widgets","issue_number":42,"labels":["bug","triage"],'
    '"body":"Steps to reproduce:\\n1. open the app\\n2. click save\\nExpected: saved. Actual: error 500."},'
    '"_meta":{"progressToken":"p-7","io.modelcontextprotocol/protocolVersion":"2025-11-25"}}}'
)
# The revision poll (its columns have changed over time; the table has not).
POLL_STATEMENT = "FROM revision"
AUDIT_STATEMENT = "INSERT INTO audit"

procs = []


def die(msg):
    print(f"bench: {msg}", file=sys.stderr)
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, what, proc, deadline_s=15):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            die(f"{what} exited with {proc.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    die(f"{what} did not listen on {port} within {deadline_s}s")


def start(cmd, core, **kw):
    p = subprocess.Popen(["taskset", "-c", core] + cmd, **kw)
    procs.append(p)
    return p


def stop_all():
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()


def run(cmd, core=CLIENT_CORE, env=None, timeout=600):
    r = subprocess.run(["taskset", "-c", core] + cmd, capture_output=True, text=True,
                       env=env, timeout=timeout)
    if r.returncode != 0:
        die(f"{' '.join(cmd[:2])} failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    return r.stdout


def cli(data_dir, *args, env_extra=None, binary=None):
    env = dict(os.environ, TESSERA_DATA_DIR=data_dir, **(env_extra or {}))
    r = subprocess.run([binary or TESSERA, *args], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        die(f"tessera {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout.strip().splitlines()[-1]


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except OSError:
                pass
    return out


def cpu_ticks(pids):
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total


def thread_cpu_ns(pids):
    """CPU nanoseconds by thread name (schedstat's first field), summed."""
    out = {}
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    name = f.read().strip()
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    ns = int(f.read().split()[0])
            except OSError:
                continue  # the thread ended meanwhile
            out[name] = out.get(name, 0) + ns
    return out


def db_thread(name):
    """A thread that writes the database: tessera's audit writer, or (in
    builds before it) sqlx's SQLite workers, which did the audit's inserts."""
    return name.startswith("tessera-audit") or name.startswith("sqlx-sqlite")


def rss_kib(pids):
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def post(url, auth):
    req = urllib.request.Request(url, data=BODY.encode(), method="POST", headers={
        "Authorization": auth, "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, {k.lower() for k in r.headers.keys()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower() for k in e.headers.keys()}, e.read()


class Arm:
    def __init__(self, name, url, auth, pids):
        self.name, self.url, self.auth, self.pids = name, url, auth, pids
        self.token = auth.split(" ", 1)[1]


def check_arm(arm, is_proxy):
    """The arm does the job: the upstream answers 200 only to the injected
    credential, and a proxy hides its Set-Cookie and WWW-Authenticate."""
    status, headers, _ = post(arm.url, arm.auth)
    if status != 200:
        die(f"{arm.name}: a valid request got {status}")
    if is_proxy:
        leaked = headers & {"set-cookie", "www-authenticate"}
        if leaked:
            die(f"{arm.name}: passed {leaked} back to the caller")
        status, _, _ = post(arm.url, "Bearer wrong-token")
        # tessera answers 403 (a 401 would send MCP clients into OAuth);
        # the nginx arm's configuration answers 401.
        if status not in (401, 403):
            die(f"{arm.name}: a wrong caller token got {status}, not 401/403")


def wrk(arm, lua, duration, conns):
    """Requests/s, CPU seconds per 1,000 requests, requests, p99 (ms), and
    the CPU µs per request of the database threads and of all the others."""
    env = dict(os.environ, AUTH=arm.auth)
    before, threads_before = cpu_ticks(arm.pids), thread_cpu_ns(arm.pids)
    out = run(["wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--latency", "-s", lua, arm.url],
              env=env)
    after, threads_after = cpu_ticks(arm.pids), thread_cpu_ns(arm.pids)
    m = re.search(r"(\d+) requests in", out)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if bad or "Socket errors" in out:
        die(f"{arm.name}: wrk saw errors:\n{out}")
    n = int(m.group(1))
    cpu = (after - before) / os.sysconf("SC_CLK_TCK") / (n / 1000) if arm.pids else None
    p = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    p99 = float(p.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[p.group(2)]
    spent = {k: v - threads_before.get(k, 0) for k, v in threads_after.items()}
    db = sum(v for k, v in spent.items() if db_thread(k)) / n / 1000
    rest = sum(v for k, v in spent.items() if not db_thread(k)) / n / 1000
    return rps, cpu, n, p99, (db, rest)


def oha(arm, rate, duration, conns):
    out = run(["oha", "-z", f"{duration}s", "-q", str(rate), "--latency-correction",
               "--no-tui", "--output-format", "json", "-c", str(conns), "-m", "POST",
               "-H", f"Authorization: {arm.auth}", "-H", "Content-Type: application/json",
               "-H", "Accept: application/json, text/event-stream", "-d", BODY, arm.url])
    j = json.loads(out)
    codes = j.get("statusCodeDistribution", {})
    # Requests still in flight when the duration ends are cut off by oha
    # itself; anything else is a failure.
    errors = {k: v for k, v in j.get("errorDistribution", {}).items()
              if k != "aborted due to deadline"}
    if set(codes) != {"200"} or errors:
        die(f"{arm.name}: oha saw statuses {codes} errors {errors}")
    p = j["latencyPercentiles"]
    return [p["p50"] * 1e3, p["p90"] * 1e3, p["p99"] * 1e3], sum(codes.values())


def sse_delay(arm, every_ms, events):
    out = run([SSE, "delay", f"{arm.url}?every_ms={every_ms}", arm.token, str(events)])
    return [float(x) for x in out.split()]


def idle_streams(arm, n):
    """RSS added per idle open SSE stream through the proxy, in KiB."""
    base = rss_kib(arm.pids)
    p = subprocess.Popen(["taskset", "-c", CLIENT_CORE, SSE, "hold", arm.url, arm.token, str(n)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    if line != f"open {n}":
        p.kill()
        die(f"{arm.name}: could not open {n} streams (the client's error is above)")
    held = rss_kib(arm.pids)
    p.stdin.close()
    p.wait(timeout=60)
    return (held - base) / n, base, held


def count_statements(log):
    """sqlx statements in tessera's log: all, the revision polls, and the
    audit trail's batch writes (both off the request path)."""
    total = polls = audits = 0
    with open(log, errors="replace") as f:
        for line in f:
            if "sqlx::query" in line:
                total += 1
                polls += POLL_STATEMENT in line
                audits += AUDIT_STATEMENT in line
    return total, polls, audits


def med(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return statistics.median(xs), min(xs), max(xs)


def fmt(t, unit="", prec=1):
    if t is None:
        return "—"
    m, lo, hi = t
    return f"{m:,.{prec}f}{unit} ({lo:,.{prec}f}–{hi:,.{prec}f})"


def ratio(a, b):
    if a is None or b is None or b[0] == 0:
        return "—"
    return f"{a[0] / b[0]:.2f}×"


def version(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
        return (r.stdout + r.stderr).strip().splitlines()[0]
    except OSError:
        return "not found"


def machine():
    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    return f"{model}, {os.cpu_count()} cores, {mem_kib / 1048576:.0f} GiB, Linux {platform.release()}"


def main():
    global TESSERA
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="one-second runs: check it works")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=int, default=5, help="seconds per wrk/oha run")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--streams", type=int, default=10_000)
    ap.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    ap.add_argument("--tessera", default=TESSERA, help="the tessera binary to measure")
    ap.add_argument("--compare", metavar="BIN",
                    help="another tessera build to run as one more arm (before/after)")
    a = ap.parse_args()
    TESSERA = a.tessera
    if a.smoke:
        a.rounds, a.duration, a.streams, a.out = 1, 1, 200, None
    # Each stream is two sockets in the proxy (caller side, upstream side).
    # nginx starts dropping connections ("worker_connections are not
    # enough") well before its limit, so keep a fifth of the fds spare.
    fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if 2 * a.streams > fd_limit * 4 // 5:
        wanted, a.streams = a.streams, fd_limit * 4 // 5 // 2
        print(f"bench: the fd limit is {fd_limit} and cannot be raised here; opening "
              f"{a.streams:,} idle streams instead of {wanted:,}", flush=True)
    sse_every_ms, sse_events = (2, 100) if a.smoke else (5, 600)

    work = tempfile.mkdtemp(prefix="tessera-bench-")
    data = os.path.join(work, "data")
    up_secret = "ghp_bench_" + secrets.token_hex(16)
    up_port, t_port, n_port = free_port(), free_port(), free_port()
    try:
        up = start([UPSTREAM, f"127.0.0.1:{up_port}"], CLIENT_CORE, stdout=subprocess.PIPE,
                   text=True, env=dict(os.environ, BENCH_UPSTREAM_SECRET=up_secret))
        if not up.stdout.readline().startswith("listening"):
            die("the upstream did not start")

        # tessera, registered through the CLI: one credential, one caller,
        # one connection.
        cli(data, "credential", "add", "bench", "--upstream", f"http://127.0.0.1:{up_port}/mcp",
            "--secret-env", "BENCH_UPSTREAM_SECRET", env_extra={"BENCH_UPSTREAM_SECRET": up_secret})
        token = cli(data, "caller", "add", "agent")
        t_url = cli(data, "connection", "add", "--caller", "agent", "--credential", "bench",
                    "--public-url", f"http://127.0.0.1:{t_port}")
        t_log = os.path.join(work, "tessera.log")
        # The access log stays on (as nginx's does); sqlx's statement log
        # is how the database queries are counted.
        t = start([TESSERA, "serve", "--listen", f"127.0.0.1:{t_port}", "--worker-threads", "1"],
                  PROXY_CORE, stderr=open(t_log, "w"),
                  env=dict(os.environ, TESSERA_DATA_DIR=data, RUST_LOG="info,sqlx::query=debug"))
        wait_port(t_port, "tessera", t)
        if a.compare:
            # Its own data dir, registered through its own CLI: builds of
            # different schema versions cannot share a database.
            b_data, b_port = os.path.join(work, "before-data"), free_port()
            cli(b_data, "credential", "add", "bench", "--upstream",
                f"http://127.0.0.1:{up_port}/mcp", "--secret-env", "BENCH_UPSTREAM_SECRET",
                env_extra={"BENCH_UPSTREAM_SECRET": up_secret}, binary=a.compare)
            b_token = cli(b_data, "caller", "add", "agent", binary=a.compare)
            b_url = cli(b_data, "connection", "add", "--caller", "agent", "--credential", "bench",
                        "--public-url", f"http://127.0.0.1:{b_port}", binary=a.compare)
            b = start([a.compare, "serve", "--listen", f"127.0.0.1:{b_port}",
                       "--worker-threads", "1"], PROXY_CORE,
                      stderr=open(os.path.join(work, "before.log"), "w"),
                      env=dict(os.environ, TESSERA_DATA_DIR=b_data, RUST_LOG="info"))
            wait_port(b_port, "the compared tessera", b)

        # The floor: a byte relay on the proxy's core (bench/relay.rs).
        r_port = free_port()
        relay = start([RELAY, f"127.0.0.1:{r_port}", f"127.0.0.1:{up_port}"], PROXY_CORE,
                      stdout=subprocess.PIPE, text=True)
        if not relay.stdout.readline().startswith("listening"):
            die("the relay did not start")

        # nginx with the equivalent config.
        conn_id = t_url.rsplit("/", 1)[1]
        ng = os.path.join(work, "nginx")
        os.makedirs(ng)
        with open(os.path.join(ROOT, "bench", "nginx.conf")) as f:
            conf = f.read()
        for k, v in {"DIR": ng, "UPSTREAM_PORT": up_port, "NGINX_PORT": n_port,
                     "CALLER_TOKEN": token, "CONNECTION_ID": conn_id,
                     "UPSTREAM_SECRET": up_secret, "NOFILE": fd_limit}.items():
            conf = conf.replace(f"@{k}@", str(v))
        with open(os.path.join(ng, "nginx.conf"), "w") as f:
            f.write(conf)
        n = start(["nginx", "-c", os.path.join(ng, "nginx.conf"), "-p", ng, "-e",
                   os.path.join(ng, "error.log")], PROXY_CORE)
        wait_port(n_port, "nginx", n)

        arms = [
            Arm("direct", f"http://127.0.0.1:{up_port}/mcp", f"Bearer {up_secret}", []),
            Arm("relay", f"http://127.0.0.1:{r_port}/mcp", f"Bearer {up_secret}", [relay.pid]),
            Arm("nginx", f"http://127.0.0.1:{n_port}/c/{conn_id}", f"Bearer {token}",
                [n.pid] + children(n.pid)),
            Arm("tessera", t_url, f"Bearer {token}", [t.pid]),
        ]
        if a.compare:
            arms.append(Arm("before", b_url, f"Bearer {b_token}", [b.pid]))
        for arm in arms:
            check_arm(arm, arm.name not in ("direct", "relay"))

        lua = os.path.join(work, "post.lua")
        with open(lua, "w") as f:
            f.write('wrk.method = "POST"\n')
            f.write(f"wrk.body = {json.dumps(BODY)}\n")
            f.write('wrk.headers["Content-Type"] = "application/json"\n')
            f.write('wrk.headers["Accept"] = "application/json, text/event-stream"\n')
            f.write('wrk.headers["Authorization"] = os.getenv("AUTH")\n')

        # Warm up every arm (connection pools, page cache, CPU frequency).
        for arm in arms:
            wrk(arm, lua, 1, a.connections)

        res = {arm.name: {} for arm in arms}

        def add(arm, key, value):
            res[arm.name].setdefault(key, []).append(value)

        print(f"pinned: load clients and upstream on core {CLIENT_CORE}; nginx (1 worker) and "
              f"tessera (1 runtime worker) on core {PROXY_CORE}", flush=True)
        for r in range(a.rounds):
            print(f"round {r + 1}/{a.rounds}", flush=True)
            for arm in arms:
                rps, cpu, _, p99, (db, rest) = wrk(arm, lua, a.duration, a.connections)
                add(arm, "rps", rps)
                add(arm, "cpu", cpu)
                add(arm, "sat-p99", p99)
                if arm.name in ("tessera", "before"):
                    add(arm, "cpu-db", db)
                    add(arm, "cpu-rest", rest)
            for rate in (1000, 5000):
                for arm in arms:
                    lat, _ = oha(arm, rate, a.duration, a.connections)
                    for q, v in zip(("p50", "p90", "p99"), lat):
                        add(arm, f"{rate}-{q}", v)
            for arm in arms:
                for q, v in zip(("p50", "p90", "p99"), sse_delay(arm, sse_every_ms, sse_events)):
                    add(arm, f"sse-{q}", v)

        # Paired differences: each round's proxy figure minus the same
        # round's direct figure.
        for arm in arms[1:]:
            for key in [f"{r}-{q}" for r in (1000, 5000) for q in ("p50", "p90", "p99")] + \
                       [f"sse-{q}" for q in ("p50", "p90", "p99")]:
                res[arm.name][f"added-{key}"] = [
                    p - d for p, d in zip(res[arm.name][key], res["direct"][key])]

        # Idle streams: RSS per open stream through each proxy. Not the
        # relay's: its two 8 KiB copy buffers per stream are no floor.
        for arm in arms[2:]:
            per, base, held = idle_streams(arm, a.streams)
            add(arm, "rss-per-stream", per)
            print(f"{arm.name}: RSS {base} KiB idle, {held} KiB with {a.streams} streams open",
                  flush=True)

        # Database statements while tessera serves a steady load.
        before = count_statements(t_log)
        tessera = next(arm for arm in arms if arm.name == "tessera")
        _, _, nreq, _, _ = wrk(tessera, lua, max(2, a.duration), a.connections)
        after = count_statements(t_log)
        total, polls, audits = (x - y for x, y in zip(after, before))
        per_request = (total - polls - audits) / nreq
        add(tessera, "db", per_request)
        print(f"tessera: {total} statements during {nreq} requests: {polls} background "
              f"revision polls, {audits} audit inserts through sqlx (on SQLite the audit "
              f"writer has a connection and a thread of its own, outside sqlx's log); "
              f"{total - polls - audits} on the request path", flush=True)
        micro = None if a.smoke else micro_benchmarks()
        table = report(res, a, micro)
        print()
        print(table)
        # Checked after the table is out, so a failing run's figures are
        # still seen; nothing is written then.
        if total != polls + audits:
            die("tessera queried its database on the request path")
        if a.out:
            write_markdown(a, table)
            print(f"\nwritten to {os.path.relpath(a.out, ROOT)}")
    finally:
        stop_all()
        shutil.rmtree(work, ignore_errors=True)


ROWS = [
    ("rps", "saturation throughput (req/s, wrk)", "", 0),
    ("cpu", "proxy CPU seconds per 1,000 requests", " s", 3),
    ("cpu-db", "of which the database's threads, µs per request (audit writer)", " µs", 2),
    ("cpu-rest", "of which every other thread, µs per request (the runtime)", " µs", 2),
    ("sat-p99", "latency at saturation, p99 (wrk)", " ms", 3),
    ("1000-p50", "latency at 1,000 req/s, p50", " ms", 3),
    ("1000-p90", "latency at 1,000 req/s, p90", " ms", 3),
    ("1000-p99", "latency at 1,000 req/s, p99", " ms", 3),
    ("added-1000-p50", "added over direct at 1,000 req/s, p50", " ms", 3),
    ("added-1000-p99", "added over direct at 1,000 req/s, p99", " ms", 3),
    ("5000-p50", "latency at 5,000 req/s, p50", " ms", 3),
    ("5000-p90", "latency at 5,000 req/s, p90", " ms", 3),
    ("5000-p99", "latency at 5,000 req/s, p99", " ms", 3),
    ("added-5000-p50", "added over direct at 5,000 req/s, p50", " ms", 3),
    ("added-5000-p99", "added over direct at 5,000 req/s, p99", " ms", 3),
    ("sse-p50", "SSE event delay, p50", " µs", 0),
    ("sse-p99", "SSE event delay, p99", " µs", 0),
    ("added-sse-p50", "SSE delay added over direct, p50", " µs", 0),
    ("added-sse-p99", "SSE delay added over direct, p99", " µs", 0),
    ("rss-per-stream", "RSS per idle open SSE stream", " KiB", 1),
    ("db", "database queries per request (steady state)", "", 0),
]

# Issue 27's targets, each against the other arms of the same run: the
# text shown, and whether the medians meet it.
TARGETS = {
    "rps": ("≥ 0.85× nginx (1.0× the goal)", lambda t: t["tessera"] >= 0.85 * t["nginx"]),
    "cpu-db": ("≤ 1 µs", lambda t: t["tessera"] <= 1.0),
    "sat-p99": ("≤ 2× nginx", lambda t: t["tessera"] <= 2 * t["nginx"]),
    "added-1000-p50": ("≤ relay + 0.02 ms", lambda t: t["tessera"] <= t["relay"] + 0.02),
    "added-1000-p99": ("≤ nginx + 0.1 ms", lambda t: t["tessera"] <= t["nginx"] + 0.1),
    "5000-p99": ("≤ 1.3× nginx", lambda t: t["tessera"] <= 1.3 * t["nginx"]),
    "added-sse-p50": ("≤ 1,000 µs", lambda t: t["tessera"] <= 1000),
    "rss-per-stream": ("≤ nginx", lambda t: t["tessera"] <= t["nginx"]),
    "db": ("0", lambda t: t["tessera"] == 0),
}


def target_cell(key, t):
    if key not in TARGETS:
        return ""
    text, met = TARGETS[key]
    medians = {arm: v[0] for arm, v in t.items() if v is not None}
    try:
        return f"{text}: {'met' if met(medians) else '**missed**'}"
    except (TypeError, KeyError):
        return text  # an arm without the figure


def instructions():
    """The last full count of bench/instructions.sh for this build, if any."""
    try:
        with open(os.path.join(REL, "instructions.txt")) as f:
            kv = dict(line.split(" ", 1) for line in f.read().splitlines())
    except OSError:
        return None
    return {k: (v if k == "tree" else int(v)) for k, v in kv.items()}


def micro_benchmarks():
    """criterion's per-request pieces, on the proxy's core; (name, ns) each."""
    print("micro-benchmarks (cargo bench --bench micro -- --quick)", flush=True)
    out = subprocess.run(["taskset", "-c", PROXY_CORE, "cargo", "bench", "--quiet", "--bench",
                          "micro", "--", "--quick", "--noplot"], cwd=ROOT, capture_output=True,
                         text=True)
    if out.returncode != 0:
        die(f"cargo bench failed: {out.stderr[-800:]}")
    found, name = [], None
    units = {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6}
    for line in out.stdout.splitlines():
        m = re.search(r"time:\s+\[\S+ \S+ ([\d.]+) (\S+) ", line)
        head = line.split("time:")[0].strip()
        if head:
            name = head
        if m and name:
            found.append((name, float(m.group(1)) * units[m.group(2)]))
            name = None
    return found


def report(res, a, micro=None):
    names = list(res)  # direct, nginx, tessera[, before]
    lines = ["| measure | " + " | ".join(names) + " | tessera/nginx | tessera/direct | target |",
             "|---|" + "---|" * (len(names) + 3)]
    for key, label, unit, prec in ROWS:
        t = {arm: med(res[arm].get(key, [])) for arm in names}
        cells = " | ".join(fmt(t[n], unit, prec) for n in names)
        lines.append(f"| {label} | {cells} | {ratio(t['tessera'], t['nginx'])} "
                     f"| {ratio(t['tessera'], t['direct'])} | {target_cell(key, t)} |")
    counted = instructions()
    if counted:
        # Counted, not timed: repeats within about 1% (bench/instructions.sh).
        t, n, r = (counted.get(k) for k in ("tessera", "nginx", "relay"))
        cells = " | ".join({"relay": f"{r:,}", "nginx": f"{n:,}", "tessera": f"{t:,}"}.get(arm, "—")
                           for arm in names)
        met = "met" if t <= 1.5 * n else "**missed**"
        lines.append(f"| instructions per request (callgrind, `bench/instructions.sh "
                     f"--requests {counted['requests']}` at {counted['tree']}) | {cells} "
                     f"| {t / n:.2f}× | — | ≤ 1.5× nginx: {met} |")
    lines.append("")
    lines.append(f"Medians over {a.rounds} interleaved round(s), (min–max) after each.")
    if micro:
        lines += ["", "| per-request piece (criterion, median) | time | target |", "|---|---|---|"]
        for n, ns in micro:
            # The audit groups time one batch; shown per record. It runs
            # off the request path (its own thread), on the proxy's core:
            # its CPU per record (the "audit CPU" group: the process's CPU
            # clock, and the runtime thread's alone) has issue 27's target;
            # the wall time waits on fsync.
            batch = re.search(r"batch of (\d+) records", n)
            if batch:
                target = "≤ 1,000 ns CPU" if n.startswith("audit CPU") else "— (wall time)"
                lines.append(f"| {n}, per record | {ns / int(batch.group(1)):,.0f} ns "
                             f"| {target} |")
            else:
                lines.append(f"| {n} | {ns:,.0f} ns | ≤ 1,000 ns |")
    return "\n".join(lines)


def write_markdown(a, table):
    rev = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"],
                         capture_output=True, text=True).stdout.strip()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    compared = (f"- The `before` arm is another tessera build, `{a.compare}`, run the same\n"
                f"  way in the same rounds.\n") if a.compare else ""
    # The "## History" section (before/after figures of past changes,
    # written by people) is kept across runs.
    history = ""
    if os.path.exists(a.out):
        with open(a.out) as f:
            old = f.read()
        if "\n## History\n" in old:
            history = "\n## History\n" + old.split("\n## History\n", 1)[1]
    with open(a.out, "w") as f:
        f.write(f"""# Benchmarks

Written by `bench/run.sh` on {now}; tessera at `{rev}`.

## Settings
- Machine: {machine()}.
- Pinning: wrk/oha/the SSE client and the upstream (`bench/upstream.rs`, a
  current-thread hyper server) on core {CLIENT_CORE}; the proxy under test on
  core {PROXY_CORE}: nginx with one worker process (`bench/nginx.conf`),
  tessera with `--worker-threads 1` (a current-thread runtime).
- The floor: `relay` is a byte relay (`bench/relay.rs`, a current-thread
  runtime) on the proxy's core, one upstream connection per caller
  connection, no parsing. What it adds over direct is what one user-space
  hop costs on this machine, before any work of a proxy's own.
- The job, for both proxies: check the caller's token, replace
  `Authorization` with the stored credential, hide `WWW-Authenticate` and
  `Set-Cookie`, keep upstream connections alive, stream answers, write one
  access-log line per request. The upstream answers 401 to anything but the
  injected credential, so a proxy that fails to inject shows as errors.
- Load: a 330-byte `tools/call` POST; wrk with 1 thread and
  {a.connections} connections for {a.duration} s; oha at a fixed 1,000 and
  5,000 requests/s with `--latency-correction`, {a.connections} connections,
  {a.duration} s; {a.rounds} rounds, arms interleaved (direct, relay,
  nginx, tessera, …) within each measurement.
- SSE: the upstream sends an event every 5 ms carrying its send time; the
  client reports receive time minus send time (one machine, one clock).
- Idle streams: {a.streams:,} SSE streams opened through each proxy (each
  its own TCP connection); RSS of the proxy's processes before and after.
- Database: tessera's sqlx statement log is counted during a steady wrk run;
  the background revision poll (every 250 ms, independent of load) is
  counted apart from statements on the request path. The audit trail is
  written by its own thread on its own SQLite connection (a batch of up
  to 512 records is one transaction of inserts of up to 64), outside
  sqlx's log; its CPU is the "database's threads" row (per-thread CPU from
  `/proc/<pid>/task/*/schedstat` across each wrk run).
{compared}- Versions: {version(["rustc", "--version"])}; {version(["nginx", "-v"])};
  {version(["wrk", "-v"])}; {version(["oha", "--version"])}.

## Results

{table}
{history}""")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        stop_all()
        sys.exit(130)

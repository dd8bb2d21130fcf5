#!/usr/bin/env python3
"""A soak run of one tessera process: many idle SSE streams held open while
a steady request load runs, for a bounded time.

Run through bench/soak.sh (release build, fd limit raised). It prints the
RSS per open stream, the errors seen (any non-200 or failed request, any
refusal or 5xx tessera counted), and whether tessera's memory and its
open-stream count came back once the streams closed; a second round of
streams tells memory the allocator kept (reused) from a leak (grows).
Exits 1 on an error, a stream left open, or growth in the second round.

The pieces (upstream, SSE client, process helpers) are the benchmark's
(bench/bench.py).
"""

import argparse
import json
import os
import resource
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the benchmark's helpers)


def metrics(admin, token):
    req = urllib.request.Request(f"http://{admin}/metrics",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=10_000)
    ap.add_argument("--seconds", type=int, default=60, help="how long the load runs")
    ap.add_argument("--rate", type=int, default=500, help="requests per second meanwhile")
    ap.add_argument("--tessera", default=bench.TESSERA, help="the tessera binary to soak")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of opening and closing the streams (the first under load)")
    ap.add_argument("--h2", action="store_true",
                    help="reach the upstream over TLS with HTTP/2: every stream shares one "
                         "upstream connection, so tessera needs one socket per stream, not two")
    a = ap.parse_args()
    bench.TESSERA = a.tessera
    fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    sockets = 1 if a.h2 else 2
    if sockets * a.streams > fd_limit * 4 // 5:
        a.streams = fd_limit * 4 // 5 // sockets
        print(f"soak: the fd limit is {fd_limit}; holding {a.streams:,} streams "
              f"({sockets} sockets each in tessera)", flush=True)

    work = tempfile.mkdtemp(prefix="tessera-soak-")
    data = os.path.join(work, "data")
    up_secret = "ghp_soak_" + secrets.token_hex(16)
    up_port, t_port, admin_port = bench.free_port(), bench.free_port(), bench.free_port()
    admin = f"127.0.0.1:{admin_port}"
    try:
        ca = os.path.join(work, "upstream-ca.pem")
        up_env = dict(os.environ, BENCH_UPSTREAM_SECRET=up_secret)
        if a.h2:
            up_env["BENCH_UPSTREAM_TLS_CA"] = ca
        up = bench.start([bench.UPSTREAM, f"127.0.0.1:{up_port}"], bench.CLIENT_CORE,
                         stdout=subprocess.PIPE, text=True, env=up_env)
        if not up.stdout.readline().startswith("listening"):
            bench.die("the upstream did not start")
        upstream = (f"https://localhost:{up_port}/mcp" if a.h2
                    else f"http://127.0.0.1:{up_port}/mcp")
        bench.cli(data, "credential", "add", "soak", "--upstream", upstream,
                  "--secret-env", "BENCH_UPSTREAM_SECRET",
                  env_extra={"BENCH_UPSTREAM_SECRET": up_secret})
        token = bench.cli(data, "caller", "add", "agent")
        url = bench.cli(data, "connection", "add", "--caller", "agent", "--credential", "soak",
                        "--public-url", f"http://127.0.0.1:{t_port}")
        admin_token = bench.cli(data, "admin-token", "add", "soak")
        t = bench.start([bench.TESSERA, "serve", "--listen", f"127.0.0.1:{t_port}",
                         "--admin-listen", admin, "--worker-threads", "1"]
                        + (["--upstream-ca-file", ca] if a.h2 else []),
                        bench.PROXY_CORE, stderr=open(os.path.join(work, "tessera.log"), "w"),
                        env=dict(os.environ, TESSERA_DATA_DIR=data))
        bench.wait_port(t_port, "tessera", t)
        arm = bench.Arm("tessera", url, f"Bearer {token}", [t.pid])
        bench.check_arm(arm, True)
        # Warm up so the baseline includes what any request allocates once.
        bench.oha(arm, 200, 1, 8)
        base = bench.rss_kib(arm.pids)

        def open_streams():
            p = subprocess.Popen(["taskset", "-c", bench.CLIENT_CORE, bench.SSE, "hold", url,
                                  token, str(a.streams)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            if p.stdout.readline().strip() != f"open {a.streams}":
                p.kill()
                bench.die(f"could not open {a.streams} streams")
            return p

        def releases():
            return metrics(admin, admin_token).get("tessera_memory_releases_total")

        def close_streams(p):
            p.stdin.close()
            p.wait(timeout=60)
            # Until every stream is counted closed (at most 30 s).
            deadline = time.monotonic() + 30
            while (metrics(admin, admin_token)["tessera_open_streams"] > 0
                   and time.monotonic() < deadline):
                time.sleep(0.2)
            # tessera returns free memory to the system once a wave of
            # streams (512 or more) has closed and the count has held still
            # for a check (once a second), so after this point: measure
            # after that release (at most 10 s; older binaries skip it).
            released = releases()
            deadline = time.monotonic() + 10
            while (released is not None and a.streams >= 512 and releases() == released
                   and time.monotonic() < deadline):
                time.sleep(0.2)
            return metrics(admin, admin_token)["tessera_open_streams"]

        def errors():
            m = metrics(admin, admin_token)
            return sum(v for k, v in m.items()
                       if k.startswith("tessera_refusals_total")
                       or (k.startswith("tessera_requests_total") and 'status="5' in k))

        hold = open_streams()
        held = bench.rss_kib(arm.pids)
        opened = metrics(admin, admin_token)["tessera_open_streams"]

        # The steady load, streams held all along; oha itself fails the run
        # (bench.die) on any non-200 or transport error, and tessera's own
        # counters must not move either.
        errors_before = errors()
        started = time.monotonic()
        _, served = bench.oha(arm, a.rate, a.seconds, 16)
        elapsed = time.monotonic() - started
        during = bench.rss_kib(arm.pids)
        failed = int(errors() - errors_before)
        left_open = close_streams(hold)
        after = bench.rss_kib(arm.pids)
        # Freed memory can stay with the allocator rather than go back to
        # the system. A second round of the same streams tells retention
        # from a leak: retained memory is reused, a leak grows again.
        rounds = []
        for _ in range(a.rounds - 1):
            again = open_streams()
            rounds.append(bench.rss_kib(arm.pids))
            left_open += close_streams(again)
        held_again = rounds[-1] if rounds else held
        after_again = bench.rss_kib(arm.pids)

        per_stream = (held - base) / a.streams
        returned = after <= base + (held - base) / 10
        # Growth from the second round to the last: the first rounds fill
        # the allocator's caches; a leak keeps growing after them.
        growth = (held_again - rounds[0]) / a.streams if len(rounds) > 1 else 0.0
        result = {
            "streams": a.streams,
            "upstream": "TLS, HTTP/2 (one connection)" if a.h2 else "HTTP/1.1 (a connection each)",
            "streams_counted_open": int(opened),
            "load_seconds": round(elapsed, 1),
            "requests_served": served,
            "errors": failed,
            "rss_kib": {"baseline": base, "streams_open": held, "under_load": during,
                        "after_close": after, "streams_open_in_later_rounds": rounds,
                        "after_last_round": after_again},
            "rss_kib_per_stream": round(per_stream, 2),
            "later_rounds_growth_kib_per_stream": round(growth, 2),
            "streams_left_open": int(left_open),
            "memory_returned_to_baseline": returned,
        }
        print(json.dumps(result, indent=2))
        print(f"soak: {a.streams:,} streams, {per_stream:.1f} KiB each; {served:,} requests in "
              f"{elapsed:.0f} s, {failed} errors; after close {after:,} KiB (baseline {base:,}, "
              f"held {held:,}): {'returned' if returned else 'kept by the allocator'}; "
              f"later rounds grew {growth:.2f} KiB per stream; {int(left_open)} streams left open")
        if failed > 0 or left_open > 0 or opened < a.streams or growth > per_stream / 10:
            sys.exit(1)
    finally:
        bench.stop_all()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Helpers for benches/load/run.sh (standard library only).

  report.py parse-wrk OUT        one measurement from wrk + wrk-report.lua
  report.py parse-h2load OUT     one measurement from h2load (+ OUT.requests log)
  report.py render RUN_DIR       the Markdown report of a run

A parse prints one tab-separated line: status (ok|failed), requests/s, p50 and p99
latency in microseconds, and a detail. A measurement with any socket error, timeout or
non-2xx response is "failed": its numbers are kept in the raw output but left out of
the medians.
"""

import re
import statistics
import sys
from pathlib import Path

PEERS = ("envoy", "nginx", "haproxy")
# Columns of results.tsv, as run.sh writes them.
(SCENARIO, TARGET, ROUND, NOISE_LOAD, NOISE_PROXY, PROXY_CPU, STATUS, RPS, P50, P99,
 DETAIL) = range(11)
TARGETS = ("direct", "envoy", "nginx", "haproxy", "aether", "base")

SCENARIOS = {
    "keepalive": "HTTP/1.1 keep-alive, {connections} connections (wrk)",
    "close": "HTTP/1.1, new connection per request, {connections} concurrent (wrk, `Connection: close`)",
    "tls": "HTTPS termination, {connections} keep-alive connections (wrk, ECDSA P-256 certificate)",
    "h2": "HTTP/2 prior knowledge (h2c), {h2_connections} connections x {h2_streams} streams (h2load)",
    "h2tls": "HTTP/2 over TLS (ALPN h2), {h2_connections} connections x {h2_streams} streams (h2load, ECDSA P-256 certificate)",
}


def emit(status, rps, p50, p99, detail):
    print(f"{status}\t{rps:.1f}\t{p50}\t{p99}\t{detail}")


def parse_wrk(path):
    text = Path(path).read_text(errors="replace")
    m = re.search(r"^RESULT (.*)$", text, re.M)
    if not m:
        last = text.strip().splitlines()[-1:] or ["no output"]
        emit("failed", 0, 0, 0, f"no wrk summary: {last[0][:120]}")
        return
    v = {k: int(x) for k, x in (kv.split("=") for kv in m.group(1).split())}
    rps = v["requests"] / (v["duration_us"] / 1e6) if v["duration_us"] else 0.0
    errors = {k: v[k] for k in ("connect", "read", "write", "timeout") if v[k]}
    problems = [f"{n} socket {k} errors" for k, n in errors.items()]
    if v["status"]:
        problems.append(f"{v['status']} non-2xx/3xx responses")
    if v["requests"] == 0:
        problems.append("no requests completed")
    detail = "; ".join(problems) or f"{v['requests']} requests, max {v['max_us']} us"
    emit("failed" if problems else "ok", rps, v["p50_us"], v["p99_us"], detail)


def percentile(sorted_values, q):
    if not sorted_values:
        return 0
    i = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values)) - 1))
    return sorted_values[i]


def parse_h2load(path):
    text = Path(path).read_text(errors="replace")
    fin = re.search(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s", text)
    req = re.search(
        r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
        r"(\d+) failed, (\d+) errored, (\d+) timeout",
        text,
    )
    codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text)
    if not (fin and req and codes):
        last = text.strip().splitlines()[-1:] or ["no output"]
        emit("failed", 0, 0, 0, f"no h2load summary: {last[0][:120]}")
        return
    rps = float(fin.group(3))
    _total, _started, done, succeeded, failed, errored, timeout = map(int, req.groups())
    c2, c3, c4, c5 = map(int, codes.groups())
    latencies = []
    log = Path(str(path) + ".requests")
    if log.exists():
        for line in log.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == 3:
                latencies.append(int(parts[2]))
    latencies.sort()
    problems = []
    if failed or errored or timeout:
        problems.append(f"{failed} failed, {errored} errored, {timeout} timed out requests")
    if c3 or c4 or c5:
        problems.append(f"{c3 + c4 + c5} non-2xx responses ({c3} 3xx, {c4} 4xx, {c5} 5xx)")
    if done == 0:
        problems.append("no requests completed")
    if not latencies:
        problems.append("no per-request log")
    detail = "; ".join(problems) or f"{succeeded} requests, max {latencies[-1]} us"
    emit(
        "failed" if problems else "ok",
        rps,
        percentile(latencies, 50),
        percentile(latencies, 99),
        detail,
    )


def fmt_rps(x):
    return f"{x:,.0f}"


def fmt_us(us):
    if us >= 10_000:
        return f"{us / 1000:.1f} ms"
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.0f} µs"


def fmt_ratio(x, ref):
    return f"{x / ref:.2f}" if ref else "–"


def render(run_dir):
    run = Path(run_dir)
    meta = dict(
        line.split("=", 1) for line in (run / "meta.txt").read_text().splitlines() if "=" in line
    )
    rows = [line.split("\t") for line in (run / "results.tsv").read_text().splitlines() if line]
    rss = {}
    for line in (run / "rss.tsv").read_text().splitlines():
        scenario, target, kb = line.split("\t")
        rss[(scenario, target)] = int(kb)

    out = []
    out.append(f"## Run of {meta['date']}")
    out.append("")
    out.append(
        f"Machine: {meta['nproc']} CPUs ({meta['cpu']}), {meta['mem']}, Linux {meta['kernel']}, "
        f"{meta['os']}."
    )
    out.append(
        f"Versions: aether-edge {meta['aether']}"
        + (f" with flags `{meta['aether_args']}`" if meta.get("aether_args") else "")
        + (f" (base: the build {meta['base']}" if meta.get("base") else "")
        + (f" with flags `{meta['base_args']}`" if meta.get("base") and meta.get("base_args") else "")
        + (")" if meta.get("base") else "")
        + f", Envoy {meta['envoy']}, nginx {meta['nginx']}, "
        f"HAProxy {meta['haproxy']}; load: wrk {meta['wrk']}, h2load {meta['h2load']}."
    )
    proxy_cpus = meta.get("proxy_cpus", "1")
    pin = (
        f"proxy pinned to CPU {proxy_cpus}, load generator and upstream (nginx, 1 worker) to CPU 0"
        if meta["pin"] == "1"
        else "no CPU pinning"
    )
    workers = meta["aether_workers"]
    if meta.get("base") and meta.get("aether_base_workers", workers) != workers:
        workers += f", base {meta['aether_base_workers']}"
    out.append(
        f"Settings: {meta['rounds']} interleaved rounds x {meta['duration']} s "
        f"(after {meta['warmup']} s warm-up), medians shown; {pin}; one worker per proxy "
        f"(aether-edge workers: {workers}); load average {meta['loadavg_start']} at start, "
        f"{meta['loadavg_end']} at end."
    )
    out.append("")
    out.append(
        "Cells: value (x direct / x best peer). Best peer = the best of Envoy, nginx and "
        "HAProxy for that column alone (highest req/s, lowest latency). Peak RSS = VmHWM "
        "after the scenario (nginx: master + worker). Req/s per proxy CPU = req/s divided "
        "by the CPU the proxy used (user + system, 100% = one core), median over rounds, "
        "(x best peer); it moves less than req/s when other processes compete for the "
        "CPU. Others' CPU = CPU time that processes "
        "not started by the benchmark took during the measurement, in % of one CPU"
        + (
            " (load generator's CPU / proxy's CPU). Others soak up whatever the benchmark "
            "leaves idle, so on the load CPU it is mostly harmless; on the proxy CPU, above "
            "a few % means the proxy was starved by a busy, shared machine and its req/s "
            "and latency are lower bounds."
            if meta["pin"] == "1" and proxy_cpus == "1"
            else ", across all CPUs."
        )
    )

    scenarios = []
    for r in rows:
        if r[0] not in scenarios:
            scenarios.append(r[0])
    for scenario in scenarios:
        title = SCENARIOS.get(scenario, scenario).format(**meta)
        out.append("")
        out.append(f"### {title}")
        out.append("")
        per_target = {}
        for r in rows:
            if r[0] != scenario:
                continue
            per_target.setdefault(r[1], []).append(r)
        med = {}
        notes = {}
        for target, rs in per_target.items():
            ok = [r for r in rs if r[STATUS] == "ok"]
            bad = [r for r in rs if r[STATUS] != "ok"]
            if ok:
                med[target] = (
                    statistics.median(float(r[RPS]) for r in ok),
                    statistics.median(float(r[P50]) for r in ok),
                    statistics.median(float(r[P99]) for r in ok),
                    [float(r[RPS]) for r in ok],
                    statistics.median(int(r[NOISE_LOAD]) for r in ok),
                    statistics.median(int(r[NOISE_PROXY]) for r in ok),
                    statistics.median(int(r[PROXY_CPU]) for r in ok),
                    statistics.median(
                        float(r[RPS]) * 100 / int(r[PROXY_CPU]) if int(r[PROXY_CPU]) else 0
                        for r in ok
                    ),
                )
            if bad:
                notes[target] = bad
        direct = med.get("direct")
        peers = [med[p] for p in PEERS if p in med]
        best = (
            (max(p[0] for p in peers), min(p[1] for p in peers), min(p[2] for p in peers))
            if peers
            else None
        )
        best_per_cpu = max((p[7] for p in peers), default=0)
        out.append(
            "| target | req/s | p50 | p99 | req/s per proxy CPU (CPU used) "
            "| req/s per round | peak RSS | others' CPU |"
        )
        out.append("|---|---:|---:|---:|---:|---|---:|---:|")
        for target in TARGETS:
            if target not in per_target:
                continue
            kb = rss.get((scenario, target))
            rss_cell = f"{kb / 1024:.1f} MiB" if kb else "–"
            if target not in med:
                reason = notes[target][0]
                status = "n/a" if reason[STATUS] == "n/a" else "FAILED"
                out.append(
                    f"| {target} | {status} ({reason[DETAIL]}) | | | | | {rss_cell} | |"
                )
                continue
            rps, p50, p99, each, noise_load, noise_proxy, proxy_cpu, per_cpu = med[target]

            def cell(value, fmt, idx):
                d = fmt_ratio(value, direct[idx]) if direct else "–"
                b = fmt_ratio(value, best[idx]) if best and target != "direct" else "–"
                return f"{fmt(value)} ({d} / {b})"

            rounds = ", ".join(fmt_rps(x) for x in each)
            failed = len(notes.get(target, []))
            if failed:
                rounds += f"; {failed} failed round(s)"
            if meta["pin"] != "1" or proxy_cpus != "1":
                noise = f"{noise_load:.0f}%"
            elif target == "direct":
                noise = f"{noise_load:.0f}% / –"
            else:
                noise = f"{noise_load:.0f}% / {noise_proxy:.0f}%"
            if target == "direct" or not per_cpu:
                per_cpu_cell = "–"
            else:
                per_cpu_cell = (
                    f"{fmt_rps(per_cpu)} ({fmt_ratio(per_cpu, best_per_cpu)}) "
                    f"({proxy_cpu:.0f}%)"
                )
            out.append(
                f"| {target} | {cell(rps, fmt_rps, 0)} | {cell(p50, fmt_us, 1)} | "
                f"{cell(p99, fmt_us, 2)} | {per_cpu_cell} | {rounds} | {rss_cell} | {noise} |"
            )
        failures = [
            f"- {target} round {r[ROUND]} failed: {r[DETAIL]}"
            for target, bad in notes.items()
            for r in bad
            if r[STATUS] == "failed" and r[ROUND] != "0"
        ]
        if failures:
            out.append("")
            out.extend(failures)
    print("\n".join(out))


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "parse-wrk":
        parse_wrk(sys.argv[2])
    elif cmd == "parse-h2load":
        parse_h2load(sys.argv[2])
    elif cmd == "render":
        render(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Where A's cost a request differs from B's, symbol by symbol, from one perf recording
of both edges in the same window (side-by-side.sh with SBS_PERF=1).

    sbs-profile.py PERF_DATA A_PID B_PID A_REQUESTS B_REQUESTS FREQUENCY [TOP]

perf samples both processes at FREQUENCY on the same core at the same moments, so a
slow host moment thins both alike. Each symbol's samples become microseconds a request
for A and for B; printed: the symbols whose difference is largest, A minus B, and the
totals by kind (the edge's binary, the kernel, libc).
"""

import collections
import os
import subprocess
import sys


def samples(data):
    """(thread ID, thread name, dso, symbol) -> samples, from perf's flat report."""
    report = subprocess.run(
        ["perf", "report", "-i", data, "--no-children", "-g", "none", "--stdio",
         "--sort", "pid,dso,sym", "--percent-limit", "0", "-F", "sample,pid,dso,sym"],
        capture_output=True, text=True, check=True).stdout
    counts = collections.Counter()
    for line in report.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split()
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        n = int(parts[0])
        # perf's "pid" here is the thread's ID.
        pid, _, comm = parts[1].partition(":")
        dso = parts[2]
        # "[k] name" or "[.] name": the marker, then the symbol (which may have spaces).
        sym = " ".join(parts[4:]) if parts[3] in ("[k]", "[.]") else " ".join(parts[3:])
        counts[(pid, comm, dso, sym)] += n
    return counts


def main():
    data, a_pid, b_pid = sys.argv[1], sys.argv[2], sys.argv[3]
    a_req, b_req, freq = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
    top = int(sys.argv[7]) if len(sys.argv) > 7 else 30
    counts = samples(data)
    # Each thread's samples count for its process (the edges are still running).
    side_of = {tid: 0 for tid in os.listdir(f"/proc/{a_pid}/task")}
    side_of.update({tid: 1 for tid in os.listdir(f"/proc/{b_pid}/task")})
    per_req = [1e6 / freq / a_req, 1e6 / freq / b_req]
    by_sym = collections.defaultdict(lambda: [0.0, 0.0])
    by_dso = collections.defaultdict(lambda: [0.0, 0.0])
    by_thread = collections.defaultdict(lambda: [0.0, 0.0])
    for (pid, comm, dso, sym), n in counts.items():
        side = side_of.get(pid)
        if side is None:
            continue
        us = n * per_req[side]
        kind = "kernel" if dso.startswith("[kernel") else dso
        by_sym[(kind, sym)][side] += us
        by_dso[kind][side] += us
        by_thread[(comm, "kernel" if kind == "kernel" else "user")][side] += us
    print(f"{'A us/req':>9} {'B us/req':>9} {'A-B':>8}  where")
    for kind, (a, b) in sorted(by_dso.items(), key=lambda kv: -abs(kv[1][0] - kv[1][1])):
        print(f"{a:9.3f} {b:9.3f} {a - b:+8.3f}  (all of {kind})")
    total_a = sum(v[0] for v in by_dso.values())
    total_b = sum(v[1] for v in by_dso.values())
    print(f"{total_a:9.3f} {total_b:9.3f} {total_a - total_b:+8.3f}  (in all: A/B {total_a / total_b:.4f})")
    print()
    for (comm, space), (a, b) in sorted(by_thread.items(), key=lambda kv: -abs(kv[1][0] - kv[1][1])):
        print(f"{a:9.3f} {b:9.3f} {a - b:+8.3f}  (thread {comm}, {space})")
    print()
    rows = sorted(by_sym.items(), key=lambda kv: -abs(kv[1][0] - kv[1][1]))[:top]
    for (kind, sym), (a, b) in rows:
        print(f"{a:9.3f} {b:9.3f} {a - b:+8.3f}  {sym[:90]} ({kind})")


if __name__ == "__main__":
    main()

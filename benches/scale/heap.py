#!/usr/bin/env python3
"""The heap at measure.py's 5,000 routes, by the edge's own code: runs breakdown.py with
the edge under heaptrack, ends it at the loaded point, and prints the live heap (what
was allocated and not freed) summed by the innermost frame in this repository's code,
the number of live allocations (glibc adds about 16-20 bytes to each), and the peak
heap of the run (the first load's high-water mark, which glibc keeps as arena).

    unshare -n sh -c 'ip link set lo up && benches/scale/heap.py target/quick/aether-edge NAME'

heaptrack's figures are exact and do not depend on the machine's load, so two builds
can be compared one run each (quick builds have the release build's heap shapes).
Writes target/bench-profile/heap-NAME/{heap.zst,leaks.txt}. Needs heaptrack and
heaptrack_print; loopback only, bounded like measure.py. HEAP_SITES (default 40): how
many sites to print; HEAP_DEPTH (default 1): how many of the repository's frames name
a site.
"""
import collections, os, re, subprocess, sys, time

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
if len(sys.argv) != 3:
    sys.exit("usage: heap.py BIN NAME")
edge, name = sys.argv[1], sys.argv[2]
out = os.path.join(root, "target", "bench-profile", f"heap-{name}")
os.makedirs(out, exist_ok=True)
data = os.path.join(out, "heap")
for f in os.listdir(out):
    os.remove(os.path.join(out, f))

env = {**os.environ, "BREAKDOWN_WRAP": f"heaptrack -o {data}", "BREAKDOWN_KILL": "1"}
subprocess.run([sys.executable, os.path.join(here, "breakdown.py"), edge], env=env,
               stdout=subprocess.DEVNULL, check=True, timeout=600)
# heaptrack compresses after its child dies: wait until the file stops growing.
zst, last, deadline = data + ".zst", -1, time.time() + 120
while time.time() < deadline:
    size = os.path.getsize(zst) if os.path.exists(zst) else 0
    if size > 0 and size == last:
        break
    last = size
    time.sleep(2)

leaks = subprocess.run(["heaptrack_print", "-f", zst, "--print-leaks", "1", "--merge-backtraces", "0",
                        "-n", "100000", "-s", "100000"], capture_output=True, text=True, timeout=600).stdout
with open(os.path.join(out, "leaks.txt"), "w") as f:
    f.write(leaks)
summary = subprocess.run(["heaptrack_print", "-f", zst, "--print-peaks", "0", "--print-leaks", "0",
                          "--print-allocators", "0", "--print-temporary", "0"],
                         capture_output=True, text=True, timeout=600).stdout


def size(text):
    value, unit = re.match(r"([\d.]+)([KMG]?)", text).groups()
    return float(value) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit]


depth = int(os.environ.get("HEAP_DEPTH", "1"))
by_site, calls = collections.Counter(), collections.Counter()
total = count = 0
entry, frames = None, []


def flush():
    if entry is None:
        return
    own = [f for f in frames if re.match(r"(controller|proxy|src|tests)/", f[1])]
    site = " <- ".join(f"{fn}@{at}" for fn, at in own[:depth]) if own else "(outside the repository)"
    by_site[site] += entry[0]
    calls[site] += entry[1]


section = leaks[leaks.find("MEMORY LEAKS"):]
for line in section.split("\n")[1:]:
    m = re.match(r"^([\d.]+[KMG]?)B? leaked over (\d+) calls from", line)
    if m:
        flush()
        entry, frames = (size(m.group(1)), int(m.group(2))), []
        total += entry[0]
        count += entry[1]
        continue
    m = re.match(r"^  (\S.*)$", line)
    if m and entry:
        frames.append([m.group(1), ""])
        continue
    m = re.match(r"^    at (\S+)", line)
    if m and frames:
        frames[-1][1] = m.group(1)
flush()

peak = re.search(r"peak heap memory consumption: (\S+)", summary)
print(f"live heap {total / 2**20:.2f} MiB in {count} allocations; "
      f"peak heap {peak.group(1) if peak else '?'}B")
print("| KiB | allocations | site (innermost frame of this repository) |")
print("|---:|---:|---|")
for site, bytes_ in by_site.most_common(int(os.environ.get("HEAP_SITES", "40"))):
    print(f"| {bytes_ / 1024:.0f} | {calls[site]} | `{site}` |")

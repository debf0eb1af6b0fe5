#!/usr/bin/env python3
"""Where the resident set goes at measure.py's 5,000 routes: loads the same manifests,
then prints the process's mappings summed by kind (executable, libraries, thread
stacks, heap arenas) from /proc/PID/smaps, and glibc's malloc_stats() (through gdb,
when installed) to compare the bytes malloc hands out with what is resident.

    unshare -n sh -c 'ip link set lo up && benches/scale/breakdown.py target/quick/aether-edge'

BREAKDOWN_WRAP="heaptrack -o /tmp/ht" runs the edge under a wrapper (the wrapper's own
pages then count too); BREAKDOWN_TRIM=1 then calls malloc_trim(0) in
it (through gdb) and prints the resident set after. BREAKDOWN_KILL=1 ends it with SIGKILL at the loaded point, so
heaptrack's "leaked" figures are the heap live at that moment. Environment passed to
the edge as is (MALLOC_ARENA_MAX and the like). Loopback only, bounded like measure.py.
"""
import importlib.util, os, re, shlex, signal, subprocess, sys, tempfile, time

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("measure", os.path.join(here, "measure.py"))
m = importlib.util.module_from_spec(spec)
sys.argv = sys.argv[:2]
spec.loader.exec_module(m)
if os.environ.get("BREAKDOWN_WRAP"):
    m.DEADLINE = 180.0  # a profiler slows start-up and the load


def stack_pointers(pid):
    """Each thread's stack pointer (from /proc/PID/task/TID/syscall: threads sleep in a
    system call, whose line ends with the stack and program counters)."""
    sps = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/syscall") as f:
                fields = f.read().split()
            if len(fields) >= 3:
                sps.append(int(fields[-2], 16))
        except (OSError, ValueError):
            pass
    return sps


def smaps(pid):
    """[rss, anon, 0, count] in KiB per mapping kind."""
    kinds = {}
    exe = os.path.realpath(f"/proc/{pid}/exe")
    sps = stack_pointers(pid)
    cur = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                parts = line.split()
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                path = parts[5] if len(parts) > 5 else ""
                perms = parts[1]
                if path == exe or path.endswith("aether-edge"):
                    cur = "executable " + ("text" if "x" in perms else "data")
                elif path == "[heap]":
                    cur = "main arena ([heap])"
                elif path == "[stack]":
                    cur = "main thread stack"
                elif path.startswith("/"):
                    cur = "libraries"
                elif path.startswith("["):
                    cur = "kernel " + path
                elif any(lo <= sp < hi for sp in sps):
                    cur = "thread stacks"
                elif perms == "---p":
                    cur = "reserved, not accessible (arena tails, guards)"
                else:
                    cur = "anonymous: malloc arenas and large allocations"
                kinds.setdefault(cur, [0, 0, 0, 0])
                kinds[cur][3] += 1
            elif cur and line.startswith("Rss:"):
                kinds[cur][0] += int(line.split()[1])
            elif cur and line.startswith("Anonymous:"):
                kinds[cur][1] += int(line.split()[1])
    return kinds


def main():
    wrap = shlex.split(os.environ.get("BREAKDOWN_WRAP", ""))
    d = tempfile.mkdtemp(prefix="aether-breakdown-")
    mdir = os.path.join(d, "manifests")
    os.mkdir(mdir)
    m.write_atomically(os.path.join(mdir, "infra.yaml"), m.INFRA)
    procs = []
    try:
        procs.append(subprocess.Popen([m.EDGE, "echo", "--listen", f"{m.BACK}:{m.BACK_PORT}", "--name", "a"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        edge = subprocess.Popen(wrap + [m.EDGE, "run", "--manifests", mdir, "--admin", f"{m.ADMIN}:{m.ADMIN_PORT}",
                                        "--address-pool", f"{m.NET}.0/28"],
                                stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "edge.log"), "w"),
                                env={**os.environ, "RUST_LOG": "warn"})
        procs.append(edge)
        m.wait("readyz", lambda: m.get(m.ADMIN, m.ADMIN_PORT, "admin", "/readyz") == 200)
        m.wait("the listener", lambda: m.get(m.GW, m.PORT, "x", "/") == 404)
        time.sleep(1)
        pid = edge.pid
        if wrap:  # the edge is the wrapper's child
            out = subprocess.run(["pgrep", "-P", str(edge.pid)], capture_output=True, text=True).stdout.split()
            pid = int(out[-1]) if out else edge.pid
        idle = m.rss_kib(pid)
        idle_kinds = smaps(pid)
        routes = "".join(m.route(f"r{i}", f"h{i % m.HOSTS}.example.com", f"/r{i}") for i in range(m.ROUTES))
        m.write_atomically(os.path.join(mdir, "routes.yaml"), routes)
        last = m.ROUTES - 1
        m.wait("routes", lambda: m.get(m.GW, m.PORT, f"h{last % m.HOSTS}.example.com", f"/r{last}") == 200)
        # A few route changes, as measure.py makes before it reads RSS the second time.
        for i in range(20):
            m.write_atomically(os.path.join(mdir, f"new{i}.yaml"), m.route(f"new{i}", f"new{i}.example.com", "/"))
            m.wait("change", lambda: m.get(m.GW, m.PORT, f"new{i}.example.com", "/") == 200)
        time.sleep(1)
        print(f"pid {pid}; idle VmRSS {idle / 1024:.1f} MiB; loaded VmRSS {m.rss_kib(pid) / 1024:.1f} MiB; "
              f"threads {len(os.listdir(f'/proc/{pid}/task'))}")
        print("| mapping kind | count | Rss MiB | Anonymous MiB | idle Rss MiB |")
        print("|---|---|---|---|---|")
        for k, (rss, anon, _, n) in sorted(smaps(pid).items(), key=lambda kv: -kv[1][0]):
            was = idle_kinds.get(k, [0])[0]
            print(f"| {k} | {n} | {rss / 1024:.2f} | {anon / 1024:.2f} | {was / 1024:.2f} |")
        try:
            r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "call (void)malloc_stats()"],
                               capture_output=True, text=True, timeout=60)
            time.sleep(0.5)
            with open(os.path.join(d, "edge.log")) as f:
                stats = [l.rstrip() for l in f if re.match(r"^(Arena|system bytes|in use bytes|Total|max mmap)", l)]
            print("malloc_stats() (glibc: system = obtained from the kernel, in use = live):")
            print("\n".join("    " + l for l in stats) or "    (none: " + r.stderr[-300:] + ")")
        except (OSError, subprocess.TimeoutExpired) as e:
            print("gdb:", e)
        if os.environ.get("BREAKDOWN_TRIM"):
            # What glibc could give back now: the free pages between live allocations.
            subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "call (int)malloc_trim(0)"],
                           capture_output=True, text=True, timeout=60)
            print(f"after malloc_trim(0): VmRSS {m.rss_kib(pid) / 1024:.1f} MiB")
        if os.environ.get("BREAKDOWN_PAUSE"):
            print("paused; press enter"); sys.stdin.readline()
        if os.environ.get("BREAKDOWN_KILL"):
            os.kill(pid, signal.SIGKILL)
    finally:
        for p_ in procs:
            p_.terminate()
        for p_ in procs:
            try:
                p_.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p_.kill()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Scale figures for the targets in benches/RESULTS.md that are not about throughput: idle RSS, RSS with
5,000 HTTPRoutes over 1,000 hostnames, memory per idle keep-alive connection, the number
of Prometheus series at 5,000 routes, and route propagation (change on disk -> first
successful request) over 100 changes while a client keeps requesting an existing route.

    unshare -n sh -c 'ip link set lo up && benches/scale/measure.py target/release/aether-edge'

Environment: SCALE_ROUTES (default 5000) sets the number of routes; SCALE_LOG=FILE
writes the edge's log to FILE at debug level for the reconciler and publisher, whose
lines carry each change's `read_us`, `reconcile_us`, `publish_us` and the routes
compiled and attached again.

Standalone mode, loopback only (127.66.1.0/24). Bounded: fixed counts, every wait has a
deadline, and the processes are stopped at the end. Prints one Markdown block.
"""
import os, resource, shutil, socket, subprocess, sys, tempfile, threading, time, urllib.request

EDGE = sys.argv[1] if len(sys.argv) > 1 else "target/release/aether-edge"
NET = "127.66.1"
GW, BACK, ADMIN = f"{NET}.5", f"{NET}.251", f"{NET}.250"
PORT, BACK_PORT, ADMIN_PORT = 8080, 9000, 9901
ROUTES = int(os.environ.get("SCALE_ROUTES", "5000"))
HOSTS, CHANGES, IDLE_CONNS = 1000, 100, 1000
LOG = os.environ.get("SCALE_LOG")
DEADLINE = 30.0  # seconds any single wait may take

INFRA = f"""
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: aether}}
spec: {{controllerName: aether.io/edge}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: default}}
spec:
  gatewayClassName: aether
  addresses: [{{type: IPAddress, value: {GW}}}]
  listeners: [{{name: http, port: {PORT}, protocol: HTTP}}]
---
apiVersion: v1
kind: Service
metadata: {{name: svc, namespace: default}}
spec: {{ports: [{{name: http, port: 80}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: svc-1, namespace: default, labels: {{kubernetes.io/service-name: svc}}}}
addressType: IPv4
ports: [{{name: http, port: {BACK_PORT}}}]
endpoints: [{{addresses: ["{BACK}"]}}]
"""


def route(name, host, path):
    return f"""---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: default}}
spec:
  parentRefs: [{{name: edge}}]
  hostnames: ["{host}"]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: "{path}"}}}}]
    backendRefs: [{{name: svc, port: 80}}]
"""


def write_atomically(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, path)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def request(sock, host, path):
    """One HTTP/1.1 GET on an open socket; returns the status code."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-body")
        body += chunk
    return status


def connect(addr, port):
    s = socket.create_connection((addr, port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def get(addr, port, host, path):
    try:
        with connect(addr, port) as s:
            return request(s, host, path)
    except OSError:
        return 0


def wait(what, pred):
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.01)
    raise SystemExit(f"timed out waiting for {what}")


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    d = tempfile.mkdtemp(prefix="aether-scale-")
    m = os.path.join(d, "manifests")
    os.mkdir(m)
    write_atomically(os.path.join(m, "infra.yaml"), INFRA)
    # The executable's resident text depends on the folios its file is cached in (a
    # file just copied differs from one read back): start every run from disk.
    fd = os.open(EDGE, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    procs = []
    try:
        procs.append(subprocess.Popen([EDGE, "echo", "--listen", f"{BACK}:{BACK_PORT}", "--name", "a"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        log = open(LOG, "w") if LOG else subprocess.DEVNULL
        level = "warn,aether_edge=debug,aether_controller=debug" if LOG else "warn"
        edge = subprocess.Popen([EDGE, "run", "--manifests", m, "--admin", f"{ADMIN}:{ADMIN_PORT}",
                                 "--address-pool", f"{NET}.0/28"],
                                stdout=subprocess.DEVNULL, stderr=log,
                                env={**os.environ, "RUST_LOG": level})
        procs.append(edge)
        wait("readyz", lambda: get(ADMIN, ADMIN_PORT, "admin", "/readyz") == 200)
        wait("the listener", lambda: get(GW, PORT, "x", "/") == 404)
        time.sleep(1)
        idle = rss_kib(edge.pid)

        routes = "".join(route(f"r{i}", f"h{i % HOSTS}.example.com", f"/r{i}") for i in range(ROUTES))
        loaded_at = time.monotonic()
        write_atomically(os.path.join(m, "routes.yaml"), routes)
        last = ROUTES - 1
        wait(f"{ROUTES} routes", lambda: get(GW, PORT, f"h{last % HOSTS}.example.com", f"/r{last}") == 200)
        first_load = time.monotonic() - loaded_at
        time.sleep(1)
        loaded = rss_kib(edge.pid)

        text = urllib.request.urlopen(f"http://{ADMIN}:{ADMIN_PORT}/metrics", timeout=10).read()
        series = sum(1 for line in text.decode(errors="replace").splitlines()
                     if line and not line.startswith("#"))

        before = rss_kib(edge.pid)
        conns = []
        for i in range(IDLE_CONNS):
            s = connect(GW, PORT)
            if request(s, "h1.example.com", "/r1") != 200:
                raise SystemExit("an idle-connection warm-up request failed")
            conns.append(s)
        time.sleep(1)
        per_conn = (rss_kib(edge.pid) - before) * 1024 / IDLE_CONNS
        # Idle a while longer: the relay gives back an idle connection's buffers after
        # 500 ms, and the control plane trims freed memory once a second.
        time.sleep(2)
        per_conn_idle = (rss_kib(edge.pid) - before) * 1024 / IDLE_CONNS
        for s in conns:
            s.close()

        # Propagation: a client keeps requesting an existing route while routes are added.
        stop = threading.Event()
        counts = {"ok": 0, "failed": 0}

        def background():
            s = None
            end = time.monotonic() + 120
            while not stop.is_set() and time.monotonic() < end:
                try:
                    s = s or connect(GW, PORT)
                    if request(s, "h7.example.com", "/r7") == 200:
                        counts["ok"] += 1
                    else:
                        counts["failed"] += 1
                except OSError:
                    counts["failed"] += 1
                    s = None

        t = threading.Thread(target=background)
        t.start()
        lat = []
        for i in range(CHANGES):
            host = f"new{i}.example.com"
            changed = time.monotonic()
            write_atomically(os.path.join(m, f"new{i}.yaml"), route(f"new{i}", host, "/"))
            probe = connect(GW, PORT)
            end = changed + DEADLINE
            while True:
                try:
                    if request(probe, host, "/") == 200:
                        break
                except OSError:
                    probe = connect(GW, PORT)
                if time.monotonic() > end:
                    raise SystemExit(f"change {i} never became visible")
            lat.append((time.monotonic() - changed) * 1000)
            probe.close()
        stop.set()
        t.join()
        lat.sort()
        p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
        print("| figure | value |")
        print("|---|---|")
        print(f"| idle RSS (one Gateway, no routes) | {idle / 1024:.1f} MiB |")
        print(f"| RSS with {ROUTES} HTTPRoutes over {HOSTS} hostnames | {loaded / 1024:.1f} MiB |")
        print(f"| first load of {ROUTES} routes (write -> last route answers) | {first_load * 1000:.0f} ms |")
        print(f"| memory per idle keep-alive connection ({IDLE_CONNS} connections, 1 s / 3 s after their requests) | {per_conn / 1024:.1f} / {per_conn_idle / 1024:.1f} KiB |")
        print(f"| Prometheus series at {ROUTES} routes | {series} |")
        print(f"| route propagation over {CHANGES} changes (p50 / p99 / max) | {p(0.5):.1f} / {p(0.99):.1f} / {lat[-1]:.1f} ms |")
        print(f"| background requests during the changes (ok / failed) | {counts['ok']} / {counts['failed']} |")
    finally:
        for p_ in procs:
            p_.terminate()
        for p_ in procs:
            try:
                p_.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p_.kill()
        # The manifests folder: left behind, runs filled /tmp (a disk CI shares).
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()

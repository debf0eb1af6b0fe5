#!/usr/bin/env python3
"""Runs an instrumented edge through what every edge does: start-up, a first load of
routes, HTTP/1.1, h2c and HTTPS requests, the admin endpoints, a change and its undo,
then a clean stop (the profile is written at exit). `link-order.sh` makes the link
order from the profile this leaves.

Usage: link_order_run.py BIN (run inside a fresh network namespace: it binds
127.66.2.0/24 on loopback).
"""
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

# The scale benchmark's route shape and atomic write, not copies of them.
from measure import route, write_atomically as put

NET = "127.66.2"
GW, BACK, ADMIN = f"{NET}.5", f"{NET}.251", f"{NET}.250"

INFRA = f"""apiVersion: gateway.networking.k8s.io/v1
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
  listeners:
  - {{name: http, port: 8080, protocol: HTTP}}
  - name: https
    port: 8443
    protocol: HTTPS
    tls: {{certificateRefs: [{{name: cert}}]}}
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
ports: [{{name: http, port: 9000}}]
endpoints: [{{addresses: ["{BACK}"]}}]
"""


def secret(d):
    key, crt = os.path.join(d, "k.pem"), os.path.join(d, "c.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", key, "-out", crt, "-days", "1", "-subj", "/CN=h1.example.com",
         "-addext", "subjectAltName=DNS:*.example.com"],
        check=True, capture_output=True)
    indent = lambda p: "".join("    " + line for line in open(p))
    return f"""---
apiVersion: v1
kind: Secret
metadata: {{name: cert, namespace: default}}
type: kubernetes.io/tls
stringData:
  tls.crt: |
{indent(crt)}  tls.key: |
{indent(key)}"""


def get(url, host, context=None):
    try:
        req = urllib.request.Request(url, headers={"Host": host})
        return urllib.request.urlopen(req, timeout=30, context=context).status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def wait(what, cond, limit=120):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def write_touched(pid, out):
    """Writes the file offsets of the executable's code pages the edge has mapped (with
    fault-around off and a cold page cache: the pages it executed)."""
    exe = os.readlink(f"/proc/{pid}/exe")
    page = os.sysconf("SC_PAGE_SIZE")
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pagemap, \
            open(out, "w") as o:
        for line in maps:
            fields = line.split()
            if len(fields) < 6 or fields[5] != exe or "x" not in fields[1]:
                continue
            start, end = (int(a, 16) for a in fields[0].split("-"))
            offset = int(fields[2], 16)
            pagemap.seek(start // page * 8)
            entries = pagemap.read((end - start) // page * 8)
            for i in range(len(entries) // 8):
                if int.from_bytes(entries[i * 8:i * 8 + 8], "little") >> 63:
                    o.write(f"{offset + i * page}\n")


def serve_and_change(m, http, tls):
    """Routes, requests of every kind, the admin endpoints, a change and its undo."""
    routes = "".join(route(f"r{i}", f"h{i % 100}.example.com", f"/r{i}") for i in range(500))
    put(os.path.join(m, "routes.yaml"), routes)
    wait("routes", lambda: get(f"{http}/r499", "h99.example.com") == 200)
    # Many requests, so the serving path's counts stand above start-up's.
    for i in range(300):
        get(f"{http}/r{i % 100}", f"h{i % 100}.example.com")
        get(f"https://{GW}:8443/r{i % 100}", f"h{i % 100}.example.com", tls)
    # curl's -o names one URL's output; the rest are dropped by stdout=DEVNULL.
    h2 = ["curl", "-s", "-o", "/dev/null", "--http2-prior-knowledge", "-H", "Host: h1.example.com"]
    subprocess.run(h2 + [f"{http}/r1"] * 50, timeout=60, check=False, stdout=subprocess.DEVNULL)
    h2tls = ["curl", "-s", "-k", "-o", "/dev/null", "--http2", "--resolve", f"h1.example.com:8443:{GW}"]
    subprocess.run(h2tls + ["https://h1.example.com:8443/r1"] * 50, timeout=60, check=False, stdout=subprocess.DEVNULL)
    post = ["curl", "-s", "-o", "/dev/null", "-H", "Host: h2.example.com", "-d", "x" * 5000]
    subprocess.run(post + [f"{http}/r2"] * 20, timeout=60, check=False, stdout=subprocess.DEVNULL)
    for p in ["/metrics", "/status", "/readyz", "/healthz"]:
        get(f"http://{ADMIN}:9901{p}", "a")
    put(os.path.join(m, "more.yaml"), route("extra", "extra.example.com", "/"))
    wait("change", lambda: get(f"{http}/", "extra.example.com") == 200)
    os.remove(os.path.join(m, "more.yaml"))
    wait("removal", lambda: get(f"{http}/", "extra.example.com") == 404)
    get(f"{http}/", "nope.example.com")


def main():
    binary = sys.argv[1]
    d = tempfile.mkdtemp()
    m = os.path.join(d, "m")
    os.mkdir(m)
    put(os.path.join(m, "infra.yaml"), INFRA + secret(d))
    echo = subprocess.Popen([binary, "echo", "--listen", f"{BACK}:9000", "--name", "a"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # RUST_LOG as the chart always sets it (`logLevel`): the filter read from the
    # environment is other code than the built-in default.
    edge = subprocess.Popen([binary, "run", "--manifests", m, "--admin", f"{ADMIN}:9901",
                             "--address-pool", f"{NET}.0/28"], stdout=subprocess.DEVNULL,
                            env={**os.environ, "RUST_LOG": "info"})
    http = f"http://{GW}:8080"
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    try:
        wait("readyz", lambda: get(f"http://{ADMIN}:9901/readyz", "a") == 200)
        wait("listener", lambda: get(f"{http}/", "x") == 404)
        if os.environ.get("LINK_ORDER_IDLE"):
            # What an idle edge runs: start-up, its first load, a scrape, its timers.
            get(f"http://{ADMIN}:9901/metrics", "a")
            time.sleep(3)
        else:
            serve_and_change(m, http, tls)
        if os.environ.get("LINK_ORDER_TOUCHED"):
            write_touched(edge.pid, os.environ["LINK_ORDER_TOUCHED"])
    finally:
        edge.send_signal(signal.SIGTERM)
        try:
            edge.wait(timeout=60)
        except subprocess.TimeoutExpired:
            edge.kill()
        echo.send_signal(signal.SIGTERM)
        echo.wait(timeout=60)
    if edge.returncode != 0:
        raise SystemExit(f"the edge exited with {edge.returncode}: no profile")


if __name__ == "__main__":
    main()

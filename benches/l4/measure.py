#!/usr/bin/env python3
"""L4 forwarding numbers on loopback: TCP bulk throughput, TCP connection round trips
and UDP datagram round trips, direct to the backend and through aether-edge
(TCPRoute/UDPRoute). Backends and clients are this script (Python), so the numbers say
how much the edge adds, not what it can do against a fast client.

    unshare -n sh -c 'ip link set lo up && benches/l4/measure.py target/release/aether-edge'

Bounded: fixed byte counts and iteration counts; the edge is stopped at the end.
"""
import os, socket, subprocess, sys, tempfile, threading, time, urllib.request

EDGE = sys.argv[1] if len(sys.argv) > 1 else "target/release/aether-edge"
GW, BACK, ADMIN = "127.66.0.5", "127.66.0.251", "127.66.0.250:9901"
TCP_PORT, UDP_PORT, BACK_PORT = 7000, 7000, 7100
BULK = 1 << 30  # bytes per bulk run
CONNS, DGRAMS = 2000, 20000

MANIFESTS = f"""
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
  listeners:
  - {{name: tcp, port: {TCP_PORT}, protocol: TCP}}
  - {{name: udp, port: {UDP_PORT}, protocol: UDP}}
---
apiVersion: v1
kind: Service
metadata: {{name: b, namespace: default}}
spec: {{ports: [{{name: p, port: 80}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: b-1, namespace: default, labels: {{kubernetes.io/service-name: b}}}}
addressType: IPv4
ports: [{{name: p, port: {BACK_PORT}}}]
endpoints: [{{addresses: ["{BACK}"]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {{name: t, namespace: default}}
spec:
  parentRefs: [{{name: edge, sectionName: tcp}}]
  rules: [{{backendRefs: [{{name: b, port: 80}}]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: UDPRoute
metadata: {{name: u, namespace: default}}
spec:
  parentRefs: [{{name: edge, sectionName: udp}}]
  rules: [{{backendRefs: [{{name: b, port: 80}}]}}]
"""


def tcp_backend():
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((BACK, BACK_PORT))
    srv.listen(512)

    def conn(c):
        buf = bytearray(1 << 18)
        with c:
            while True:
                n = c.recv_into(buf)
                if n == 0:
                    return
                if n < 64:  # small messages are echoed, bulk is discarded
                    c.sendall(buf[:n])

    def loop():
        while True:
            c, _ = srv.accept()
            threading.Thread(target=conn, args=(c,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()


def udp_backend():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((BACK, BACK_PORT))

    def loop():
        while True:
            d, a = s.recvfrom(2048)
            s.sendto(d, a)

    threading.Thread(target=loop, daemon=True).start()


def bulk(addr):
    s = socket.create_connection(addr)
    chunk = b"x" * (1 << 18)
    t = time.perf_counter()
    sent = 0
    while sent < BULK:
        s.sendall(chunk)
        sent += len(chunk)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)  # EOF once the backend has read everything
    dt = time.perf_counter() - t
    s.close()
    return BULK / dt / 1e9


def conns(addr):
    lat = []
    for _ in range(CONNS):
        t = time.perf_counter()
        s = socket.create_connection(addr)
        s.sendall(b"ping")
        s.recv(16)
        s.close()
        lat.append(time.perf_counter() - t)
    lat.sort()
    return lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6


def dgrams(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    lat = []
    for _ in range(DGRAMS):
        t = time.perf_counter()
        s.sendto(b"ping", addr)
        s.recvfrom(64)
        lat.append(time.perf_counter() - t)
    lat.sort()
    return lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6


def main():
    tcp_backend()
    udp_backend()
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "m.yaml"), "w") as f:
        f.write(MANIFESTS)
    edge = subprocess.Popen([EDGE, "run", "--manifests", d, "--admin", ADMIN,
                             "--address-pool", "127.66.0.0/28"],
                            stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://{ADMIN}/readyz", timeout=1)
                socket.create_connection((GW, TCP_PORT), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        for name, addr in (("direct", (BACK, BACK_PORT)), ("aether-edge", (GW, TCP_PORT))):
            gbs = bulk(addr)
            p50, p99 = conns(addr)
            u50, u99 = dgrams(addr)
            print(f"{name:12} TCP bulk {gbs:5.2f} GB/s | new connection + 4-byte round trip "
                  f"p50 {p50:6.0f} us p99 {p99:6.0f} us | UDP round trip p50 {u50:5.0f} us p99 {u99:5.0f} us")
    finally:
        edge.terminate()
        edge.wait(timeout=40)


main()

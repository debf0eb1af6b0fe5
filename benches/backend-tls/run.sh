#!/usr/bin/env bash
# BackendTLSPolicy benchmark: the same aether-edge process, the same nginx upstream, two
# routes:
#   plain  edge -> upstream over HTTP/1.1 (pooled keep-alive)
#   tls    edge -> upstream over TLS 1.3 (a BackendTLSPolicy: CA from a ConfigMap, SNI,
#          hostname verified; pooled keep-alive TLS connections)
# so "tls" costs the edge's TLS client side (and nginx's server side, on the other CPU).
#
#   unshare -n sh -c 'ip link set lo up && benches/backend-tls/run.sh'   (own loopback)
#
# Upstream: nginx answering 200 "ok" from memory (1 worker). Load: wrk, HTTP/1.1
# keep-alive, BENCH_CONNECTIONS [64] connections, BENCH_DURATION [5] s per measurement,
# BENCH_ROUNDS [3] interleaved rounds, medians. Pinning (BENCH_PIN [1]): aether-edge on
# CPU 1 (`--workers 1`); wrk and nginx on CPU 0. Appends a section to
# benches/backend-tls/RESULTS.md unless BENCH_RECORD=0. About 1 minute.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
DURATION=${BENCH_DURATION:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CONNS=${BENCH_CONNECTIONS:-64}
PIN=${BENCH_PIN:-1}
RECORD=${BENCH_RECORD:-1}
BIN=${AETHER_BIN:-$root/target/release/aether-edge}
run=$root/target/bench-backend-tls/$(date -u +%Y%m%dT%H%M%S)
mkdir -p "$run"

die() { echo "backend-tls bench: $*" >&2; exit 1; }
command -v wrk >/dev/null || die "wrk missing (apt-get install wrk)"
command -v nginx >/dev/null || die "nginx missing (apt-get install nginx)"
if [[ -z ${AETHER_BIN:-} ]]; then
  (cd "$root" && cargo build --release --locked --bin aether-edge)
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
pin() { if [[ $PIN == 1 ]]; then taskset -c "$1" "${@:2}"; else "${@:2}"; fi; }
start() { if [[ $PIN == 1 ]]; then taskset -c "$1" "${@:2}" & else "${@:2}" & fi; pids+=($!); }

UP=127.0.0.2 GW=127.0.0.3 ADMIN=127.0.0.3:9901 NAME=upstream.bench.test
cd "$run"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=ca \
  -keyout ca.key -out ca.crt -addext basicConstraints=critical,CA:TRUE -addext keyUsage=keyCertSign,cRLSign 2>/dev/null
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$NAME" -keyout up.key -out up.csr 2>/dev/null
printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:%s\n' "$NAME" >up.ext
openssl x509 -req -in up.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile up.ext -out up.crt 2>/dev/null

cat >nginx.conf <<NGINX
daemon off; worker_processes 1; pid $run/nginx.pid; error_log $run/nginx.err warn;
events { worker_connections 4096; }
http { access_log off; client_body_temp_path $run; proxy_temp_path $run; fastcgi_temp_path $run;
  uwsgi_temp_path $run; scgi_temp_path $run; keepalive_requests 1000000;
  server { listen $UP:19000; location / { return 200 "ok\n"; } }
  server { listen $UP:19443 ssl; ssl_certificate $run/up.crt; ssl_certificate_key $run/up.key;
    ssl_protocols TLSv1.3; location / { return 200 "ok\n"; } } }
NGINX
mkdir -p manifests
{
  cat <<YAML
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: aether}
spec: {controllerName: aether.io/edge}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: default}
spec:
  gatewayClassName: aether
  addresses: [{type: IPAddress, value: $GW}]
  listeners: [{name: http, port: 8080, protocol: HTTP}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: upstream-ca, namespace: default}
data:
  ca.crt: |
$(sed 's/^/    /' ca.crt)
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: tls, namespace: default}
spec:
  targetRefs: [{group: "", kind: Service, name: tls}]
  validation:
    hostname: $NAME
    caCertificateRefs: [{group: "", kind: ConfigMap, name: upstream-ca}]
YAML
  for svc in plain tls; do
    port=19000
    [[ $svc == tls ]] && port=19443
    cat <<YAML
---
apiVersion: v1
kind: Service
metadata: {name: $svc, namespace: default}
spec: {ports: [{name: http, port: 80, targetPort: $port}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: $svc-1, namespace: default, labels: {kubernetes.io/service-name: $svc}}
addressType: IPv4
ports: [{name: http, port: $port}]
endpoints: [{addresses: ["$UP"], conditions: {ready: true}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: $svc, namespace: default}
spec:
  parentRefs: [{name: edge}]
  hostnames: [$svc.example]
  rules: [{backendRefs: [{name: $svc, port: 80}]}]
YAML
  done
} >manifests/bench.yaml

start 0 nginx -c "$run/nginx.conf" -p "$run" >nginx.log 2>&1
start 1 env RUST_LOG=warn "$BIN" run --workers 1 --manifests manifests --admin $ADMIN >edge.log 2>&1
for _ in $(seq 100); do
  curl -fsS -H 'Host: tls.example' "http://$GW:8080/" >/dev/null 2>&1 && curl -fsS -H 'Host: plain.example' "http://$GW:8080/" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS -H 'Host: tls.example' "http://$GW:8080/" >/dev/null || { cat edge.log nginx.err; die "tls route does not answer"; }

measure() { # target round -> "req/s p50_us p99_us non2xx"
  pin 0 timeout $((DURATION + 10)) wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -H "Host: $1.example" "http://$GW:8080/" >"wrk-$1-$2.txt"
  awk '
    function us(v) { if (v ~ /us$/) return v+0; if (v ~ /ms$/) return (v+0)*1000; if (v ~ /s$/) return (v+0)*1000000; return v }
    /Requests\/sec/ { rps=$2 } $1=="50%" { p50=us($2) } $1=="99%" { p99=us($2) }
    /Non-2xx/ { bad=$NF } END { printf "%d %d %d %d\n", rps, p50, p99, bad+0 }' "wrk-$1-$2.txt"
}
declare -A results
for t in plain tls; do measure "$t" warm >/dev/null; done
for r in $(seq "$ROUNDS"); do
  for t in plain tls; do results[$t]+="$(measure "$t" "$r");"; done
done
median() { tr ';' '\n' | grep . | sort -n -k"$1" | awk -v k="$1" '{a[NR]=$k} END {print a[int((NR+1)/2)]}'; }
tls_errors=$(curl -fsS "http://$ADMIN/metrics" | awk '/^aether_upstream_tls_errors_total/ {s+=$NF} END {print s+0}')
table="| route | req/s | p50 | p99 | non-2xx | req/s per round |
|---|---:|---:|---:|---:|---|"
for t in plain tls; do
  rows=${results[$t]}
  rps=$(echo "$rows" | median 1) p50=$(echo "$rows" | median 2) p99=$(echo "$rows" | median 3)
  bad=$(echo "$rows" | tr ';' '\n' | awk '{s+=$4} END {print s+0}')
  per=$(echo "$rows" | tr ';' '\n' | awk 'NF {printf "%s%s", sep, $1; sep=", "}')
  table+="
| $t | $rps | ${p50} µs | ${p99} µs | $bad | $per |"
done
section="## Run of $(date -u '+%Y-%m-%d %H:%M') UTC

Machine: $(nproc) CPUs, $(uname -r). aether-edge $(git -C "$root" rev-parse --short HEAD) release, nginx upstream (TLS 1.3 for the tls route), wrk $CONNS keep-alive connections, ${DURATION}s x $ROUNDS interleaved rounds (medians), pinning $PIN, load average $(cut -d' ' -f1-3 /proc/loadavg). Upstream TLS handshake failures over the run: $tls_errors.

$table
"
echo "$section"
if [[ $RECORD == 1 ]]; then
  # shellcheck disable=SC2016 # the backticks are Markdown
  [[ -f $here/RESULTS.md ]] || printf '# BackendTLSPolicy benchmark results\n\nAppended by `benches/backend-tls/run.sh`, newest last.\n\n' >"$here/RESULTS.md"
  printf '%s\n' "$section" >>"$here/RESULTS.md"
fi

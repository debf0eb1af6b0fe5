#!/usr/bin/env bash
# Mesh-mode benchmark: the same aether-edge process, the same upstream, three routes:
#   plain  edge -> upstream directly (HTTP/1.1 pool; the Service opts out of the mesh)
#   mesh   edge -> mTLS HTTP/2 -> Envoy 1.40 inbound listener at pod_ip:15008 -> upstream
#   hop    edge -> plain HTTP/1.1 -> the same Envoy (a cleartext listener) -> upstream
# so "mesh" costs the edge's TLS + HTTP/2 client side and the inbound Envoy hop, which
# is what a mesh pod's traffic really pays; "hop" pays the Envoy hop without mTLS, so
# mesh against hop is the edge's mesh side with the inbound's cost on both. The edge's
# own CPU per request (its utime + stime over the requests wrk counted) is reported for
# each route: with Envoy sharing the load generator's core, req/s measures Envoy.
#
#   unshare -n sh -c 'ip link set lo up && benches/mesh/run.sh'   (own loopback: no port clashes)
#
# Upstream: nginx answering 200 "ok" from memory (1 worker). Load: wrk, HTTP/1.1
# keep-alive, BENCH_CONNECTIONS [64] connections, BENCH_DURATION [5] s per measurement,
# BENCH_ROUNDS [3] interleaved rounds (plain, mesh, plain, ...), medians reported.
# Pinning (BENCH_PIN [1]): aether-edge on CPU 1 (`--workers 1`); wrk, nginx and
# Envoy on CPU 0. Certificates: openssl, a throwaway CA and SPIFFE X.509-SVIDs.
# Appends a section to benches/mesh/RESULTS.md unless BENCH_RECORD=0. About 1 minute.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
DURATION=${BENCH_DURATION:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CONNS=${BENCH_CONNECTIONS:-64}
PIN=${BENCH_PIN:-1}
RECORD=${BENCH_RECORD:-1}
ENVOY=${AETHER_ENVOY:-$root/target/bench-tools/envoy-1.40.0/bin/envoy}
BIN=${AETHER_BIN:-$root/target/release/aether-edge}
run=$root/target/bench-mesh/$(date -u +%Y%m%dT%H%M%S)
mkdir -p "$run"

die() { echo "mesh bench: $*" >&2; exit 1; }
[[ -x $ENVOY ]] || die "no Envoy at $ENVOY (.ci/run or benches/load/run.sh installs it)"
command -v wrk >/dev/null || die "wrk missing (apt-get install wrk)"
command -v nginx >/dev/null || die "nginx missing (apt-get install nginx)"
if [[ -z ${AETHER_BIN:-} ]]; then
  (cd "$root" && cargo build --release --locked --bin aether-edge)
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
pin() { if [[ $PIN == 1 ]]; then taskset -c "$1" "${@:2}"; else "${@:2}"; fi; }
# Starts a pinned background process in this shell, so its pid is the process's own
# (taskset execs) and cleanup can stop it.
start() { if [[ $PIN == 1 ]]; then taskset -c "$1" "${@:2}" & else "${@:2}" & fi; pids+=($!); }

POD=127.0.0.2 GW=127.0.0.3 ADMIN=127.0.0.3:9901 TD=bench.test
# PKI: CA, the edge's SVID, the pod's SVID (URI SANs, CA:FALSE, both EKUs).
cd "$run"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=ca \
  -keyout ca.key -out ca.crt -addext basicConstraints=critical,CA:TRUE -addext keyUsage=keyCertSign,cRLSign 2>/dev/null
svid() { # name spiffe-id
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" -keyout "$1.key.sec1" -out "$1.csr" 2>/dev/null
  openssl pkcs8 -topk8 -nocrypt -in "$1.key.sec1" -out "$1.key"
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=URI:%s\n' "$2" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
}
svid edge "spiffe://$TD/ns/edge/sa/aether-edge"
svid pod "spiffe://$TD/ns/default/sa/app"

cat >nginx.conf <<NGINX
daemon off; worker_processes 1; pid $run/nginx.pid; error_log $run/nginx.err warn;
events { worker_connections 4096; }
http { access_log off; client_body_temp_path $run; proxy_temp_path $run; fastcgi_temp_path $run;
  uwsgi_temp_path $run; scgi_temp_path $run; keepalive_requests 1000000;
  server { listen $POD:19000; location / { return 200 "ok\n"; } } }
NGINX
cat >envoy.yaml <<ENVOY
admin: {address: {socket_address: {address: $POD, port_value: 15000}}}
static_resources:
  listeners:
  - name: inbound
    address: {socket_address: {address: $POD, port_value: 15008}}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          require_client_certificate: true
          common_tls_context:
            tls_params: {tls_minimum_protocol_version: TLSv1_3}
            alpn_protocols: [h2]
            tls_certificates: [{certificate_chain: {filename: $run/pod.crt}, private_key: {filename: $run/pod.key}}]
            validation_context:
              trusted_ca: {filename: $run/ca.crt}
              match_typed_subject_alt_names: [{san_type: URI, matcher: {prefix: "spiffe://$TD/"}}]
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: inbound
          codec_type: HTTP2
          forward_client_cert_details: SANITIZE_SET
          set_current_client_cert_details: {uri: true}
          route_config: {virtual_hosts: [{name: all, domains: ["*"], routes: [{match: {prefix: "/"}, route: {cluster: workload}}]}]}
          http_filters: [{name: envoy.filters.http.router, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}]
  - name: hop
    address: {socket_address: {address: $POD, port_value: 15001}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: hop
          route_config: {virtual_hosts: [{name: all, domains: ["*"], routes: [{match: {prefix: "/"}, route: {cluster: pod}}]}]}
          http_filters: [{name: envoy.filters.http.router, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}]
  clusters:
  - {name: workload, type: ORIGINAL_DST, lb_policy: CLUSTER_PROVIDED, connect_timeout: 2s, original_dst_lb_config: {use_http_header: true}}
  - name: pod
    type: STATIC
    connect_timeout: 2s
    load_assignment: {cluster_name: pod, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: $POD, port_value: 19000}}}}]}]}
ENVOY
mkdir -p manifests
cat >manifests/bench.yaml <<YAML
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
kind: Pod
metadata: {name: pod, namespace: default}
spec: {serviceAccountName: app, containers: [{name: app, image: app}]}
YAML
for svc in plain mesh hop; do
  annotations="" port=19000
  [[ $svc != mesh ]] && annotations="annotations: {aether.io/mesh: disabled}"
  [[ $svc == hop ]] && port=15001
  cat >>manifests/bench.yaml <<YAML
---
apiVersion: v1
kind: Service
metadata: {name: $svc, namespace: default, $annotations}
spec: {ports: [{name: http, port: 80, targetPort: $port}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: $svc-1, namespace: default, labels: {kubernetes.io/service-name: $svc}}
addressType: IPv4
ports: [{name: http, port: $port}]
endpoints: [{addresses: ["$POD"], conditions: {ready: true}, targetRef: {kind: Pod, name: pod, namespace: default}}]
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

"$ENVOY" --mode validate -c envoy.yaml >validate.log 2>&1 || { cat validate.log; die "envoy config invalid"; }
start 0 nginx -c "$run/nginx.conf" -p "$run" >nginx.log 2>&1
start 0 "$ENVOY" -c envoy.yaml --concurrency 1 --disable-hot-restart -l warning >envoy.log 2>&1
start 1 env RUST_LOG=warn "$BIN" run --workers 1 --manifests manifests --admin $ADMIN --mesh \
  --mesh-svid-cert edge.crt --mesh-svid-key edge.key --mesh-bundle ca.crt >edge.log 2>&1
edge=${pids[-1]}
for _ in $(seq 100); do
  curl -fsS -H 'Host: mesh.example' "http://$GW:8080/" >/dev/null 2>&1 && curl -fsS -H 'Host: plain.example' "http://$GW:8080/" >/dev/null 2>&1 && break
  sleep 0.1
done
for t in mesh hop; do
  curl -fsS -H "Host: $t.example" "http://$GW:8080/" >/dev/null || { cat edge.log envoy.log; die "$t route does not answer"; }
done

# The edge's user + system CPU time so far, in clock ticks.
edge_ticks() { awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$edge/stat"; }
measure() { # target round -> "req/s p50_us p99_us non2xx edge_us_per_request"
  local before after
  before=$(edge_ticks)
  pin 0 timeout $((DURATION + 10)) wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -H "Host: $1.example" "http://$GW:8080/" >"wrk-$1-$2.txt"
  after=$(edge_ticks)
  awk -v ticks=$((after - before)) -v hz="$(getconf CLK_TCK)" '
    function us(v) { if (v ~ /us$/) return v+0; if (v ~ /ms$/) return (v+0)*1000; if (v ~ /s$/) return (v+0)*1000000; return v }
    /Requests\/sec/ { rps=$2 } $1=="50%" { p50=us($2) } $1=="99%" { p99=us($2) }
    / requests in / { n=$1 }
    /Non-2xx/ { bad=$NF } END { printf "%d %d %d %d %.1f\n", rps, p50, p99, bad+0, (n > 0 ? ticks / hz * 1e6 / n : 0) }' "wrk-$1-$2.txt"
}
targets="plain mesh hop"
declare -A results
for t in $targets; do measure "$t" warm >/dev/null; done
for r in $(seq "$ROUNDS"); do
  for t in $targets; do results[$t]+="$(measure "$t" "$r");"; done
done
median() { tr ';' '\n' | grep . | sort -n -k"$1" | awk -v k="$1" '{a[NR]=$k} END {print a[int((NR+1)/2)]}'; }
conns=$(curl -fsS "http://$POD:15000/stats?filter=^http.inbound.downstream_cx_total$" | awk '{print $2}')
table="| route | req/s | p50 | p99 | non-2xx | edge CPU per request | req/s per round |
|---|---:|---:|---:|---:|---:|---|"
for t in $targets; do
  rows=${results[$t]}
  rps=$(echo "$rows" | median 1) p50=$(echo "$rows" | median 2) p99=$(echo "$rows" | median 3)
  cpu=$(echo "$rows" | median 5)
  bad=$(echo "$rows" | tr ';' '\n' | awk '{s+=$4} END {print s+0}')
  per=$(echo "$rows" | tr ';' '\n' | awk 'NF {printf "%s%s", sep, $1; sep=", "}')
  table+="
| $t | $rps | ${p50} µs | ${p99} µs | $bad | ${cpu} µs | $per |"
done
section="## Run of $(date -u '+%Y-%m-%d %H:%M') UTC

Machine: $(nproc) CPUs, $(uname -r). aether-edge $(git -C "$root" rev-parse --short HEAD) release, Envoy $("$ENVOY" --version | grep -o '1\.[0-9]*\.[0-9]*' | head -1), nginx upstream, wrk $CONNS keep-alive connections, ${DURATION}s x $ROUNDS interleaved rounds (medians), pinning $PIN, load average $(cut -d' ' -f1-3 /proc/loadavg).
Connections the inbound Envoy accepted from the edge over the whole run: $conns.

$table
"
echo "$section"
if [[ $RECORD == 1 ]]; then
  # shellcheck disable=SC2016 # the backticks are Markdown
  [[ -f $here/RESULTS.md ]] || printf '# Mesh-mode benchmark results\n\nAppended by `benches/mesh/run.sh`, newest last.\n\n' >"$here/RESULTS.md"
  printf '%s\n' "$section" >>"$here/RESULTS.md"
fi

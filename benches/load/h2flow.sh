#!/usr/bin/env bash
# HTTP/2 flow control through aether-edge: large bodies, where window and frame sizes
# matter (the load benchmark's 24-byte answers never fill a window). Two builds in
# interleaved rounds, same upstream, same load:
#
#   AETHER_BIN=new AETHER_BASE_BIN=old benches/load/h2flow.sh
#
# Scenarios, all h2c from the client (h2load -c CONNS -m STREAMS):
#   down-h1   GET of a BODY_KIB answer from an HTTP/1.1 upstream
#   down-h2   the same from an h2c upstream (Service appProtocol kubernetes.io/h2c)
#   up-h2     PUT of a BODY_KIB body to an h2c upstream that reads it whole (WebDAV
#             PUT to a file: an upstream that answers without reading, like nginx's
#             `return`, resets the stream and the bytes sent depend on the windows)
# Upstream: nginx, one worker, on CPU 0 with the load generator; the proxy on CPU 1.
# Environment: BENCH_ROUNDS [3], BENCH_REQUESTS [2000], BENCH_BODY_KIB [1024],
# BENCH_CONNS [4], BENCH_STREAMS [8], BENCH_PORT_BASE [28500]. Prints req/s and the
# proxy's CPU per request, medians; records nothing.
set -euo pipefail

ROUNDS=${BENCH_ROUNDS:-3}
REQUESTS=${BENCH_REQUESTS:-2000}
BODY_KIB=${BENCH_BODY_KIB:-1024}
CONNS=${BENCH_CONNS:-4}
STREAMS=${BENCH_STREAMS:-8}
PORT=${BENCH_PORT_BASE:-28500}
: "${AETHER_BIN:?set AETHER_BIN}" "${AETHER_BASE_BIN:?set AETHER_BASE_BIN}"

run=$(mktemp -d /tmp/h2flow.XXXXXX)
# nginx workers run as another user: they read the files and write the temp dir.
chmod 755 "$run"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ -n ${KEEP_RUN:-} ]] || rm -rf "$run"
}
trap cleanup EXIT

up_h1=$PORT up_h2=$((PORT + 1))
head -c $((BODY_KIB * 1024)) /dev/zero >"$run/big"
head -c $((BODY_KIB * 1024)) /dev/zero >"$run/upload"
mkdir -p "$run/tmp" "$run/dav" && chmod 777 "$run/tmp" "$run/dav" && chmod 644 "$run/big" "$run/upload"
cat >"$run/nginx.conf" <<EOF
daemon off;
worker_processes 1;
pid $run/nginx.pid;
error_log $run/nginx.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $run/tmp;
  keepalive_requests 10000000;
  client_max_body_size 0;
  server {
    listen 127.0.0.1:$up_h1;
    listen 127.0.0.1:$up_h2 http2;
    location = /big { alias $run/big; }
    location = /up { root $run/dav; dav_methods PUT; }
  }
}
EOF
taskset -c 0 nginx -c "$run/nginx.conf" -e "$run/nginx.err" &
pids+=($!)

manifest() { # NAME PORT APPPROTOCOL
  cat <<EOF
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: aether}
spec: {controllerName: aether.io/edge}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: bench, namespace: default}
spec:
  gatewayClassName: aether
  addresses: [{type: IPAddress, value: 127.0.0.1}]
  listeners:
  - {name: h1up, port: $2, protocol: HTTP}
  - {name: h2up, port: $(($2 + 1)), protocol: HTTP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: h1, namespace: default}
spec:
  parentRefs: [{name: bench, sectionName: h1up}]
  rules: [{backendRefs: [{name: up-h1, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: h2, namespace: default}
spec:
  parentRefs: [{name: bench, sectionName: h2up}]
  rules: [{backendRefs: [{name: up-h2, port: 80}]}]
---
apiVersion: v1
kind: Service
metadata: {name: up-h1, namespace: default}
spec: {ports: [{name: http, port: 80, targetPort: $up_h1}]}
---
apiVersion: v1
kind: Service
metadata: {name: up-h2, namespace: default}
spec: {ports: [{name: http, port: 80, targetPort: $up_h2, appProtocol: kubernetes.io/h2c}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: up-h1, namespace: default, labels: {kubernetes.io/service-name: up-h1}}
addressType: IPv4
ports: [{name: http, port: $up_h1}]
endpoints: [{addresses: [127.0.0.1], conditions: {ready: true}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: up-h2, namespace: default, labels: {kubernetes.io/service-name: up-h2}}
addressType: IPv4
ports: [{name: http, port: $up_h2, appProtocol: kubernetes.io/h2c}]
endpoints: [{addresses: [127.0.0.1], conditions: {ready: true}}]
EOF
}

declare -A port
i=0
for t in new base; do
  bin=$AETHER_BIN
  [[ $t == base ]] && bin=$AETHER_BASE_BIN
  port[$t]=$((PORT + 10 + 10 * i))
  mkdir -p "$run/$t"
  manifest "$t" "${port[$t]}" >"$run/$t/m.yaml"
  RUST_LOG=warn taskset -c 1 "$bin" run --manifests "$run/$t" --admin "127.0.0.1:$((port[$t] + 5))" \
    --workers 1 --access-log off >"$run/$t.log" 2>&1 &
  pids+=($!)
  eval "pid_$t=$!"
  i=$((i + 1))
done
for t in new base; do
  for _ in $(seq 100); do
    curl -sf --http2-prior-knowledge -o /dev/null "http://127.0.0.1:$((port[$t] + 1))/big" && break
    sleep 0.1
  done
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

measure() { # TARGET SCENARIO -> "req/s cpu_us_per_req"
  local t=$1 s=$2 url args=() pid
  pid=$(eval echo "\$pid_$t")
  case $s in
    down-h1) url="http://127.0.0.1:${port[$t]}/big" ;;
    down-h2) url="http://127.0.0.1:$((port[$t] + 1))/big" ;;
    up-h2) url="http://127.0.0.1:$((port[$t] + 1))/up"; args=(-d "$run/upload" -H ':method: PUT') ;;
  esac
  local before after out
  before=$(cpu_ticks "$pid")
  out=$(timeout 300 taskset -c 0 h2load -n "$REQUESTS" -c "$CONNS" -m "$STREAMS" "${args[@]}" "$url" 2>&1)
  after=$(cpu_ticks "$pid")
  local rps ok
  rps=$(awk '/^finished in/ {print $4}' <<<"$out")
  ok=$(awk '/^status codes:/ {print $3}' <<<"$out")
  [[ $ok == "$REQUESTS" ]] || { echo "$t $s: only $ok of $REQUESTS answered 2xx" >&2; }
  awk -v r="$rps" -v b="$before" -v a="$after" -v n="$REQUESTS" -v hz="$hz" \
    'BEGIN { printf "%s %.0f\n", r, (a - b) / hz * 1e6 / n }'
}

declare -A results
for round in $(seq "$ROUNDS"); do
  for s in down-h1 down-h2 up-h2; do
    for t in new base; do
      results[$t:$s]+="$(measure "$t" "$s") "
    done
  done
  echo "round $round done" >&2
done

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
printf '| scenario | new req/s | base req/s | new/base | new CPU µs/req | base CPU µs/req |\n|---|---:|---:|---:|---:|---:|\n'
for s in down-h1 down-h2 up-h2; do
  read -r -a n <<<"${results[new:$s]}"
  read -r -a b <<<"${results[base:$s]}"
  nr=$(for ((k = 0; k < ${#n[@]}; k += 2)); do echo "${n[k]}"; done | median)
  nc=$(for ((k = 1; k < ${#n[@]}; k += 2)); do echo "${n[k]}"; done | median)
  br=$(for ((k = 0; k < ${#b[@]}; k += 2)); do echo "${b[k]}"; done | median)
  bc=$(for ((k = 1; k < ${#b[@]}; k += 2)); do echo "${b[k]}"; done | median)
  printf '| %s (%s KiB) | %s | %s | %.2f | %s | %s |\n' "$s" "$BODY_KIB" "$nr" "$br" \
    "$(awk -v a="$nr" -v b="$br" 'BEGIN { print a / b }')" "$nc" "$bc"
done

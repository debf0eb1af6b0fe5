#!/usr/bin/env bash
# Kernel work per request, side by side: syscalls, context switches and CPU (user and
# system) per request of aether-edge, nginx and HAProxy proxying HTTP/1.1 keep-alive
# to one nginx upstream (SYSCALLS_LOAD=h2: HTTP/2 with prior knowledge, h2load 16
# connections x 8 streams, to HTTP/1.1 upstreams as in the load benchmark). Counts,
# unlike req/s, barely move with the machine's load, so this says where the
# per-request gap is even on a busy machine.
#
#   benches/load/syscalls.sh BIN [ROUNDS]
#
# Each proxy: one worker, pinned to CPU 1; upstream and wrk (64 connections) on CPU 0;
# `perf stat` counts the proxy's syscalls (raw_syscalls:sys_enter, per syscall with
# SYSCALLS_DETAIL=1) for the whole wrk run. aether-edge runs with `--access-log off`
# (nginx and HAProxy log nothing here either). Loopback only; everything started is
# stopped on exit. Needs nginx, haproxy, wrk, perf, taskset and 2 CPUs.
# SYSCALLS_PROFILE=DIR also records `perf record -g` of each proxy into DIR/NAME.data
# (compare kernel symbols with `perf report --sort sym`; SYSCALLS_CALLGRAPH=dwarf for
# callers in user space). SYSCALLS_TARGETS: a subset of "nginx haproxy aether relay"
# (relay: aether-edge with --http1-relay).
set -euo pipefail
bin=$(realpath "${1:?usage: syscalls.sh BIN [ROUNDS]}")
rounds=${2:-3}
targets=${SYSCALLS_TARGETS:-nginx haproxy aether relay}
dur=${SYSCALLS_SECONDS:-6}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$(mktemp -d /tmp/aether-syscalls.XXXXXX)
base=${SYSCALLS_PORT_BASE:-28700}
up=$base nginx_port=$((base + 1)) haproxy_port=$((base + 2)) aether_port=$((base + 3))
admin=$((base + 4)) nginx_h2_port=$((base + 5))
load=${SYSCALLS_LOAD:-keepalive}
# The nginx port measured: nginx takes h2c on a listener of its own (HAProxy and
# aether-edge detect the preface).
nginx_target=$nginx_port
curl_h2=()
case $load in
  keepalive) ;;
  h2) nginx_target=$nginx_h2_port curl_h2=(--http2-prior-knowledge) ;;
  *) echo "SYSCALLS_LOAD: keepalive or h2, not $load" >&2; exit 2 ;;
esac

pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT

mkdir -p "$out/tmp" "$out/aether" "$out/nginx-proxy-tmp"
sed -e "s|@RUN_DIR@|$out|g" -e "s|@UP_PORT@|$up|g" \
  "$here/conf/nginx-upstream-h1.conf" >"$out/upstream.conf"
# The load benchmark's proxy configurations, with only the HTTP/1.1 listeners.
sed -e "s|@RUN_DIR@|$out|g" -e "s|@UP_PORT@|$up|g" -e "s|@NGINX_PORT@|$nginx_port|g" \
  -e "s|@NGINX_H2_PORT@|$nginx_h2_port|g" -e '/@NGINX_TLS_PORT@\|ssl_/d' -e 's|master_process on|master_process off|' \
  "$here/conf/nginx-proxy.conf" >"$out/nginx.conf"
sed -e "s|@RUN_DIR@|$out|g" -e "s|@UP_PORT@|$up|g" -e "s|@HAPROXY_PORT@|$haproxy_port|g" \
  -e '/@HAPROXY_TLS_PORT@\|ssl_fc\|tune.ssl/d' "$here/conf/haproxy.cfg" >"$out/haproxy.cfg"
sed -e "s|@AETHER_PORT@|$aether_port|g" -e "s|@UP_PORT@|$up|g" "$here/conf/aether/gateway.yaml" |
  awk '/name: https/ {skip = 1} skip && /^---/ {skip = 0} !skip' >"$out/aether/gateway.yaml"

taskset -c 0 nginx -c "$out/upstream.conf" &
pids+=($!)

run_load() { # PORT SECONDS OUTPUT
  local url="http://127.0.0.1:$1/bench"
  if [[ $load == h2 ]]; then
    taskset -c 0 timeout 60 h2load -c16 -m8 -D"$2" "$url" >"$3"
  else
    taskset -c 0 timeout 60 wrk -t1 -c"${SYSCALLS_CONNECTIONS:-64}" -d"$2s" "$url" >"$3"
  fi
}

cpu_ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }

measure() { # NAME PORT CMD...
  local name=$1 port=$2
  shift 2
  taskset -c 1 "$@" >"$out/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 50); do
    curl -fsS "${curl_h2[@]}" -o /dev/null --max-time 1 "http://127.0.0.1:$port/" 2>/dev/null && break
    sleep 0.2
  done
  # Warm: connections open, pools filled.
  run_load "$port" 1 "$out/$name.warm"
  local u0 s0 u1 s1
  read -r u0 s0 < <(cpu_ticks "$pid")
  local events=raw_syscalls:sys_enter,context-switches
  [[ ${SYSCALLS_DETAIL:-0} == 1 ]] && events='syscalls:sys_enter_*,context-switches'
  perf stat -x, -e "$events" -p "$pid" -o "$out/$name.perf" -- sleep $((dur + 1)) &
  local perf=$!
  if [[ -n ${SYSCALLS_PROFILE:-} ]]; then
    mkdir -p "$SYSCALLS_PROFILE"
    perf record -q -F 999 --call-graph "${SYSCALLS_CALLGRAPH:-fp}" -p "$pid" -o "$SYSCALLS_PROFILE/$name.data" -- sleep "$dur" \
      >/dev/null 2>&1 &
  fi
  sleep 0.3
  run_load "$port" "$dur" "$out/$name.wrk"
  wait "$perf" || true
  read -r u1 s1 < <(cpu_ticks "$pid")
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  local reqs hz
  # wrk: "N requests in"; h2load: "requests: N total, N started, N done, N succeeded".
  reqs=$(awk '/requests in/ {print $1} /^requests:/ {print $8}' "$out/$name.wrk")
  hz=$(getconf CLK_TCK)
  awk -F, -v n="$name" -v r="$reqs" -v u=$((u1 - u0)) -v k=$((s1 - s0)) -v hz="$hz" '
    $3 == "raw_syscalls:sys_enter" { s = $1 }
    $3 ~ /^syscalls:sys_enter_/ && $1 > 0 { s += $1; d[substr($3, 20)] = $1 }
    $3 == "context-switches" { c = $1 }
    END {
      printf "%-8s requests %8d  syscalls/req %5.2f  cswitch/req %5.3f  cpu us/req %5.1f (user %4.1f, system %4.1f)\n",
        n, r, s / r, c / r, (u + k) / hz * 1e6 / r, u / hz * 1e6 / r, k / hz * 1e6 / r
      for (k in d) if (d[k] / r >= 0.01) printf "           %-20s %6.3f/req\n", k, d[k] / r
    }' "$out/$name.perf"
}

uptime
for round in $(seq "$rounds"); do
  echo "round $round"
  [[ $targets == *nginx* ]] && measure nginx "$nginx_target" nginx -c "$out/nginx.conf"
  [[ $targets == *haproxy* ]] && measure haproxy "$haproxy_port" haproxy -db -f "$out/haproxy.cfg"
  [[ $targets == *aether* ]] && measure aether "$aether_port" env RUST_LOG=warn "$bin" run --manifests "$out/aether" \
    --admin "127.0.0.1:$admin" --workers 1 --access-log off
  # The same binary with the HTTP/1.1 relay (proxy/src/relay/), where it has it.
  if [[ $targets == *relay* ]] && "$bin" run --help | grep -q -- --http1-relay; then
    measure relay "$aether_port" env RUST_LOG=warn "$bin" run --manifests "$out/aether" \
      --admin "127.0.0.1:$admin" --workers 1 --access-log off --http1-relay
  fi
done
uptime

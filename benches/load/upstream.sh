# shellcheck shell=bash
# Sourced by profile.sh, allocations.sh and instructions.sh: the benchmark's upstream
# and route for one edge under a tool. render_configs OUT UP_PORT PROXY_PORT writes OUT/upstream.conf
# (a one-worker nginx on UP_PORT) and OUT/aether/gateway.yaml (the benchmark's
# manifests on PROXY_PORT without the HTTPS listener: no Secret here).
render_configs() {
  local out=$1 up_port=$2 proxy_port=$3 here
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  mkdir -p "$out/aether" "$out/tmp"
  sed -e "s|@RUN_DIR@|$out|g" -e "s|@UP_PORT@|$up_port|g" \
    "$here/conf/nginx-upstream-h1.conf" >"$out/upstream.conf"
  sed -e "s|@AETHER_PORT@|$proxy_port|g" -e "s|@UP_PORT@|$up_port|g" \
    "$here/conf/aether/gateway.yaml" |
    awk '/name: https/ {skip = 1} skip && /^---/ {skip = 0} !skip' >"$out/aether/gateway.yaml"
}

# Processes a script started, stopped on exit (after `before_stop`, when the script
# defines one).
pids=()
stop_started() {
  local p
  if declare -F before_stop >/dev/null; then before_stop; fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}

# start_upstream OUT: the one-worker nginx of OUT/upstream.conf on CPU 0, and every
# process in `pids` stopped on exit.
start_upstream() {
  trap stop_started EXIT
  taskset -c 0 nginx -c "$1/upstream.conf" &
  pids+=($!)
}

# wait_for_edge PORT TRIES PAUSE [CURL_FLAG]: until the benchmark's route answers on
# PORT, trying TRIES times PAUSE seconds apart; fails if it never does. CURL_FLAG: e.g.
# --http2-prior-knowledge for a listener that serves only h2c.
wait_for_edge() {
  local _
  for _ in $(seq "$2"); do
    curl -fsS -o /dev/null --max-time 1 ${4:+"$4"} "http://127.0.0.1:$1/bench" 2>/dev/null && return 0
    sleep "$3"
  done
  return 1
}

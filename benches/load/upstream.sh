# shellcheck shell=bash
# Sourced by profile.sh and allocations.sh: the benchmark's upstream and route for one
# edge under a tool. render_configs OUT UP_PORT PROXY_PORT writes OUT/upstream.conf
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

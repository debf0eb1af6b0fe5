#!/usr/bin/env bash
# Quickstart: builds aether-edge, starts the echo backend on 127.0.0.1:9000 and the edge
# with the manifests beside this script (listener 127.0.0.1:8080, admin 127.0.0.1:9901),
# sends one request through it, and keeps serving until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."

# The quick profile: release speed without the whole-program LTO of what ships, so a
# first build takes minutes, not tens of them.
cargo build --profile quick --locked --quiet --bin aether-edge
bin=target/quick/aether-edge

"$bin" echo --listen 127.0.0.1:9000 --name quickstart &
echo_pid=$!
"$bin" run --manifests examples/quickstart --admin 127.0.0.1:9901 &
edge_pid=$!
trap 'kill "$edge_pid" "$echo_pid" 2>/dev/null; wait 2>/dev/null' EXIT INT TERM

for _ in $(seq 1 100); do
  curl -fsS -o /dev/null http://127.0.0.1:9901/readyz 2>/dev/null && break
  sleep 0.1
done

cmd="curl -sS -H 'Host: echo.example.com' http://127.0.0.1:8080/hello"
echo
echo "aether-edge is routing. Try:"
echo "  $cmd"
echo
eval "$cmd"
echo
echo
echo "Status:  curl -s http://127.0.0.1:9901/status"
echo "Metrics: curl -s http://127.0.0.1:9901/metrics"
echo "Edit examples/quickstart/*.yaml and the change is live within a second. Ctrl-C stops."
if [ "${QUICKSTART_ONCE:-}" = 1 ]; then exit 0; fi
wait "$edge_pid"

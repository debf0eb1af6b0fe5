#!/usr/bin/env bash
# Heap allocations per request through aether-edge, by size, for issue #19's notes
# in RESULTS.md: glibc serves requests of up to 1,032 bytes from a per-thread cache,
# and larger ones through its slower bins, so both the count and the sizes matter.
#
#   benches/load/allocations.sh BIN NAME
#
# ALLOC_LOAD: h2 (default: h2load, h2c prior knowledge, 16 connections x 8 streams)
# or keepalive (h2load over HTTP/1.1, 64 connections). ALLOC_REQUESTS: how many
# (default 100,000). ALLOC_ARGS: extra flags for BIN (default `--access-log off`).
#
# Runs a one-worker nginx upstream (CPU 0) and BIN under heaptrack with one worker
# (CPU 1) on the benchmark's route, sends the requests, stops the edge, and writes
# target/bench-profile/NAME/{heap.zst,sizes.txt,sites.txt}: sizes.txt is heaptrack's
# histogram (size, calls), sites.txt the allocation sites, unmerged (a site's peak
# over the streams in flight, 128 on h2, is the size of one allocation there). Prints
# the allocation calls per request. Loopback only; every process
# started here is stopped on exit. Needs nginx, h2load, heaptrack and taskset.
set -euo pipefail

bin=${1:?usage: allocations.sh BIN NAME}
name=${2:?usage: allocations.sh BIN NAME}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/target/bench-profile/$name
up_port=${ALLOC_PORT_BASE:-28700}
proxy_port=$((up_port + 1))
admin_port=$((up_port + 2))
requests=${ALLOC_REQUESTS:-100000}
load_kind=${ALLOC_LOAD:-h2}
read -r -a extra_args <<<"${ALLOC_ARGS---access-log off}"

rm -rf "$out"
# shellcheck disable=SC1091 # upstream.sh beside this script, checked on its own
source "$here/upstream.sh"
render_configs "$out" "$up_port" "$proxy_port"

# heaptrack runs the edge as its child: stop the edge itself too.
before_stop() { pkill -f -- "^$bin run --manifests $out/aether" 2>/dev/null || true; }
start_upstream "$out"
taskset -c 1 env RUST_LOG=warn heaptrack -o "$out/heap" "$bin" run --manifests "$out/aether" \
  --admin "127.0.0.1:$admin_port" --workers 1 "${extra_args[@]}" >"$out/aether.log" 2>&1 &
traced=$!
pids+=("$traced")
wait_for_edge "$proxy_port" 100 0.3 || { echo "the edge did not answer (see $out/aether.log)" >&2; exit 1; }
case $load_kind in
  h2) load=(h2load -c16 -m8) ;;
  keepalive) load=(h2load --h1 -c64 -m1) ;;
  *) echo "ALLOC_LOAD: h2 or keepalive, not $load_kind" >&2; exit 2 ;;
esac
summary=$(timeout 300 taskset -c 0 "${load[@]}" -n "$requests" "http://127.0.0.1:$proxy_port/bench" |
  grep -E '^(finished in|requests:)')
echo "$summary"
grep -q " $requests succeeded" <<<"$summary" || { echo "not every request succeeded" >&2; exit 1; }
# heaptrack finishes its file when the edge exits: a SIGTERM drains and exits. The
# edge's own command line, not heaptrack's (which names it too): heaptrack stopped
# early stops its writer with the file half written.
edge=$(pgrep -f -- "^$bin run --manifests $out/aether" | head -n 1 || true)
[[ -n $edge ]] && kill -TERM "$edge"
wait "$traced" 2>/dev/null || true
shopt -s nullglob
written=("$out"/heap*.zst)
[[ ${#written[@]} -gt 0 ]] || { echo "heaptrack wrote no file (see $out/aether.log)" >&2; exit 1; }
heap=${written[0]}
heaptrack_print -f "$heap" --print-histogram "$out/sizes.txt" -n 0 --print-peaks 0 \
  --print-leaks 0 --print-temporary 0 --print-allocators 0 >"$out/summary.txt" 2>&1
heaptrack_print -f "$heap" -n 40 -s 0 --merge-backtraces 0 --print-peaks 0 \
  --print-leaks 0 --print-temporary 0 >"$out/sites.txt" 2>/dev/null
# The summary's count is the one to divide: the histogram's rows need not add up to it.
calls=$(sed -n 's/^calls to allocation functions: \([0-9]*\).*/\1/p' "$out/summary.txt")
awk -v calls="${calls:-0}" -v n="$requests" \
  'END { printf "%.2f allocations per request (start-up included)\n", calls / n }' </dev/null
echo "sizes: $out/sizes.txt; sites: $out/sites.txt"

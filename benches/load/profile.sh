#!/usr/bin/env bash
# CPU profile of aether-edge under load, for issue #19's before/after notes in
# RESULTS.md.
#
#   benches/load/profile.sh BIN NAME
#
# PROFILE_LOAD: keepalive (default: wrk, HTTP/1.1, 64 connections), close (the same, a
# new connection per request) or h2 (h2load, h2c prior knowledge, 16 connections x 8
# streams). PROFILE_ARGS: extra flags for BIN
# (e.g. `--access-log off` to see what logging costs).
#
# Runs a one-worker nginx upstream (CPU 0), BIN with one worker (CPU 1) and the
# benchmark's route, and wrk (64 connections, CPU 0) for 14 s; `perf record -g` samples
# the proxy for 8 s of it. Writes target/bench-profile/NAME/{perf.data,flat.txt,dso.txt}
# (flat: self time per symbol; dso: kernel / binary / libc split). Loopback only; every
# process started here is stopped on exit. Needs nginx, wrk, perf, taskset and 2 CPUs.
# Frame-pointer call chains are shallow in a release build; for callers use
# PROFILE_CALLGRAPH=dwarf (heavier, shorter).
set -euo pipefail

bin=${1:?usage: profile.sh BIN NAME}
name=${2:?usage: profile.sh BIN NAME}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/target/bench-profile/$name
up_port=${PROFILE_PORT_BASE:-28600}
proxy_port=$((up_port + 1))
admin_port=$((up_port + 2))
callgraph=${PROFILE_CALLGRAPH:-fp}
load_kind=${PROFILE_LOAD:-keepalive}
read -r -a extra_args <<<"${PROFILE_ARGS:-}"

rm -rf "$out"
# shellcheck disable=SC1091 # upstream.sh beside this script, checked on its own
source "$here/upstream.sh"
render_configs "$out" "$up_port" "$proxy_port"

start_upstream "$out"
# One data-plane worker: `--workers 1` where the build has it, else (earlier builds)
# one tokio worker thread.
workers=()
if "$bin" run --help 2>/dev/null | grep -q -- '--workers'; then workers=(--workers 1); fi
taskset -c 1 env TOKIO_WORKER_THREADS=1 RUST_LOG=warn "$bin" run --manifests "$out/aether" \
  --admin "127.0.0.1:$admin_port" "${workers[@]}" "${extra_args[@]}" >"$out/aether.log" 2>&1 &
proxy=$!
pids+=("$proxy")
wait_for_edge "$proxy_port" 50 0.2 || { echo "the edge did not answer (see $out/aether.log)" >&2; exit 1; }
case $load_kind in
  keepalive) timeout 40 taskset -c 0 wrk -t1 -c64 -d14s "http://127.0.0.1:$proxy_port/bench" \
    >"$out/load.txt" 2>&1 & ;;
  close) timeout 40 taskset -c 0 wrk -t1 -c64 -d14s -H 'Connection: close' \
    "http://127.0.0.1:$proxy_port/bench" >"$out/load.txt" 2>&1 & ;;
  h2) timeout 40 taskset -c 0 h2load -c16 -m8 -D14 "http://127.0.0.1:$proxy_port/bench" \
    >"$out/load.txt" 2>&1 & ;;
  *) echo "PROFILE_LOAD: keepalive, close or h2, not $load_kind" >&2; exit 2 ;;
esac
load=$!
pids+=("$load")
sleep 3
if [[ $callgraph == dwarf ]]; then
  perf record -F 499 --call-graph dwarf,16384 -p "$proxy" -o "$out/perf.data" -- sleep 4 \
    >/dev/null 2>"$out/perf.err"
else
  perf record -F 999 -g -p "$proxy" -o "$out/perf.data" -- sleep 8 >/dev/null 2>"$out/perf.err"
fi
wait "$load" || true
grep -E 'Requests/sec|^finished in' "$out/load.txt"
perf report -i "$out/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null |
  grep -v '^#' | grep -v '^$' >"$out/dso.txt" || true
perf report -i "$out/perf.data" --no-children --percent-limit 0.3 --stdio -g none 2>/dev/null |
  grep -v '^#' | grep -v '^$' >"$out/flat.txt" || true
head -4 "$out/dso.txt"
echo "profile: $out"

#!/usr/bin/env bash
# Two builds or flag sets of aether-edge under load at the same time, sharing one core,
# for a cost that the machine's own swings would hide (issue #16's access log).
#
#   A_BIN=... [A_ARGS=...] [B_BIN=...] [B_ARGS=...] benches/load/side-by-side.sh NAME
#
# run.sh measures targets one after another, so a host whose speed swings (this one:
# a fixed loop takes 0.08 to 0.12 s from one tenth of a second to the next) moves
# every round by more than a 1% change. Here both edges run together on CPU 1, each
# loaded by its own h2load (or wrk) on CPU 0 against one nginx upstream, so a slow
# moment slows both alike. Each edge sits in a cpu cgroup of its own with equal shares
# (when /sys/fs/cgroup/cpu is there): the kernel splits the core between the two
# processes, not between their threads, so the one with more threads (a log writer)
# is not given more of it.
#
# Per round: each edge's requests and on-CPU time (every thread's, from
# /proc/PID/task/*/schedstat, nanoseconds, taken after its lines are written);
# reported: A's req/s over B's and A's CPU a request over B's, the medians of the
# rounds' ratios, and every round. With equal shares, req/s over req/s is what the
# target compares; CPU a request does not depend on the shares at all.
#
# SBS_PERF=1: one more round under `perf record` (cpu-clock, both edges in the same
# window), and sbs-profile.py's table of what differs, symbol by symbol, in
# microseconds a request (target/bench-sbs/NAME/profile.txt).
#
# SBS_LOAD: h2 (default: h2load, h2c, 16 connections x 8 streams each) or keepalive
# (wrk, 64 connections). SBS_ROUNDS (9), SBS_SECONDS (8 a round). A_ARGS, B_ARGS:
# extra flags (unset: none; e.g. B_ARGS="--access-log off"). A_ENV, B_ENV: extra
# NAME=VALUE environment for each. B_BIN defaults to A_BIN.
# Each edge's stdout (its access log) goes to a file in the output directory, removed
# at the end (its size is reported), or to SBS_SINK: a path (e.g. /dev/null), or
# `pipe`: a FIFO read by `cat` on CPU 0, as a container runtime reads a pod's stdout. Writes target/bench-sbs/NAME/report.txt.
# Loopback only; everything started is stopped on exit. Needs nginx, h2load or wrk,
# taskset, curl and 2 CPUs.
set -euo pipefail

name=${1:?usage: A_BIN=... [B_ARGS=...] side-by-side.sh NAME}
a_bin=${A_BIN:?A_BIN: the first edge binary}
b_bin=${B_BIN:-$a_bin}
read -r -a a_args <<<"${A_ARGS:-}"
read -r -a b_args <<<"${B_ARGS:-}"
read -r -a a_env <<<"${A_ENV:-}"
read -r -a b_env <<<"${B_ENV:-}"
rounds=${SBS_ROUNDS:-9}
seconds=${SBS_SECONDS:-8}
load_kind=${SBS_LOAD:-h2}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/target/bench-sbs/$name
up_port=${SBS_PORT_BASE:-28700}
# Each edge's listener; its admin server is the port after.
a_port=$((up_port + 1))
b_port=$((up_port + 3))
perf_hz=4999

rm -rf "$out"
mkdir -p "$out"
# shellcheck disable=SC1091 # upstream.sh beside this script, checked on its own
source "$here/upstream.sh"
render_configs "$out/a" "$up_port" "$a_port"
render_configs "$out/b" "$up_port" "$b_port"

cgroups=()
before_stop() {
  local g
  for g in "${cgroups[@]}"; do
    # Back to the root group first: a group with tasks cannot be removed.
    while read -r t; do echo "$t" >/sys/fs/cgroup/cpu/cgroup.procs 2>/dev/null || true; done <"$g/cgroup.procs"
    rmdir "$g" 2>/dev/null || true
  done
  rm -f "$out"/*.access.log
}
start_upstream "$out/a"

# start_edge LABEL PROXY_PORT BIN ENV_ARRAY ARGS...: the edge on CPU 1 with one worker
# and the environment named by ENV_ARRAY, in a cpu cgroup of its own when the machine
# has the v1 controller; its PID in `edge`.
start_edge() {
  local label=$1 port=$2 bin=$3
  local -n extra_env=$4
  shift 4
  local sink=${SBS_SINK:-$out/$label.access.log}
  if [[ $sink == pipe ]]; then
    sink=$out/$label.fifo
    mkfifo "$sink"
    taskset -c 0 cat "$sink" >/dev/null &
    pids+=($!)
  fi
  taskset -c 1 env TOKIO_WORKER_THREADS=1 RUST_LOG=warn "${extra_env[@]}" "$bin" run \
    --manifests "$out/$label/aether" --admin "127.0.0.1:$((port + 1))" --workers 1 "$@" \
    >"$sink" 2>"$out/$label.log" &
  edge=$!
  pids+=("$edge")
  local g=/sys/fs/cgroup/cpu/aether-sbs-$label
  if [[ -w /sys/fs/cgroup/cpu ]] && mkdir -p "$g" 2>/dev/null; then
    cgroups+=("$g")
    echo "$edge" >"$g/cgroup.procs"
  fi
}
# SBS_ORDER=ba starts B first (side-by-side-runs.sh alternates), so that whatever
# favours the first process started is not always A's.
if [[ ${SBS_ORDER:-ab} == ba ]]; then
  start_edge b "$b_port" "$b_bin" b_env "${b_args[@]}"
  b=$edge
  start_edge a "$a_port" "$a_bin" a_env "${a_args[@]}"
  a=$edge
else
  start_edge a "$a_port" "$a_bin" a_env "${a_args[@]}"
  a=$edge
  start_edge b "$b_port" "$b_bin" b_env "${b_args[@]}"
  b=$edge
fi
# h2 load: asked over h2c, which every edge here serves (nginx-as-edge.sh only it).
probe=''
[[ $load_kind == h2 ]] && probe=--http2-prior-knowledge
for port in "$a_port" "$b_port"; do
  wait_for_edge "$port" 50 0.2 "$probe" || { echo "no edge on $port (see $out/*.log)" >&2; exit 1; }
done

# load PORT SECONDS FILE: one load generator on CPU 0, in the background.
load() {
  case $load_kind in
    h2) taskset -c 0 h2load -c16 -m8 -D"$2" "http://127.0.0.1:$1/bench" >"$3" 2>&1 & ;;
    keepalive) taskset -c 0 wrk -t1 -c64 -d"$2"s "http://127.0.0.1:$1/bench" >"$3" 2>&1 & ;;
    *) echo "SBS_LOAD: h2 or keepalive, not $load_kind" >&2; exit 2 ;;
  esac
}

# Requests a load generator's output says succeeded (fails on errors).
served() {
  case $load_kind in
    h2) awk '/^requests:/ { if ($10 + $12 + $14 > 0) exit 1; print $8 }' "$1" ;;
    keepalive) if grep -q 'Non-2xx\|Socket errors' "$1"; then return 1; fi
      awk '/requests in/ { print $1 }' "$1" ;;
  esac
}

# Nanoseconds PID's threads have been on a CPU.
cpu_ns() { cat /proc/"$1"/task/*/schedstat | awk '{ s += $1 } END { printf "%.0f\n", s }'; }

# round SECONDS [perf]: one round; with `perf`, both edges sampled from its second
# second to one before its end.
round() {
  local secs=$1 a0 b0 a1 b1 ra rb
  a0=$(cpu_ns "$a"); b0=$(cpu_ns "$b")
  load "$a_port" "$secs" "$out/load-a.txt"
  local la=$!
  load "$b_port" "$secs" "$out/load-b.txt"
  local lb=$!
  if [[ ${2:-} == perf ]]; then
    sleep 1
    perf record -F "$perf_hz" -e cpu-clock -p "$a,$b" -o "$out/perf.data" -- sleep $((secs - 2)) \
      >/dev/null 2>"$out/perf.err"
  fi
  wait "$la" "$lb"
  # The writer thread wakes at least every 100 ms: its last lines are part of the cost.
  sleep 0.3
  a1=$(cpu_ns "$a"); b1=$(cpu_ns "$b")
  ra=$(served "$out/load-a.txt") || { echo "A's load failed: $out/load-a.txt" >&2; exit 1; }
  rb=$(served "$out/load-b.txt") || { echo "B's load failed: $out/load-b.txt" >&2; exit 1; }
  echo "$ra $rb $((a1 - a0)) $((b1 - b0))"
}

round 2 >/dev/null
{
  echo "# side by side: A=${a_env[*]:-} $a_bin ${a_args[*]:-} / B=${b_env[*]:-} $b_bin ${b_args[*]:-}"
  echo "# commit $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo '+changes'), $(date -u '+%F %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
  echo "# load $load_kind, $rounds rounds x ${seconds}s, cgroups: ${#cgroups[@]} of 2, started ${SBS_ORDER:-ab}"
  echo "# round  A_req  B_req  A_cpu_ms  B_cpu_ms  A/B_req/s  A/B_cpu_per_req"
} >"$out/report.txt"
for i in $(seq "$rounds"); do
  if ! read -r ra rb ca cb < <(round "$seconds") || [[ -z $cb ]]; then echo "round $i failed" >&2; exit 1; fi
  awk -v i="$i" -v ra="$ra" -v rb="$rb" -v ca="$ca" -v cb="$cb" 'BEGIN {
    printf "%d %d %d %.0f %.0f %.4f %.4f\n", i, ra, rb, ca / 1e6, cb / 1e6, ra / rb, (ca / ra) / (cb / rb) }' |
    tee -a "$out/report.txt"
done
# Lines an edge dropped (its ring full): a change that sheds lines is not a cheaper log.
dropped() {
  curl -fsS --max-time 2 "http://127.0.0.1:$1/metrics" 2>/dev/null |
    awk '/^aether_access_log_dropped_total/ { n += $2 } END { printf "%d\n", n }'
}
{
  echo "# access-log lines dropped: A $(dropped $((a_port + 1))) B $(dropped $((b_port + 1)))"
  echo "# end load average $(cut -d' ' -f1-3 /proc/loadavg); access log bytes A $(stat -c %s "$out/a.access.log" 2>/dev/null || echo "(${SBS_SINK:-})") B $(stat -c %s "$out/b.access.log" 2>/dev/null || echo "(${SBS_SINK:-})")"
  median() { grep -v '^#' "$out/report.txt" | awk -v f="$1" '{ print $f }' | sort -g |
    awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
  awk -v r="$(median 6)" -v c="$(median 7)" -v n="$rounds" 'BEGIN {
    printf "median A/B req/s %.4f (%+.1f%%), A/B CPU a request %.4f (%+.1f%%), %d rounds\n",
      r, (r - 1) * 100, c, (c - 1) * 100, n }'
} | tee -a "$out/report.txt"
if [[ ${SBS_PERF:-0} == 1 ]]; then
  if ! read -r ra rb _ _ < <(round "$seconds" perf) || [[ -z $rb ]]; then echo "the profiled round failed" >&2; exit 1; fi
  # Requests in the sampled window: the round's, pro rata.
  python3 "$here/sbs-profile.py" "$out/perf.data" "$a" "$b" \
    $((ra * (seconds - 2) / seconds)) $((rb * (seconds - 2) / seconds)) "$perf_hz" 40 \
    >"$out/profile.txt"
  head -50 "$out/profile.txt"
fi

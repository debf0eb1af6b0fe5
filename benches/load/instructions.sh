#!/usr/bin/env bash
# User-space instructions per request through aether-edge, by function, under
# callgrind: a count that does not move with the machine's load, for changes too small
# for the load benchmark's rounds to resolve (issue 16's access-log work).
#
#   benches/load/instructions.sh BIN NAME     count, into target/bench-profile/NAME
#   benches/load/instructions.sh compare A B  functions whose count differs, A - B
#
# INSN_ARGS: extra flags for BIN (default none: the access log on, as shipped; e.g.
# `--access-log off`). INSN_REQUESTS: how many are counted (default 20,000), after
# 2,000 unmeasured. The load is h2load's h2c (16 connections x 8 streams) on the
# benchmark's route, a one-worker nginx upstream on CPU 0 and the edge on CPU 1.
#
# Counts are per request over every thread (the access-log writer included) and
# user space only: the kernel's work (sockets, the log's file writes) is not in them.
# Under valgrind the edge runs about 50 times slower, so per-request costs that depend
# on batching (polls and reads a request) differ from a real run: compare builds or
# flags with each other, not with ns from elsewhere. Loopback only; every process
# started here is stopped on exit. Needs nginx, h2load, valgrind and taskset.
set -euo pipefail

if [[ ${1:-} == compare ]]; then
  a=${2:?usage: instructions.sh compare NAME_A NAME_B}
  b=${3:?usage: instructions.sh compare NAME_A NAME_B}
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  dir=$(cd "$here/../.." && pwd)/target/bench-profile
  # functions.txt: "instructions-per-request<TAB>function"; join on the function.
  join -t $'\t' -1 2 -2 2 -a 1 -a 2 -e 0 -o 0,1.1,2.1 \
    <(sort -t $'\t' -k2,2 "$dir/$a/functions.txt") <(sort -t $'\t' -k2,2 "$dir/$b/functions.txt") |
    awk -F '\t' '{ d = $2 - $3; if (d >= 5 || d <= -5) printf "%8.0f %8.0f %8.0f  %s\n", d, $2, $3, $1 }' |
    sort -rn
  exit 0
fi

bin=${1:?usage: instructions.sh BIN NAME}
name=${2:?usage: instructions.sh BIN NAME}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/target/bench-profile/$name
up_port=${INSN_PORT_BASE:-28800}
proxy_port=$((up_port + 1))
admin_port=$((up_port + 2))
requests=${INSN_REQUESTS:-20000}
read -r -a extra_args <<<"${INSN_ARGS:-}"

rm -rf "$out"
# shellcheck disable=SC1091 # upstream.sh beside this script, checked on its own
source "$here/upstream.sh"
render_configs "$out" "$up_port" "$proxy_port"

start_upstream "$out"
taskset -c 1 env RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.out" \
  "$bin" run --manifests "$out/aether" --admin "127.0.0.1:$admin_port" --workers 1 \
  "${extra_args[@]}" >"$out/aether.log" 2>"$out/valgrind.log" &
edge=$!
pids+=("$edge")
wait_for_edge "$proxy_port" 120 0.5 || { echo "the edge did not answer under valgrind (see $out/valgrind.log)" >&2; exit 1; }
load=(timeout 600 taskset -c 0 h2load -c16 -m8)
"${load[@]}" -n 2000 "http://127.0.0.1:$proxy_port/bench" >/dev/null
# Only the counted requests: counters zeroed before, dumped after.
callgrind_control -z "$edge" >/dev/null
summary=$("${load[@]}" -n "$requests" "http://127.0.0.1:$proxy_port/bench" |
  grep -E '^(finished in|requests:)')
callgrind_control -d "$edge" >/dev/null
echo "$summary"
grep -q " $requests succeeded" <<<"$summary" || { echo "not every request succeeded" >&2; exit 1; }
shopt -s nullglob
dumps=("$out"/callgrind.out.*)
[[ ${#dumps[@]} -gt 0 ]] || { echo "callgrind wrote no dump (see $out/valgrind.log)" >&2; exit 1; }
# Self cost per function, per request; names without their call counts and objects.
callgrind_annotate --auto=no --inclusive=no --threshold=100 "${dumps[0]}" 2>/dev/null |
  awk -v n="$requests" '
    /^ *[0-9,]+ \( *[0-9.]+%\) / {
      count = $1; gsub(",", "", count)
      fn = $0; sub(/^ *[0-9,]+ \( *[0-9.]+%\) +/, "", fn)
      sub(/ \([0-9,]+x\)/, "", fn); sub(/ \[[^]]*\]$/, "", fn); sub(/^[^<]*\.rs:/, "", fn)
      sub(/^[^ :]*\/[^ :]*:/, "", fn)
      if (fn == "PROGRAM TOTALS") { total = count; next }
      self[fn] += count
    }
    END {
      for (f in self) printf "%.0f\t%s\n", self[f] / n, f > "'"$out"'/functions.txt"
      printf "%.0f instructions per request (user space, every thread)\n", total / n
    }'
echo "functions: $out/functions.txt (compare two runs: $0 compare NAME_A NAME_B)"

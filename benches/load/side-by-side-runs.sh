#!/usr/bin/env bash
# side-by-side.sh several times over, with new processes each time, for a difference
# smaller than one pair of processes can show.
#
#   SBS_RUNS=6 A_BIN=... [B_ARGS=...] benches/load/side-by-side-runs.sh NAME
#
# Within one run, rounds agree to a few tenths of a percent; across runs of the same
# two binaries they moved by up to a point either way (session 38: one knob read +0.8%
# in one run and -0.4% in the next, every round of each run on its side). What is fixed
# for the life of a process (where ASLR put its code, heap and stacks; which edge
# started first) biases every round of a run alike, so only new processes average it
# out. Each run is side-by-side.sh with SBS_ROUNDS (default 3 here) rounds, started A
# first in odd runs and B first in even ones; reported: every run's median, and the
# median and spread of those (target/bench-sbs/NAME/runs.txt). Everything else
# (A_BIN, A_ARGS, SBS_LOAD, SBS_SINK, ...) passes through.
set -euo pipefail

name=${1:?usage: SBS_RUNS=N A_BIN=... side-by-side-runs.sh NAME}
runs=${SBS_RUNS:-6}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/target/bench-sbs/$name
mkdir -p "$out"
: "${SBS_ROUNDS:=3}"
export SBS_ROUNDS

{
  echo "# $runs runs of side-by-side.sh, $SBS_ROUNDS rounds each: A=${A_ENV:-} ${A_BIN:?A_BIN: the first edge binary} ${A_ARGS:-} / B=${B_ENV:-} ${B_BIN:-$A_BIN} ${B_ARGS:-}"
  echo "# commit $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo '+changes'), $(date -u '+%F %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg) at start"
  echo "# run  started  A/B_req/s  A/B_cpu_per_req"
} >"$out/runs.txt"
for i in $(seq "$runs"); do
  order=ab
  ((i % 2 == 0)) && order=ba
  SBS_ORDER=$order "$here/side-by-side.sh" "$name/run-$i" >/dev/null
  report=$out/run-$i/report.txt
  awk -v i="$i" -v o="$order" '/^median/ { printf "%d %s %s %s\n", i, o, $4, $10 }' "$report" |
    tee -a "$out/runs.txt"
done
{
  echo "# end load average $(cut -d' ' -f1-3 /proc/loadavg)"
  grep -v '^#' "$out/runs.txt" | awk '{ print $3, $4 }' | sort -g | awk -v n="$runs" '
    { r[NR] = $1; c[NR] = $2 }
    END {
      m = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2
      printf "median of %d runs: A/B req/s %.4f (%+.1f%%), runs from %.4f to %.4f\n", n, m, (m - 1) * 100, r[1], r[NR]
    }'
} | tee -a "$out/runs.txt"

#!/bin/sh
# Makes link-order.txt: the functions a run of the edge executes, hottest first, for
# build.rs to place together in the release executable (see build.rs for why).
#
#   benches/scale/link-order.sh            # two builds and two runs, then the list
#   LINK_ORDER_REUSE_PROFILE=1 benches/scale/link-order.sh
#                                          # after a code change: the ordinary build's
#                                          # runs only, the last full run's profiles
#   benches/scale/link-order.sh check BIN  # how many listed functions BIN has (a fresh
#                                          # list: most; a stale one: few)
#
# Needs `rustup component add llvm-tools` (llvm-profdata of rustc's own LLVM), a C
# compiler, openssl, curl, python3 and unshare, and root for exact touched pages (it
# turns read-ahead off on the work directory's device during the touched runs). The
# list names symbols, which the toolchain, Cargo.lock and ordinary code changes rename
# (new signature hashes, LTO's renumbered local copies): run it again after a change to
# code the edge runs. A full run takes an instrumented and an ordinary release build
# (about 40 minutes on 2 cores); reusing the profiles, one ordinary build (about 12).
set -eu
cd "$(dirname "$0")/../.."
root=$(pwd)
if [ "${1:-}" = check ]; then
  bin=${2:?usage: link-order.sh check BIN}
  listed=$(mktemp)
  trap 'rm -f "$listed"' EXIT
  sort -u link-order.txt >"$listed"
  found=$(nm "$bin" | awk '{print $NF}' | sort -u | comm -12 - "$listed" | wc -l)
  echo "$bin has $found of the $(wc -l <link-order.txt) functions in link-order.txt"
  exit 0
fi
work=${LINK_ORDER_DIR:-$root/target/link-order}
profile=${LINK_ORDER_PROFILE:-release}

# LINK_ORDER_REUSE_PROFILE=1: keep the last full run's profiles (in $work) and redo
# only the ordinary build's touched pages, which name the current code's symbols
# exactly: enough after a code change (minutes instead of 40); the profiles only rank
# functions and filter touched pages.
reuse=${LINK_ORDER_REUSE_PROFILE:-}
if [ -n "$reuse" ]; then
  for mode in idle full; do
    [ -s "$work/$mode-functions.txt" ] || {
      echo "no $work/$mode-functions.txt to reuse: run link-order.sh once without LINK_ORDER_REUSE_PROFILE" >&2
      exit 1
    }
  done
fi

# Two runs of each build: an idle edge (start-up, first load, a scrape, its timers) and
# a serving one; the list packs what the idle one ran first.
run() { # MODE BIN [ENV...]: one run of the scenario
  mode=$1 run_bin=$2
  shift 2
  idle=
  [ "$mode" = idle ] && idle=1
  env LINK_ORDER_IDLE="$idle" "$@" \
    unshare -rn sh -c "ip link set lo up && python3 '$root/benches/scale/link_order_run.py' '$run_bin'"
}
if [ -z "$reuse" ]; then
  sysroot=$(rustc --print sysroot)
  profdata=$(find "$sysroot/lib/rustlib" -path '*/bin/llvm-profdata' 2>/dev/null | head -n 1)
  [ -x "$profdata" ] || { echo "llvm-profdata not found: rustup component add llvm-tools" >&2; exit 1; }
  rm -rf "$work/raw"
  mkdir -p "$work/raw"
  # Instrumented by a wrapper, not RUSTFLAGS: cargo hashes RUSTFLAGS into every crate's
  # symbol names, and the list must name the ordinary build's symbols.
  LINK_ORDER_RAW="$work/raw" RUSTC_WRAPPER="$root/benches/scale/rustc-instrument.sh" \
    cargo build --locked --profile "$profile" --bin aether-edge --target-dir "$work/target"
  bin="$work/target/$profile/aether-edge"
  [ "$profile" = dev ] && bin="$work/target/debug/aether-edge"
  for mode in idle full; do
    rm -f "$work"/raw/edge-*.profraw
    run "$mode" "$bin" LLVM_PROFILE_FILE="$work/raw/edge-%p.profraw"
    "$profdata" merge -o "$work/$mode.profdata" "$work"/raw/edge-*.profraw
    "$profdata" show --all-functions --counts "$work/$mode.profdata" >"$work/$mode-functions.txt"
  done
fi

# The same run of an ordinary build, to see the code pages it touches: the profile
# misses the standard library and names some generic instances differently.
cargo build --locked --profile "$profile" --bin aether-edge
built="target/$profile/aether-edge"
[ "$profile" = dev ] && built=target/debug/aether-edge
cc -shared -fPIC -O2 -o "$work/random_text.so" benches/scale/random_text.c
# On recent kernels (6.18 here) a fault in code reads the device's whole read-ahead
# window after it, whatever madvise says, and fault-around then maps every cached page
# within 64 KiB of each later fault: with an 8 MiB window the touched set came out 2.3x
# the pages the run executed, and the list packed functions that never ran among
# those that did. With read-ahead off (root only) each fault reads its one page.
majmin=$(stat -c '%Hd:%Ld' "$work")
readahead=/sys/dev/block/$majmin/queue/read_ahead_kb
[ -e "$readahead" ] || readahead=/sys/dev/block/$majmin/../queue/read_ahead_kb
saved_readahead=
if [ -w "$readahead" ]; then
  saved_readahead=$(cat "$readahead")
  trap 'echo "$saved_readahead" >"$readahead"' EXIT INT TERM
  echo 0 >"$readahead"
else
  echo "warning: cannot turn off read-ahead ($readahead): the touched pages will include neighbours of the executed ones" >&2
fi
for mode in idle full; do
  # A fresh copy, dropped from the page cache: pages are read one by one as touched.
  rm -f "$work/edge"
  cp "$built" "$work/edge"
  sync
  python3 -c 'import os, sys; f = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(f, 0, 0, os.POSIX_FADV_DONTNEED)' "$work/edge"
  run "$mode" "$work/edge" LD_PRELOAD="$work/random_text.so" LINK_ORDER_TOUCHED="$work/$mode-touched.txt"
done
if [ -n "$saved_readahead" ]; then
  echo "$saved_readahead" >"$readahead"
  trap - EXIT INT TERM
fi

python3 benches/scale/link_order_list.py "$work/edge" \
  "$work/idle-functions.txt" "$work/idle-touched.txt" \
  "$work/full-functions.txt" "$work/full-touched.txt" >"$work/link-order.txt"
mv "$work/link-order.txt" link-order.txt
echo "link-order.txt: $(wc -l <link-order.txt) functions ($profile, $(rustc --version))"

#!/usr/bin/env python3
"""Writes link-order.txt's list from two views of one run of the edge (link-order.sh).

- The instrumented build's profile (`llvm-profdata show --all-functions --counts`):
  every function of an instrumented crate, with counters; any non-zero counter means it
  ran (the counters are a flow: all zero means its entry never ran). Hotter first, so
  the serving path shares the fewest pages. It misses the standard library (shipped
  uninstrumented) and generic instances the ordinary build names differently.
- The ordinary build's code pages the run touched (fault-around off, cold page cache):
  complete, but a page also holds functions that never ran. Of the functions on
  touched pages, those the profile knows but saw not run are left out.

Runs come in order (link-order.sh: an idle edge's, then a serving one's): each run's
functions follow those of the runs before, so what an idle edge executes is packed
first, then what serving adds.

Usage: link_order_list.py BIN FUNCTIONS.txt TOUCHED.txt [FUNCTIONS.txt TOUCHED.txt...]
"""
import bisect
import re
import subprocess
import sys

PAGE = 4096


def base(symbol):
    """A symbol without what tells its instances apart (legacy hash, LTO's ".N",
    ThinLTO's ".llvm.N")."""
    symbol = re.sub(r"\.llvm\.\d+$", "", symbol)
    symbol = re.sub(r"\.\d+$", "", symbol)
    return re.sub(r"17h[0-9a-f]{16}E$", "E", symbol)


def profile(path):
    """(functions that ran, hottest first; base names of all profiled functions)."""
    ran, known, name = {}, set(), None
    for line in open(path):
        if line.startswith("  ") and not line.startswith("    ") and line.rstrip().endswith(":"):
            # A local function's profile name is "file;symbol"; a promoted local's
            # symbol carries a per-build ".llvm.N" the ordinary build will not have.
            name = re.sub(r"\.llvm\.\d+$", "", line.strip()[:-1].split(";")[-1])
            known.add(base(name))
        counts = re.match(r"\s+Block counts: \[(.*)\]", line)
        if counts and name:
            total = sum(int(c) for c in counts.group(1).split(",") if c.strip())
            if total:
                ran[name] = ran.get(name, 0) + total
    return [n for n, _ in sorted(ran.items(), key=lambda r: -r[1])], known


def touched_functions(binary, touched):
    """Functions of `binary` on the code pages (file offsets in `touched`), by address."""
    segments = []
    for line in subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        f = line.split()
        if f and f[0] == "LOAD" and "E" in f[6:-1]:
            segments.append((int(f[1], 16), int(f[2], 16), int(f[4], 16)))
    symbols = []
    for line in subprocess.run(["nm", "-S", "-n", binary], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        f = line.split()
        if len(f) == 4 and f[2] in "tTwW":
            symbols.append((int(f[0], 16), int(f[1], 16), f[3]))
    symbols.sort()
    starts = [s[0] for s in symbols]
    pages = set()
    for line in open(touched):
        offset = int(line)
        for file_offset, vaddr, size in segments:
            if file_offset <= offset < file_offset + size:
                pages.add(vaddr + offset - file_offset)
    found = []
    for page in sorted(pages):
        i = max(bisect.bisect_right(starts, page) - 1, 0)
        while i < len(symbols) and symbols[i][0] < page + PAGE:
            address, size, name = symbols[i]
            if address + size > page:
                found.append(name)
            i += 1
    return list(dict.fromkeys(found))


def run_order(functions, binary, touched):
    """The functions one run executed: the profile's, hottest first, then the rest of
    the touched pages' that may have run."""
    ran, known = profile(functions)
    ran_set, ran_bases = set(ran), {base(n) for n in ran}
    extra = [n for n in touched_functions(binary, touched)
             if n not in ran_set and (base(n) in ran_bases or base(n) not in known)]
    print(f"{functions}: {len(ran)} functions ran by the profile, {len(extra)} more from "
          "touched pages", file=sys.stderr)
    return ran + extra


def main():
    binary, runs = sys.argv[1], sys.argv[2:]
    order = []
    for i in range(0, len(runs) - 1, 2):
        order += run_order(runs[i], binary, runs[i + 1])
    for name in dict.fromkeys(order):
        print(name)


if __name__ == "__main__":
    main()

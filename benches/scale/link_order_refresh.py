#!/usr/bin/env python3
"""Carries link-order.txt across a code change without another profiling run.

The list names symbols, and more than the toolchain and Cargo.lock rename them: a
function whose signature changes gets a new legacy hash, and LTO numbers its local
copies (".N") anew whenever the code around them changes. Listed names the new
executable lacks fall out of the packed region, and each one the edge still runs
costs a fault-around's worth of resident text (session 19: 170 such names, +1.7 MiB
of idle RSS after an ordinary change to the reconciler).

For each listed name BIN lacks, this puts in its place BIN's functions of the same
base name (hash and LTO suffix removed, as link_order_list.py compares them) that the
list does not already hold, when there are at most MAX_VARIANTS of them: a renamed
function or a renumbered local copy, not every instance of a generic adapter. Names
with no counterpart stay (a later build may have them again). Given the executable
the list was made for (OLD_BIN), the functions the change added (base names OLD_BIN
lacks) are appended: whether they run is unknown, but they are few and new code sits
on the paths the change touched. Only link-order.sh's full run knows for sure.

Usage: link_order_refresh.py BIN [OLD_BIN] < link-order.txt > new-list
(prints counts on stderr)
"""
import subprocess
import sys

from link_order_list import base

MAX_VARIANTS = 4


def functions(binary):
    out = []
    for line in subprocess.run(["nm", binary], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        f = line.split()
        if len(f) == 3 and f[1] in "tTwW":
            out.append(f[2])
    return out


def main():
    binary = sys.argv[1]
    symbols = functions(binary)
    present = set(symbols)
    by_base = {}
    for name in symbols:
        by_base.setdefault(base(name), []).append(name)
    listed = [line.strip() for line in sys.stdin if line.strip()]
    listed_set = set(listed)
    out, emitted, replaced, added = [], set(), 0, 0
    for name in listed:
        if name in present:
            if name not in emitted:
                out.append(name)
                emitted.add(name)
            continue
        candidates = [c for c in by_base.get(base(name), [])
                      if c not in listed_set and c not in emitted]
        if 1 <= len(candidates) <= MAX_VARIANTS:
            replaced += 1
            added += len(candidates)
            out.extend(candidates)
            emitted.update(candidates)
        else:
            out.append(name)
    new = []
    if len(sys.argv) > 2:
        old_bases = {base(n) for n in functions(sys.argv[2])}
        new = [n for n in symbols if base(n) not in old_bases and n not in emitted]
        out.extend(new)
    for name in out:
        print(name)
    found = sum(1 for n in out if n in present)
    print(f"{replaced} listed names replaced by {added} of {binary}'s, {len(new)} new "
          f"functions appended; {found} of {len(out)} names found", file=sys.stderr)


if __name__ == "__main__":
    main()

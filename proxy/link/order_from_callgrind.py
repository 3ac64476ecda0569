#!/usr/bin/env python3
"""Writes proxy/link/hot-code.order and startup-code.order from callgrind profiles of sidecars.

Usage (benches/README.md, "Hot code order", says how the profiles are made):

    order_from_callgrind.py REVOY --startup S1.out [S2.out ...] --serving F1.out [F2.out ...]

REVOY is the release binary the profiles ran (its text symbols are the only names kept).
Each startup profile ran a sidecar from its start until it was live and configured; each
serving profile ran a sidecar from its start through traffic, admin scrapes included.
A function is a serving one when the serving profiles ran more of its instructions than the
startup profiles did (a function both run is on the hot list: a serving function misplaced
among the start-up ones costs a 64 KiB fault-around window, a start-up one misplaced among
the hot ones only its size): hot-code.order lists those, the most instructions first, then the names of the previous hot list that the
binary still has (paths the profiles did not take, such as a plain edge proxy's). The
startup list is every other function the startup profiles ran, in the order they first ran.
"""

import argparse
import collections
import re
import subprocess
from pathlib import Path

LINK = Path(__file__).resolve().parent


def text_symbols(binary):
    """The names of the binary's code symbols."""
    out = subprocess.run(
        ["nm", "--defined-only", binary], capture_output=True, text=True, check=True
    ).stdout
    return {p[2] for p in (line.split() for line in out.splitlines()) if len(p) == 3 and p[1] in "tT"}


def profile(path):
    """Self instructions per function of a callgrind file, and the order functions first ran."""
    cost, order, seen = collections.Counter(), [], set()
    fn, after_call = None, False
    for line in open(path, errors="replace"):
        if line.startswith("fn="):
            fn, after_call = re.sub(r"'[0-9]+$", "", line[3:].strip()), False
            if fn not in seen:
                seen.add(fn)
                order.append(fn)
        elif line.startswith("calls="):
            after_call = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            if after_call:
                after_call = False
                continue
            parts = line.split()
            if fn is not None and len(parts) >= 2 and parts[1].isdigit():
                cost[fn] += int(parts[1])
    return cost, order


def main():
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("binary")
    args.add_argument("--startup", nargs="+", required=True)
    args.add_argument("--serving", nargs="+", required=True)
    opts = args.parse_args()
    symbols = text_symbols(opts.binary)
    startup, first_ran = collections.Counter(), []
    for path in opts.startup:
        cost, order = profile(path)
        startup.update(cost)
        first_ran += order
    serving = collections.Counter()
    for path in opts.serving:
        serving.update(profile(path)[0])
    more = {
        fn: ran - startup[fn]
        for fn, ran in serving.items()
        if fn in symbols and ran > startup[fn]
    }
    hot = sorted(more, key=lambda fn: (-more[fn], fn))
    previous = (LINK / "hot-code.order").read_text().split()
    hot += [fn for fn in dict.fromkeys(previous) if fn in symbols and fn not in more]
    taken = set(hot)
    start = [fn for fn in dict.fromkeys(first_ran) if fn in symbols and fn not in taken]
    (LINK / "hot-code.order").write_text("\n".join(hot) + "\n")
    (LINK / "startup-code.order").write_text("\n".join(start) + "\n")
    print(f"hot: {len(more)} serving + {len(hot) - len(more)} kept; startup: {len(start)}")


if __name__ == "__main__":
    main()

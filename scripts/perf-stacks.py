#!/usr/bin/env python3
"""Where a profiled step's samples go, from `perf script -F ip,sym` of a call-graph profile.

    perf record -F 199 --call-graph dwarf,16384 -D 8000 -o step.perf \\
        ember bench CONFIG --steps 40 --warmup 4 ...
    perf script -i step.perf -F ip,sym > step.stacks
    scripts/perf-stacks.py step.stacks                      # self and inclusive shares
    scripts/perf-stacks.py step.stacks --callers pack_strip # Ember's frames above a leaf
    scripts/perf-stacks.py step.stacks --group 'products=piece_on_tiles,pack_' --group 'GELU=gelu'

Each sample is one stack, leaf first. A symbol's self share is the samples whose leaf it is; its
inclusive share the samples with it anywhere on the stack. `--callers LEAF` groups the samples
whose leaf symbol contains LEAF by the Ember functions above it (closures, rayon and the
thread-pool frames skipped), so that a packer's time is charged to the op that called it.
`--group NAME=SUBSTR[,SUBSTR...]` (repeatable) charges each sample to the first group, in the
order given, with a frame containing any of its substrings, and the rest to "rest": shares that
add up to 100%, where inclusive shares overlap.
"""
import argparse
import collections


def stacks(path):
    """Yields each sample's stack: symbol names, leaf first, offsets dropped."""
    stack = []
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                if stack:
                    yield stack
                stack = []
                continue
            parts = line.split(None, 1)
            stack.append((parts[1] if len(parts) > 1 else parts[0]).split("+0x")[0])
    if stack:
        yield stack


def is_ember_frame(symbol):
    skipped = ("{closure", "par::", "for_each", "rayon")
    return "ember" in symbol and not any(s in symbol for s in skipped)


def short(symbol, width=70):
    for prefix in ("ember_kernels::", "ember_model::", "ember_trainer::"):
        symbol = symbol.replace(prefix, "")
    return symbol[:width]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stacks", help="output of `perf script -F ip,sym`")
    ap.add_argument("--callers", metavar="LEAF", help="group the samples of this leaf by their callers")
    ap.add_argument("--depth", type=int, default=4, help="caller frames per group (default 4)")
    ap.add_argument("--top", type=int, default=40, help="rows per table (default 40)")
    ap.add_argument("--group", action="append", default=[], metavar="NAME=SUBSTR[,SUBSTR...]",
                    help="charge each sample to the first group with a matching frame (repeatable)")
    args = ap.parse_args()
    groups = []
    for spec in args.group:
        name, sep, keys = spec.partition("=")
        if not sep or not name or not keys:
            raise SystemExit(f"perf-stacks: --group {spec!r}: expected NAME=SUBSTR[,SUBSTR...]")
        groups.append((name, [k for k in keys.split(",") if k]))

    total, own, anywhere, callers = 0, collections.Counter(), collections.Counter(), collections.Counter()
    grouped = collections.Counter()
    for stack in stacks(args.stacks):
        total += 1
        if groups:
            name = next((n for n, keys in groups if any(k in s for s in stack for k in keys)), "rest")
            grouped[name] += 1
        own[stack[0]] += 1
        anywhere.update(set(stack))
        if args.callers and args.callers in stack[0]:
            frames = [short(s) for s in stack[1:] if is_ember_frame(s)][: args.depth]
            callers[" < ".join(frames)] += 1
    if total == 0:
        raise SystemExit(f"perf-stacks: no samples in {args.stacks}")
    pct = lambda n: f"{100 * n / total:6.2f}%"
    print(f"{total} samples")
    if groups:
        print("== groups (each sample in the first that matches) ==")
        for name in [n for n, _ in groups] + ["rest"]:
            print(pct(grouped[name]), name)
        return
    if args.callers:
        print(f"== {args.callers}: {pct(sum(callers.values()))} of the samples, by caller ==")
        for key, n in callers.most_common(args.top):
            print(pct(n), key)
        return
    print("== self ==")
    for symbol, n in own.most_common(args.top):
        print(pct(n), short(symbol, 150))
    print("== inclusive ==")
    for symbol, n in anywhere.most_common(args.top):
        print(pct(n), short(symbol, 150))


if __name__ == "__main__":
    main()

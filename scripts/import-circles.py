#!/usr/bin/env python3
"""Import circles between the source files of each crate: file A uses a name of file B (through
`crate::…`, `super::…` or `self::…`, in a `use` or inline) and B, directly or not, uses A's.

    scripts/import-circles.py [--verbose]

Prints every circle with the names that tie it and exits 1 if there is one. Test code is left
out (files under tests/ or benches/, and everything after a `#[cfg(test)]` line), and so are a
file's own `mod x;` declarations (declaring a child is not using it). A path is resolved to the
deepest module file that exists (`crate::a::b::C` is a/b.rs, a/b/mod.rs or else a.rs), which is
what the code's layout allows without a Rust parser; `use` groups (`use crate::{a, b::c}`) are
expanded one level at a time.
"""
import argparse
import pathlib
import re
import sys

from rust_source import code_of, split_group

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATH = re.compile(r"\b(crate|super|self)((?:::\w+)+)")
GROUP = re.compile(r"\b(crate|super|self)((?:::\w+)*)::\{")


def module_of(src, path):
    """The module path (list of names) of a source file below src/."""
    rel = list(path.relative_to(src).with_suffix("").parts)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return rel


def file_of(src, module):
    """The file that holds `module` (list of names), or None."""
    if not module:
        for root in ("lib.rs", "main.rs"):
            if (src / root).exists():
                return src / root
        return None
    for cand in (src.joinpath(*module).with_suffix(".rs"), src.joinpath(*module, "mod.rs")):
        if cand.exists():
            return cand
    return None


def expand_groups(code):
    """`crate::a::{b, c::d}` -> `crate::a::b crate::a::c::d` (repeated for nested groups)."""
    for _ in range(4):
        m = GROUP.search(code)
        if not m:
            break
        start = m.end()
        depth, i = 1, start
        while i < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        parts = split_group(code[start : i - 1])
        prefix = m.group(1) + m.group(2)
        expanded = " ".join(f"{prefix}::{p.strip()}" for p in parts if p.strip())
        code = code[: m.start()] + expanded + code[i:]
    return code


def edges_of_crate(src):
    edges = {}
    for path in sorted(src.rglob("*.rs")):
        text = expand_groups(code_of(path))
        here = module_of(src, path)
        # `self::` and `super::` are relative to the file's module (mod.rs/lib.rs: the folder).
        for m in PATH.finditer(text):
            kind, rest = m.group(1), m.group(2).split("::")[1:]
            if kind == "crate":
                base = []
            elif kind == "self":
                base = list(here)
            else:
                base = list(here[:-1])
                while rest and rest[0] == "super":
                    base, rest = base[:-1], rest[1:]
            target = None
            for k in range(len(rest), -1, -1):
                target = file_of(src, base + rest[:k])
                if target is not None:
                    name = rest[k] if k < len(rest) else (rest[-1] if rest else "")
                    break
            if target is None or target == path:
                continue
            # A parent using its own child module is fine; a child using its parent is too.
            edges.setdefault(path, {}).setdefault(target, set()).add(name)
    return edges


def circles(edges):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verbose", action="store_true", help="print every edge too")
    args = ap.parse_args()
    srcs = sorted(p.parent for p in ROOT.glob("crates/*/src/lib.rs")) + [ROOT / "src"]
    found = 0
    files = 0
    for src in srcs:
        edges = edges_of_crate(src)
        files += len(list(src.rglob("*.rs")))
        if args.verbose:
            for a, bs in sorted(edges.items()):
                for b, names in sorted(bs.items()):
                    print(f"{a.relative_to(ROOT)} -> {b.relative_to(ROOT)}: {', '.join(sorted(names))}")
        for comp in circles(edges):
            found += 1
            print(f"circle {found}: {', '.join(str(p.relative_to(ROOT)) for p in comp)}")
            inside = set(comp)
            for a in comp:
                for b, names in sorted(edges.get(a, {}).items()):
                    if b in inside:
                        print(f"  {a.relative_to(ROOT)} -> {b.relative_to(ROOT)}: {', '.join(sorted(names))}")
    print(f"{found} import circles among {files} source files of {len(srcs)} crates")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Names a crate makes importable by more than one public path (a `pub use` re-export of an item
that is already public where it is defined), for keeping one path per name.

    scripts/public-paths.py [--all]

For each library crate, walks the modules from lib.rs (`pub mod` is public, `mod` private; a
`#[cfg(...)]` module counts as public if declared `pub`; a module of a private folder that a
public module re-exports, `pub use group::module;`, is public at the re-exported path), collects the items declared `pub` at the top level of
public modules and the `pub use` re-exports in public modules, and prints every name reachable
by two or more paths; exits 1 if there is one. `--all` prints every public path. Test code
(after a `#[cfg(test)]` line) is left out; `pub use` of another crate's item counts as a path of
this crate's too, since a caller can import it from here.
"""
import argparse
import pathlib
import re
import sys

from rust_source import code_of, split_group

ROOT = pathlib.Path(__file__).resolve().parent.parent
MOD = re.compile(r"^\s*(pub\s+)?mod\s+(\w+)\s*;", re.M)
ITEM = re.compile(r"^pub\s+(?:const\s+fn|async\s+fn|unsafe\s+fn|fn|struct|enum|const|static|trait|type|union)\s+(\w+)", re.M)
MACRO = re.compile(r"#\[macro_export\]\s*macro_rules!\s*(\w+)")
PUB_USE = re.compile(r"^pub\s+use\s+([^;]+);", re.M | re.S)


def child_file(path, name):
    base = path.parent if path.name in ("lib.rs", "mod.rs") else path.with_suffix("")
    for cand in (base / f"{name}.rs", base / name / "mod.rs"):
        if cand.exists():
            return cand
    return None


def module_file(path, full, lib):
    """The file of the module `full` (`a::b`, `crate::a::b`, `self::a`) names, seen from the module
    in `path`; None when it names no module of this crate."""
    parts = full.split("::")
    if parts[0] == "crate":
        path, parts = lib, parts[1:]
    elif parts[0] == "self":
        parts = parts[1:]
    for name in parts:
        path = child_file(path, name)
        if path is None:
            return None
    return path if parts else None


def use_leaves(spec):
    """`a::{b, c::{d, e as f}}` -> [("a::b", "b"), ("a::c::d", "d"), ("a::c::e", "f")]."""
    spec = " ".join(spec.split())
    m = re.match(r"^(.*?)::\{(.*)\}$", spec)
    if not m:
        alias = re.match(r"^(.*)\s+as\s+(\w+)$", spec)
        if alias:
            return [(alias.group(1).strip(), alias.group(2))]
        return [(spec, spec.split("::")[-1])]
    prefix, parts = m.group(1), split_group(m.group(2))
    out = []
    for p in parts:
        p = p.strip()
        if not p:
            continue
        if p == "self":
            out.append((prefix, prefix.split("::")[-1]))
            continue
        out += [(f"{prefix}::{full}", name) for full, name in use_leaves(p)]
    return out


args_all = False


def crate_paths(lib):
    crate = "ember_" + lib.parent.parent.name.replace("-", "_")
    defined = {}  # name -> paths where an item of that name is defined
    exported = {}  # name -> paths where it is re-exported
    todo = [(lib, [crate], True)]
    while todo:
        path, module, public = todo.pop()
        code = code_of(path)
        for m in MOD.finditer(code):
            child = child_file(path, m.group(2))
            if child:
                todo.append((child, module + [m.group(2)], public and bool(m.group(1))))
        if not public:
            continue
        for m in ITEM.finditer(code):
            defined.setdefault(m.group(1), set()).add("::".join(module + [m.group(1)]))
        for m in MACRO.finditer(code):
            defined.setdefault(m.group(1), set()).add(f"{crate}::{m.group(1)}")
        for m in PUB_USE.finditer(code):
            for full, name in use_leaves(m.group(1)):
                if name in ("*", "self"):
                    continue
                reexported = module_file(path, full, lib)
                if reexported is not None:
                    todo.append((reexported, module + [name], True))
                    continue
                exported.setdefault(name, set()).add("::".join(module + [name]))
    # Two items of one name in two modules are two names (`cache::load`, `hf_dataset::load`);
    # a re-export is a second path to a name defined (or re-exported) elsewhere.
    paths = {n: defined.get(n, set()) | exported.get(n, set()) for n in set(defined) | set(exported)}
    return crate, {n: ps for n, ps in paths.items() if n in exported or args_all}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true")
    args = ap.parse_args()
    global args_all
    args_all = args.all
    found = 0
    for lib in sorted(ROOT.glob("crates/*/src/lib.rs")):
        crate, paths = crate_paths(lib)
        for name, ps in sorted(paths.items()):
            if len(ps) > 1 or args.all:
                if len(ps) > 1:
                    found += 1
                print(f"{crate}: {name}: {', '.join(sorted(ps))}")
    print(f"{found} names with more than one public path")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()

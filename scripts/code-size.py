#!/usr/bin/env python3
"""The largest Rust source files and functions of the workspace, for keeping modules small.

    scripts/code-size.py [--files N] [--fns N] [--max-file LINES] [--max-fn LINES]

Lists the N longest non-test source files (whole files, lines as `wc -l` counts them) and the N
longest functions outside tests (from the `fn` line to its closing brace), then every file over
--max-file (default 700) and function over --max-fn (default 100) lines, and exits 1 if there
is any. Test code is left out: files under a `tests/` or `benches/` folder, files declared
`#[cfg(test)] mod name;` and everything after a `#[cfg(test)]` line. A function whose doc comment contains "long because" is listed as excused.
Braces are counted outside strings, chars and comments, which is enough for rustfmt-formatted code.
"""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FN = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?((const|async|unsafe|extern "C")\s+)*fn\s+(\w+)')
TOKEN = re.compile(r'//.*|/\*.*?\*/|r(#*)".*?"\1|b?"(\\.|[^"\\])*"|b?\'(\\.|[^\\\'])\'|[{}]')


def test_modules():
    """Files declared `#[cfg(test)] mod name;` by their parent: test code kept in a file of its own."""
    found = set()
    for path in ROOT.rglob("*.rs"):
        if path.relative_to(ROOT).parts[0].startswith("target"):
            continue
        lines = path.read_text().splitlines()
        for prev, line in zip(lines, lines[1:]):
            m = re.match(r"\s*(pub(\([^)]*\))?\s+)?mod\s+(\w+)\s*;", line)
            if m and prev.strip() == "#[cfg(test)]":
                base = path.parent if path.name in ("lib.rs", "mod.rs", "main.rs") else path.with_suffix("")
                found |= {base / f"{m.group(3)}.rs", base / m.group(3) / "mod.rs"}
    return found


def sources():
    tests = test_modules()
    for path in sorted(ROOT.rglob("*.rs")):
        if path in tests:
            continue
        rel = path.relative_to(ROOT)
        parts = rel.parts
        if parts[0].startswith("target") or parts[0] in ("runs", "data", ".dev"):
            continue
        if "tests" in parts or "benches" in parts:
            continue
        yield rel, path.read_text().splitlines()


def braces(line, in_string):
    """Net brace count of a line; `in_string` carries a multi-line string literal across lines."""
    if in_string:
        end = re.search(r'(?<!\\)"', line)
        if not end:
            return 0, True
        line = line[end.end():]
    depth = 0
    for m in TOKEN.finditer(line):
        t = m.group(0)
        if t == "{":
            depth += 1
        elif t == "}":
            depth -= 1
    # An unterminated string opening on this line (multi-line literal).
    stripped = TOKEN.sub("", line)
    return depth, stripped.count('"') % 2 == 1


def functions(lines):
    """(name, first line, length, excused) of every function before the first #[cfg(test)]."""
    end = next((i for i, l in enumerate(lines) if l.strip() == "#[cfg(test)]"), len(lines))
    found = []
    for i in range(end):
        m = FN.match(lines[i])
        if not m:
            continue
        depth, in_string, opened = 0, False, False
        for j in range(i, len(lines)):
            d, in_string = braces(lines[j], in_string)
            if not opened and ";" in lines[j] and d == 0 and "{" not in lines[j]:
                break  # a declaration without a body (trait method)
            depth += d
            opened = opened or "{" in lines[j]
            if opened and depth <= 0:
                doc = []
                k = i - 1
                while k >= 0 and (lines[k].strip().startswith(("///", "#["))):
                    doc.append(lines[k])
                    k -= 1
                found.append((m.group(5), i + 1, j - i + 1, "long because" in " ".join(doc)))
                break
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--fns", type=int, default=10)
    ap.add_argument("--max-file", type=int, default=700)
    ap.add_argument("--max-fn", type=int, default=100)
    args = ap.parse_args()
    files, fns = [], []
    for rel, lines in sources():
        files.append((len(lines), str(rel)))
        fns += [(n, f"{rel}:{line}", name, ok) for name, line, n, ok in functions(lines)]
    files.sort(reverse=True)
    fns.sort(reverse=True)
    print(f"Largest files ({len(files)} non-test source files):")
    for n, rel in files[: args.files]:
        print(f"  {n:5}  {rel}")
    print(f"Longest functions ({len(fns)} outside tests):")
    for n, at, name, ok in fns[: args.fns]:
        print(f"  {n:5}  {name}  {at}{'  (excused: long because)' if ok else ''}")
    over_files = [(n, r) for n, r in files if n > args.max_file]
    over_fns = [(n, a, nm) for n, a, nm, ok in fns if n > args.max_fn and not ok]
    print(f"Over {args.max_file} lines: {len(over_files)} files; over {args.max_fn} lines: {len(over_fns)} functions")
    for n, r in over_files:
        print(f"  file {n:5}  {r}")
    for n, a, nm in over_fns:
        print(f"  fn   {n:5}  {nm}  {a}")
    sys.exit(1 if over_files or over_fns else 0)


if __name__ == "__main__":
    main()

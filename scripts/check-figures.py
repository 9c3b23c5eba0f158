#!/usr/bin/env python3
"""Every measured figure the README and the guide state must be held by docs/results or
docs/performance.md, so that a figure always leads back to the run, commit and machine that
measured it.

A figure here is a number with a decimal point, or one followed by ×, % or a unit of time,
memory or speed (`2.01×`, `0.328`, `1.9%`, `23.5 s`, `511 MiB`). Each must appear in the
record: in a README/report/table of docs/results, in docs/performance.md, or as a value of a
committed report.json/summary.json there, rounded to the digits the text gives (21.2469… holds
"21.2"). Counts and settings (600 steps, 3 seeds, lr 3e-3) are not figures.

Usage: scripts/check-figures.py [FILE.md ...]   (default: README.md and docs/guide/**/*.md,
except the generated config reference). Exits 1 listing each figure it could not find.
"""
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD_TEXT = ["docs/performance.md"]
UNITS = r"(?:×|%|\s?(?:ms|s|min|h|GiB|MiB|GB|MB|KB|kB|tokens/s|BLEU))"
# A number: optional sign, digits with thousands commas, optional decimals, optional exponent.
NUMBER = r"[+\-−]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|[+\-−]?\d+(?:\.\d+)?(?:e[+\-−]?\d+)?"
FIGURE = re.compile(rf"(?<![\w./`-])({NUMBER})({UNITS})?(?![\w/]|\.\d)")


def normal(token):
    """A number as text, without sign, thousands commas or a trailing unit."""
    return token.replace("−", "-").lstrip("+-").replace(",", "")


def record():
    """Every number the record holds, as written and rounded to 0–4 decimals."""
    held = set()

    def add_text(text):
        for m in re.finditer(NUMBER, text):
            number = normal(m.group(0))
            held.add(number)
            if "." in number and "e" not in number:
                # "2.1782" in a table holds "2.178" in prose.
                for d in range(len(number.split(".")[1])):
                    held.add(f"{float(number):.{d}f}")

    def add_value(v):
        if isinstance(v, bool):
            return
        if isinstance(v, (int, float)):
            x = abs(float(v))
            held.add(normal(repr(v)))
            for d in range(5):
                held.add(f"{x:.{d}f}")
                # 3.27e-06 holds "3.3e-6"
                mantissa, exponent = f"{x:.{d}e}".split("e")
                held.add(f"{mantissa}e{int(exponent)}")
        elif isinstance(v, dict):
            for w in v.values():
                add_value(w)
        elif isinstance(v, list):
            for w in v:
                add_value(w)
        elif isinstance(v, str):
            add_text(v)

    for rel in RECORD_TEXT:
        add_text((ROOT / rel).read_text())
    results = ROOT / "docs/results"
    for path in results.rglob("*"):
        if path.suffix == ".md":
            add_text(path.read_text())
        elif path.name in ("report.json", "summary.json", "check-hf-import.json"):
            try:
                add_value(json.loads(path.read_text()))
            except (ValueError, UnicodeDecodeError):
                pass
    return held


def figures(text):
    """(line number, figure) for every figure of a Markdown text, code blocks and inline code
    (commands, config values, commit hashes) and link targets left out."""
    out = []
    in_code = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code or line.lstrip().startswith("<!--"):
            continue
        line = re.sub(r"`[^`]*`", " ", line)
        line = re.sub(r"\]\([^)]*\)", "]", line)
        for m in FIGURE.finditer(line):
            number, unit = m.group(1), m.group(2)
            if "." in number or "e" in number or unit:
                out.append((n, m.group(0).strip(), normal(number)))
    return out


def main(argv):
    files = [Path(a) for a in argv] or [ROOT / "README.md"] + sorted(
        p for p in (ROOT / "docs/guide").rglob("*.md") if p.name != "config.md"
    )
    held = record()
    missing = []
    for path in files:
        for n, shown, number in figures(path.read_text()):
            if number not in held:
                missing.append(f"{path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path}:{n}: {shown}")
    for m in missing:
        print(m)
    print(f"{len(missing)} figure(s) not held by docs/results or docs/performance.md")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

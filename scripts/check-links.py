#!/usr/bin/env python3
"""Checks every relative link of the README, the user guide (docs/guide) and docs/*.md: the file
or folder it names exists, and a `#fragment` names a heading of the Markdown file it points to
(GitHub's and mdBook's anchors: lowercased, punctuation dropped, spaces as hyphens). Also checks
that every page of the guide is in its SUMMARY.md, so that the built book has it.

Written here rather than taken from mdbook-linkcheck: its last release (0.7.7) is built against
mdBook 0.4 and an HTTP client with a vendored OpenSSL, and it checks only the book's own pages,
while the guide and the README link into docs/results, the configs and the sources, which must
be checked against the repository. Web links are not fetched (CI has no network but the package
registries).

Usage: scripts/check-links.py [FILE.md ...]   Exits 1 listing each broken link.
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"""(?:href|src)=["']([^"']+)["']""")


def default_files():
    files = [ROOT / "README.md"]
    files += sorted((ROOT / "docs/guide").rglob("*.md"))
    files += sorted((ROOT / "docs").glob("*.md"))
    return files


def slug(heading):
    """The anchor GitHub and mdBook give a heading."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found = set()
        in_code = False
        counts = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m and not in_code:
                s = slug(m.group(1))
                n = counts.get(s, 0)
                counts[s] = n + 1
                found.add(s if n == 0 else f"{s}-{n}")
            for a in re.findall(r"""<a\s+(?:name|id)=["']([^"']+)["']""", line):
                found.add(a)
        cache[path] = found
    return cache[path]


def links(text):
    """(line number, target) of every link outside code."""
    in_code = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        for m in LINK.finditer(line):
            yield n, m.group(1)
        for m in HTML_LINK.finditer(line):
            yield n, m.group(1)


def check(path):
    problems = []
    text = path.read_text(encoding="utf-8")
    for n, target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:
        file_part, _, fragment = target.partition("#")
        dest = path if not file_part else (path.parent / file_part).resolve()
        where = f"{path.relative_to(ROOT)}:{n}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file or folder")
            continue
        if fragment and dest.is_file() and dest.suffix == ".md" and fragment not in anchors(dest):
            problems.append(f"{where}: {dest.relative_to(ROOT)} has no heading #{fragment}")
    return problems


def summary_problems():
    guide = ROOT / "docs/guide"
    summary = guide / "SUMMARY.md"
    listed = {(guide / t).resolve() for _, t in links(summary.read_text(encoding="utf-8"))}
    pages = {p.resolve() for p in guide.rglob("*.md") if p.name != "SUMMARY.md"}
    return [f"docs/guide/{p.relative_to(guide)}: not in docs/guide/SUMMARY.md" for p in sorted(pages - listed)]


def main(argv):
    files = [Path(a).resolve() for a in argv] or default_files()
    problems = []
    for f in files:
        problems += check(f)
    if not argv:
        problems += summary_problems()
    for p in problems:
        print(p)
    print(f"{len(files)} files checked: {len(problems)} broken link(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

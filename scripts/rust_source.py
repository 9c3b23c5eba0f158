"""Reading Rust source as text for the structure checks (import-circles.py, public-paths.py):
enough for rustfmt-formatted code, no Rust parser."""
import re


def code_of(path):
    """The file's code without comments, cut at its first `#[cfg(test)]` (the tests after it)."""
    text = path.read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = "\n".join(re.sub(r"//.*", "", line) for line in text.splitlines())
    cut = text.find("#[cfg(test)]")
    return text if cut < 0 else text[:cut]


def split_group(inner):
    """The items of a `use` group's inside, `b, c::{d, e}` -> ["b", " c::{d, e}"]."""
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    return parts

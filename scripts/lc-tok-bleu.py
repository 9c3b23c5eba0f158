#!/usr/bin/env python3
"""BLEU on Multi30k's lowercased, tokenised files, the convention of the literature's numbers.

The task-1 `*.lc.norm.tok.*` files were made with Moses' lowercase.perl,
normalize-punctuation.perl and tokenizer.perl. This script applies the same three steps (through
sacremoses) to detokenised system output and scores it against the `.lc.norm.tok` reference with
`ember bleu --tokenize none`. It first checks that the pipeline turns the raw reference into the
`.lc.norm.tok` reference line for line, so the comparison is like for like.

    pip install sacremoses
    scripts/lc-tok-bleu.py HYP [--split test_2016_flickr] [--lang de] [--ember target/release/ember]
"""
import argparse
import gzip
import subprocess
import sys
import tempfile

from sacremoses import MosesPunctNormalizer, MosesTokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hyp", help="detokenised, cased system output, one sentence per line")
    ap.add_argument("--split", default="test_2016_flickr")
    ap.add_argument("--lang", default="de")
    ap.add_argument("--data", default="data/multi30k")
    ap.add_argument("--ember", default="target/release/ember")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    norm, tok = MosesPunctNormalizer(lang=args.lang), MosesTokenizer(lang=args.lang)

    def lc_norm_tok(line):
        return tok.tokenize(norm.normalize(line.lower()), escape=True, return_str=True)

    with gzip.open(f"{args.data}/{args.split}.{args.lang}.gz", "rt", encoding="utf-8") as f:
        raw = [line.rstrip("\n") for line in f]
    ref_path = f"{args.data}/{args.split}.lc.norm.tok.{args.lang}"
    with open(ref_path, encoding="utf-8") as f:
        ref = [line.rstrip("\n") for line in f]
    same = sum(lc_norm_tok(r) == t for r, t in zip(raw, ref))
    print(f"pipeline check: {same}/{len(ref)} raw reference lines become the {ref_path} line", file=sys.stderr)
    if same != len(ref):
        sys.exit("the preprocessing does not reproduce the reference; the scores would not be comparable")

    with open(args.hyp, encoding="utf-8") as f:
        hyp = [lc_norm_tok(line.rstrip("\n")) for line in f]
    if len(hyp) != len(ref):
        sys.exit(f"{args.hyp} has {len(hyp)} lines, the reference {len(ref)}")
    with tempfile.NamedTemporaryFile("w", suffix=".lc.norm.tok", encoding="utf-8", delete=False) as f:
        f.write("\n".join(hyp) + "\n")
        hyp_tok = f.name
    cmd = [args.ember, "bleu", "-r", ref_path, "-i", hyp_tok, "--tokenize", "none"] + (["--json"] if args.json else [])
    sys.exit(subprocess.call(cmd))


if __name__ == "__main__":
    main()

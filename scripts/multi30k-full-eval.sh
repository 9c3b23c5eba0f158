#!/usr/bin/env bash
# Evaluates the finished runs of the full-recipe Multi30k study (configs/multi30k-tiny-lc.yaml) as
# Transformer-Tiny was evaluated (Wu et al. 2021, fairseq): the average of the last 10 epoch
# checkpoints, beam 5, BLEU-4 on the lowercased tokenised test2016 with --tokenize none; also
# chrF, the test loss, and the same for the last checkpoint alone. Writes, per run directory:
#
#   test-avg10.hyp / .eval.json / .bleu.json    averaged checkpoint (checkpoints/average-last-10)
#   test-last.hyp  / .eval.json / .bleu.json    the newest checkpoint alone
#   test-avg10.detok.bleu.json                   the averaged checkpoint's output detokenised
#                                                (sacremoses' Moses detokenizer) and scored with
#                                                sacreBLEU's default 13a against the raw test2016
#                                                reference, case-insensitively (the output is
#                                                lowercased): the score of detokenised-text papers
#
# sacremoses lives in a virtual environment outside the repository ($EMBER_MOSES_VENV, default
# ~/.cache/ember/moses-venv), created on first use.
#
# Runs that are not finished, or already evaluated, are skipped, so it can run after every cell.
#
#   scripts/multi30k-full-eval.sh [--ember BIN] SWEEP_DIR...
set -euo pipefail
cd "$(dirname "$0")/.."
ember=target/release/ember
while [[ ${1:-} == --* ]]; do
  case $1 in
    --ember) ember=$2; shift 2 ;;
    *) echo "unknown option $1; usage: $0 [--ember BIN] SWEEP_DIR..." >&2; exit 2 ;;
  esac
done
[[ $# -gt 0 ]] || { echo "usage: $0 [--ember BIN] SWEEP_DIR..." >&2; exit 2; }
ref=data/multi30k/test_2016_flickr.lc.norm.tok.de
[[ -f $ref ]] || { echo "$ref is missing: run scripts/get-data.sh" >&2; exit 1; }

venv=${EMBER_MOSES_VENV:-$HOME/.cache/ember/moses-venv}
py=$venv/bin/python
if ! "$py" -c 'import sacremoses' 2>/dev/null; then
  echo "== installing sacremoses into $venv (once)" >&2
  python3 -m venv "$venv" && "$py" -m pip install --quiet sacremoses==0.1.1 \
    || { echo "cannot install sacremoses into $venv" >&2; exit 1; }
fi
raw_ref=$(mktemp); trap 'rm -f "$raw_ref"' EXIT
gzip -dc data/multi30k/test_2016_flickr.de.gz > "$raw_ref"

finished() { python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1])).get("finished") else 1)' "$1" 2>/dev/null; }

score() {  # checkpoint dir, output prefix
  "$ember" eval "$1" --split test --beam 5 --output "$2.hyp" --json > "$2.eval.json"
  "$ember" bleu -r "$ref" -i "$2.hyp" --tokenize none --metrics bleu,chrf --json > "$2.bleu.json"
}

for sweep in "$@"; do
  for run in "$sweep"/runs/*/; do
    run=${run%/}
    finished "$run/summary.json" || { echo "skip (not finished): $run"; continue; }
    if [[ ! -f $run/test-avg10.bleu.json ]]; then
      echo "== $run: averaging the last 10 checkpoints"
      "$ember" average "$run" --last 10 > /dev/null
      score "$run/checkpoints/average-last-10" "$run/test-avg10"
    fi
    if [[ ! -f $run/test-last.bleu.json ]]; then
      newest=$(ls -d "$run"/checkpoints/step-* | sort | tail -1)
      score "$newest" "$run/test-last"
    fi
    if [[ ! -f $run/test-avg10.detok.bleu.json ]]; then
      "$py" -c 'import sys; from sacremoses import MosesDetokenizer as D; d = D(lang="de")
for line in open(sys.argv[1], encoding="utf-8"): print(d.detokenize(line.split()))' \
        "$run/test-avg10.hyp" > "$run/test-avg10.detok.hyp"
      "$ember" bleu -r "$raw_ref" -i "$run/test-avg10.detok.hyp" --lowercase --metrics bleu,chrf --json \
        > "$run/test-avg10.detok.bleu.json"
    fi
    python3 - "$run" <<'PY'
import json, os, sys
run = sys.argv[1]
for tag in ("avg10", "last"):
    if not os.path.exists(f"{run}/test-{tag}.bleu.json"):
        continue
    b = json.load(open(f"{run}/test-{tag}.bleu.json"))
    e = json.load(open(f"{run}/test-{tag}.eval.json"))
    print(f"{run} {tag}: BLEU {b['bleu']['score']:.2f} chrF {b['chrf']['score']:.2f} | test loss {e['loss']:.4f}")
if not os.path.exists(f"{run}/test-avg10.detok.bleu.json"):
    sys.exit()
d = json.load(open(f"{run}/test-avg10.detok.bleu.json"))
print(f"{run} avg10 detokenised: sacreBLEU {d['bleu']['score']:.2f} ({d['bleu']['signature']})")
PY
  done
done

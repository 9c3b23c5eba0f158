#!/usr/bin/env bash
# Evaluates the finished runs of the full-recipe Multi30k study (configs/multi30k-tiny-lc.yaml) as
# Transformer-Tiny was evaluated (Wu et al. 2021, fairseq): the average of the last 10 epoch
# checkpoints, beam 5, BLEU-4 on the lowercased tokenised test2016 with --tokenize none; also
# chrF, the test loss, and the same for the last checkpoint alone. Writes, per run directory:
#
#   test-avg10.hyp / .eval.json / .bleu.json    averaged checkpoint (checkpoints/average-last-10)
#   test-last.hyp  / .eval.json / .bleu.json    the newest checkpoint alone
#
# Runs that are not finished, or already evaluated, are skipped, so it can run after every cell.
#
#   scripts/multi30k-full-eval.sh [--ember BIN] SWEEP_DIR...
set -euo pipefail
cd "$(dirname "$0")/.."
ember=target/release/ember
if [[ ${1:-} == --ember ]]; then ember=$2; shift 2; fi
[[ $# -gt 0 ]] || { echo "usage: $0 [--ember BIN] SWEEP_DIR..." >&2; exit 2; }
ref=data/multi30k/test_2016_flickr.lc.norm.tok.de
[[ -f $ref ]] || { echo "$ref is missing: run scripts/get-data.sh" >&2; exit 1; }

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
    python3 - "$run" <<'PY'
import json, sys
run = sys.argv[1]
for tag in ("avg10", "last"):
    b = json.load(open(f"{run}/test-{tag}.bleu.json"))
    e = json.load(open(f"{run}/test-{tag}.eval.json"))
    print(f"{run} {tag}: BLEU {b['bleu']['score']:.2f} chrF {b['chrf']['score']:.2f} | test loss {e['loss']:.4f}")
PY
  done
done

#!/usr/bin/env bash
# Scores the finished runs of the Multi30k study (configs/multi30k-tiny-lc*.yaml) under the
# study's validation-only protocol (docs/results/multi30k-full/README.md, "Protocol"):
#
# 1. Three candidate models per run: the newest checkpoint (`last`) and the averages of the last
#    5 and last 10 checkpoints (`avg5`, `avg10`; `ember average`).
# 2. Each decoded once on the validation split (val, 1,014 sentences) with beam 5. Beam search
#    finishes the same hypotheses under any length penalty (the penalty only ranks them), so one
#    search per model is ranked under every penalty of the grid: GNMT's α = 0, 0.2, …, 2.0 and
#    fairseq's lenpen 1. Scored with BLEU-4, --tokenize none, like test.
# 3. The (model, penalty) with the highest validation BLEU is the run's final model; ties go to
#    the longer average, then to the penalty listed first.
# 4. That one model is decoded once on test2016 with that one penalty and scored: BLEU-4
#    (--tokenize none on the lowercased tokenised reference, the published metric), chrF, the
#    brevity penalty and length ratio, the test loss; and the output detokenised (sacremoses)
#    and scored with sacreBLEU's default 13a against the raw reference, case-insensitively.
#
# Writes, per run directory:
#   valid-{last,avg5,avg10}.eval.json   validation BLEU/chrF/BP under every penalty, and loss
#   selection.json                       the chosen model and penalty, and why
#   test.hyp / test.eval.json / test.bleu.json / test.detok.hyp / test.detok.bleu.json
#
# Runs not finished, or already scored, are skipped (a diverged run is skipped here and counted
# by the report), so it can run after every cell. sacremoses lives in a virtual environment
# outside the repository ($EMBER_MOSES_VENV, default ~/.cache/ember/moses-venv), made on first use.
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

PENALTIES=0,0.2,0.4,0.6,0.8,1.0,1.2,1.4,1.6,1.8,2.0,fairseq:1
WINDOWS=(avg10 avg5 last)   # the order ties are broken in

venv=${EMBER_MOSES_VENV:-$HOME/.cache/ember/moses-venv}
py=$venv/bin/python
if ! "$py" -c 'import sacremoses' 2>/dev/null; then
  echo "== installing sacremoses into $venv (once)" >&2
  python3 -m venv "$venv" && "$py" -m pip install --quiet sacremoses==0.1.1 \
    || { echo "cannot install sacremoses into $venv" >&2; exit 1; }
fi
raw_ref=$(mktemp); trap 'rm -f "$raw_ref"' EXIT
gzip -dc data/multi30k/test_2016_flickr.de.gz > "$raw_ref"

finished() { python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s.get("finished") and not s.get("diverged") else 1)' "$1" 2>/dev/null; }

source scripts/multi30k-checkpoint.sh

for sweep in "$@"; do
  for run in "$sweep"/runs/*/; do
    run=${run%/}
    finished "$run/summary.json" || { echo "skip (not finished or diverged): $run"; continue; }
    [[ -f $run/test.bleu.json ]] && { echo "skip (scored): $run"; continue; }
    for n in 5 10; do
      [[ -d $run/checkpoints/average-last-$n ]] || "$ember" average "$run" --last $n > /dev/null
    done
    for w in "${WINDOWS[@]}"; do
      out=$run/valid-$w.eval.json
      [[ -f $out ]] && continue
      echo "== $run: $w on validation"
      "$ember" eval "$(checkpoint "$run" "$w")" --split valid --beam 5 --tokenize none \
        --length-penalty "$PENALTIES" --json > "$out.tmp"
      mv "$out.tmp" "$out"
    done
    python3 - "$run" "${WINDOWS[@]}" > "$run/selection.json" <<'PY'
import json, sys
run, windows = sys.argv[1], sys.argv[2:]
grid, best = [], None
for w in windows:
    e = json.load(open(f"{run}/valid-{w}.eval.json"))
    for s in e["length_penalties"]:
        row = {"model": w, "length_penalty": s["length_penalty"], "bleu": s["bleu"]["score"],
               "bp": s["bleu"]["bp"], "ratio": s["bleu"]["ratio"], "chrf": s["chrf"]["score"]}
        grid.append(row)
        if best is None or row["bleu"] > best["bleu"]:
            best = row
print(json.dumps({"rule": "highest validation BLEU (beam 5, --tokenize none); ties: "
                  "the longer average, then the penalty listed first",
                  "model": best["model"], "length_penalty": best["length_penalty"],
                  "valid_bleu": best["bleu"], "grid": grid}, indent=1))
PY
    read -r model penalty < <(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["model"], s["length_penalty"])' "$run/selection.json")
    echo "== $run: final model $model, length penalty $penalty (validation); scoring test once"
    "$ember" eval "$(checkpoint "$run" "$model")" --split test --beam 5 --tokenize none \
      --length-penalty "$penalty" --output "$run/test.hyp" --json > "$run/test.eval.json"
    "$ember" bleu -r "$ref" -i "$run/test.hyp" --tokenize none --metrics bleu,chrf --json > "$run/test.bleu.json"
    "$py" -c 'import sys; from sacremoses import MosesDetokenizer as D; d = D(lang="de")
for line in open(sys.argv[1], encoding="utf-8"): print(d.detokenize(line.split()))' \
      "$run/test.hyp" > "$run/test.detok.hyp"
    "$ember" bleu -r "$raw_ref" -i "$run/test.detok.hyp" --lowercase --metrics bleu,chrf --json \
      > "$run/test.detok.bleu.json"
    python3 - "$run" <<'PY'
import json, sys
run = sys.argv[1]
sel = json.load(open(f"{run}/selection.json"))
b = json.load(open(f"{run}/test.bleu.json"))["bleu"]
e = json.load(open(f"{run}/test.eval.json"))
print(f"{run}: {sel['model']} {sel['length_penalty']} (valid BLEU {sel['valid_bleu']:.2f}) | "
      f"test BLEU {b['score']:.2f} BP {b['bp']:.3f} ratio {b['ratio']:.3f} | test loss {e['loss']:.4f}")
PY
  done
done

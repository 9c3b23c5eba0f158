#!/usr/bin/env bash
# The length-generalisation study in one command: character LMs trained at block 64 on Tiny
# Shakespeare, evaluated at longer contexts, per QK-norm variant, with log-n scaling off and on.
#
#   scripts/length-study.sh [--out DIR] [--contexts 64,128,256,512,1024] [--seeds N]
#                           [--variants none,layernorm,rmsnorm,l2] [--jobs N] [--steps N]
#                           [--no-build]
#
# 1. `ember ablate configs/shakespeare-char.yaml` trains variants × seeds at lr 1e-3 (the
#    config's own 2,000-step recipe) into DIR/sweep. Log-n scaling is a no-op at the training
#    length, so one trained model serves both log-n arms.
# 2. `ember eval RUN --context N --logn off|on --json` for every run, context and arm, into
#    DIR/evals/<run>/context-<N>-logn-<off|on>.json.
# 3. BLEU by source length of the released Multi30k runs (docs/results/multi30k-tiny: their
#    test-set hypotheses against the test references): `ember bleu --source`, into
#    DIR/multi30k/<run>.json (skipped when the data or the results are not there).
# 4. `ember length-report DIR` writes DIR/report.md, report.json and plots/.
# Every step skips what is already there, so an interrupted study resumes where it stopped.
# Default DIR: runs/length-study. Needs the data: scripts/get-data.sh. Not part of CI.
set -euo pipefail
die() { echo "length-study: error: $*" >&2; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit "${1:-0}"; }

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
out="$ROOT/runs/length-study" contexts=64,128,256,512,1024 seeds=3
variants=none,layernorm,rmsnorm,l2 jobs=2 steps=2000 build=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage 0 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --contexts) contexts="${2:?--contexts needs a list}"; shift 2 ;;
    --seeds) seeds="${2:?--seeds needs a number}"; shift 2 ;;
    --variants) variants="${2:?--variants needs a list}"; shift 2 ;;
    --jobs) jobs="${2:?--jobs needs a number}"; shift 2 ;;
    --steps) steps="${2:?--steps needs a number}"; shift 2 ;;
    --no-build) build=0; shift ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[[ "$contexts" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--contexts must be numbers separated by commas, got $contexts"
[[ -f "$ROOT/data/tinyshakespeare/input.txt" ]] || die "data/tinyshakespeare/input.txt is missing: run scripts/get-data.sh"

cd "$ROOT"
ember="${CARGO_TARGET_DIR:-target}/release/ember"
if [[ $build == 1 ]]; then
  cargo build --release --quiet || die "cargo build failed"
fi
[[ -x "$ember" ]] || die "$ember is missing (build it, or drop --no-build)"
mkdir -p "$out"

echo "== training: $variants x $seeds seeds, $steps steps at block 64 ($out/sweep)" >&2
"$ember" ablate configs/shakespeare-char.yaml --out "$out/sweep" --variants "$variants" \
  --seeds "$seeds" --lrs 1e-3 --jobs "$jobs" \
  --set "train.steps=$steps" --set eval.every=500 --set "checkpoint.every=$steps"

echo "== evaluating at contexts $contexts, log-n off and on" >&2
IFS=, read -r -a ns <<< "$contexts"
for run in "$out"/sweep/runs/*/; do
  name="$(basename "$run")"
  mkdir -p "$out/evals/$name"
  for n in "${ns[@]}"; do
    for logn in off on; do
      file="$out/evals/$name/context-$n-logn-$logn.json"
      [[ -s "$file" ]] && continue
      "$ember" eval "$run" --context "$n" --logn "$logn" --json > "$file.tmp" \
        || die "ember eval $run --context $n --logn $logn failed"
      mv "$file.tmp" "$file"
      echo "   $name context $n log-n $logn: loss $(grep -m1 '^  "loss":' "$file" | tr -dc '0-9.')" >&2
    done
  done
done

m30k=docs/results/multi30k-tiny/runs
if [[ -d "$m30k" && -f data/multi30k/test_2016_flickr.en.gz ]]; then
  echo "== BLEU by source length of the released Multi30k runs ($m30k)" >&2
  mkdir -p "$out/multi30k"
  for hyp in "$m30k"/*/test-beam5.hyp; do
    name="$(basename "$(dirname "$hyp")")"
    "$ember" bleu -r <(zcat data/multi30k/test_2016_flickr.de.gz) -i "$hyp" \
      --source <(zcat data/multi30k/test_2016_flickr.en.gz) --json > "$out/multi30k/$name.json" \
      || die "ember bleu --source failed for $hyp"
  done
fi

"$ember" length-report "$out"

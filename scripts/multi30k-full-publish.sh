#!/usr/bin/env bash
# Publishes the full-recipe Multi30k study (issue #37) into docs/results/multi30k-full, after
# scripts/multi30k-full-eval.sh has scored the finished runs:
#
#   runs/<run>/   each finished, evaluated run's config, metrics, summary, test hypotheses and
#                 scores (no checkpoints or token caches); a diverged run's config, metrics, summary
#   report.md, report.json, plots/
#                 `ember report` over those runs: training curves (loss, max attention logit,
#                 validation BLEU vs update), validation figures, LR sensitivity when the sweep
#                 has several learning rates
#   tables.md     scripts/multi30k-full-report.py: the test-set tables (checkpoint average, beam 5)
#
# The sweep's grid.json and status.json are copied too (commands, hardware, wall times).
#
#   scripts/multi30k-full-publish.sh [--ember BIN] SWEEP_DIR [DOCS_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
ember=target/release/ember
if [[ ${1:-} == --ember ]]; then ember=$(realpath "$2"); shift 2; fi
[[ $# -ge 1 ]] || { echo "usage: $0 [--ember BIN] SWEEP_DIR [DOCS_DIR]" >&2; exit 2; }
sweep=${1%/}
docs=${2:-docs/results/multi30k-full}
mkdir -p "$docs/runs"
# Whether a run's summary.json sets KEY ("finished", "diverged"). Finished runs only: a run in
# flight would draw half a curve into the seeds' mean (ember report). A diverged run is a result
# too (the LR sweep counts it): its record is published, without test files.
summary_says() { python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[2])).get(sys.argv[1]) else 1)' "$1" "$2/summary.json" 2>/dev/null; }
for run in "$sweep"/runs/*/; do
  run=${run%/}
  record=("$run"/config.yaml "$run"/metrics.jsonl "$run"/summary.json)
  if [[ -f $run/test-avg10.bleu.json ]] && summary_says finished "$run"; then
    record+=("$run"/test-*.hyp "$run"/test-*.json)
  elif ! summary_says diverged "$run"; then
    continue
  fi
  mkdir -p "$docs/runs/$(basename "$run")"
  cp "${record[@]}" "$docs/runs/$(basename "$run")"/
done
cp "$sweep"/grid.json "$sweep"/status.json "$docs"/

# `ember report` writes beside the runs it reads: give it a copy without checkpoints, at the
# sweep's own relative path, so that the commands it prints are the ones that ran.
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/$sweep/runs"
cp "$sweep"/grid.json "$sweep"/status.json "$work/$sweep"/
for run in "$sweep"/runs/*/; do
  run=${run%/}
  summary_says finished "$run" || summary_says diverged "$run" || continue
  mkdir -p "$work/$run"
  for f in config.yaml metrics.jsonl summary.json ablate-stdout.log ablate-stderr.log; do
    [[ -f $run/$f ]] && cp "$run/$f" "$work/$run/"
  done
done
(cd "$work" && "$ember" report "$sweep")
rm -rf "$docs/plots"
cp -r "$work/$sweep/plots" "$docs/plots"
cp "$work/$sweep/report.md" "$work/$sweep/report.json" "$docs"/
python3 scripts/multi30k-full-report.py "$sweep" > "$docs/tables.md"
echo "published $(ls "$docs/runs" | wc -l) runs into $docs"

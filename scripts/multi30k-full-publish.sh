#!/usr/bin/env bash
# Publishes the Multi30k study (issues #37, #52) into docs/results/multi30k-full, after
# scripts/multi30k-full-eval.sh has scored the finished runs under the validation-only protocol:
#
#   runs/<run>/   each finished, scored run's config, metrics, summary, validation scores under
#                 every candidate model and length penalty, the selection, the test hypotheses and
#                 scores (no checkpoints or token caches); a diverged run's config, metrics, summary
#   report.md, report.json, plots/
#                 `ember report` over those runs: training curves (loss, max attention logit,
#                 validation BLEU vs update), validation figures, LR sensitivity when the sweep
#                 has several learning rates
#   tables.md     scripts/multi30k-full-report.py: the test-set tables (needs scipy: installed
#                 into the same virtual environment as the eval script's sacremoses)
#
# A run published before (its metrics.jsonl committed here) and trained again — the earlier
# runs' checkpoints were lost with a machine — must log the same training and validation
# losses, or this script stops: training is bit-reproducible, so a difference is a bug.
#
# The sweep's grid.json and status.json are copied too (commands, hardware, wall times).
#
# --partial, while a grid is partly retrained: the runs' records (checked as above) and the
# protocol's tables.md over the runs scored so far; the sweep's files, the report and the plots
# of the earlier complete grid stay as they are until the grid is whole again.
#
#   scripts/multi30k-full-publish.sh [--ember BIN] [--partial] SWEEP_DIR [DOCS_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
ember=target/release/ember
partial=0
while [[ ${1:-} == --* ]]; do
  case $1 in
    --ember) ember=$(realpath "$2"); shift 2 ;;
    --partial) partial=1; shift ;;
    *) echo "unknown option $1; usage: $0 [--ember BIN] [--partial] SWEEP_DIR [DOCS_DIR]" >&2; exit 2 ;;
  esac
done
[[ $# -ge 1 ]] || { echo "usage: $0 [--ember BIN] [--partial] SWEEP_DIR [DOCS_DIR]" >&2; exit 2; }
sweep=${1%/}
docs=${2:-docs/results/multi30k-full}
mkdir -p "$docs/runs"
# Whether a run's summary.json sets KEY ("finished", "diverged"). Finished runs only: a run in
# flight would draw half a curve into the seeds' mean (ember report). A diverged run is a result
# too (the LR sweep counts it): its record is published, without test files.
summary_says() { python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[2])).get(sys.argv[1]) else 1)' "$1" "$2/summary.json" 2>/dev/null; }
venv=${EMBER_MOSES_VENV:-$HOME/.cache/ember/moses-venv}
if ! "$venv/bin/python" -c 'import scipy' 2>/dev/null; then
  echo "== installing scipy into $venv (once)" >&2
  { [[ -x $venv/bin/python ]] || python3 -m venv "$venv"; } && "$venv/bin/python" -m pip install --quiet scipy==1.14.1 \
    || { echo "cannot install scipy into $venv" >&2; exit 1; }
fi
# The losses a run logged, without the timings (which differ between machines and sessions).
# The logged gradient norm is a window's mean whose sum a resumed run groups differently (the
# device's sums are settled at checkpoints), so it may differ in its last bits: compared to 1e-12.
same_losses() {
  python3 - "$1" "$2" <<'PY'
import json, math, sys
def records(path):
    return [json.loads(line) for line in open(path)]
a, b = records(sys.argv[1]), records(sys.argv[2])
def differ(x, y):
    if {k: x.get(k) for k in ("kind", "step", "loss", "nll")} != {k: y.get(k) for k in ("kind", "step", "loss", "nll")}:
        return True
    g, h = x.get("grad_norm"), y.get("grad_norm")
    return (g is None) != (h is None) or (g is not None and not math.isclose(g, h, rel_tol=1e-12))
bad = next((i for i in range(min(len(a), len(b))) if differ(a[i], b[i])), None)
if bad is not None or len(a) != len(b):
    where = f"record {bad + 1}: {a[bad]} vs {b[bad]}" if bad is not None else f"{len(a)} vs {len(b)} records"
    sys.exit(f"{sys.argv[2]} does not reproduce the published {sys.argv[1]} ({where})")
PY
}
for run in "$sweep"/runs/*/; do
  run=${run%/}
  published=$docs/runs/$(basename "$run")/metrics.jsonl
  if summary_says finished "$run" && git ls-files --error-unmatch "$published" > /dev/null 2>&1; then
    same_losses <(git show "HEAD:$published") "$run/metrics.jsonl"
  fi
  record=("$run"/config.yaml "$run"/metrics.jsonl "$run"/summary.json)
  if [[ -f $run/test.bleu.json ]] && summary_says finished "$run"; then
    record+=("$run"/valid-*.eval.json "$run"/selection.json "$run"/test.*)
  elif ! summary_says diverged "$run"; then
    continue
  fi
  mkdir -p "$docs/runs/$(basename "$run")"
  cp "${record[@]}" "$docs/runs/$(basename "$run")"/
done
if (( partial )); then
  "$venv/bin/python" scripts/multi30k-full-report.py "$sweep" > "$docs/tables.md"
  echo "published the records of $(ls "$docs/runs" | wc -l) runs and tables.md into $docs (report and plots unchanged)"
  exit 0
fi
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
"$venv/bin/python" scripts/multi30k-full-report.py "$sweep" > "$docs/tables.md"
echo "published $(ls "$docs/runs" | wc -l) runs into $docs"

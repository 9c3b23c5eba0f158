#!/usr/bin/env bash
# Releases one variant of the Multi30k study (issue #52) as the protocol says
# (docs/results/multi30k-full/README.md, "Protocol"): once the variant's grid is complete, its
# validation-median seed's final model — the (model, length penalty) that seed's own validation
# chose (selection.json, written by scripts/multi30k-full-eval.sh) — packaged as a model folder,
# never the test-best. With an even number of seeds the lower of the two middle ones.
#
# Then checks the folder against the run it came from: `ember translate FOLDER` (run from an
# empty directory, with no options, so with the penalty the folder carries) must write the run's
# test.hyp byte for byte, and `ember eval FOLDER --split test` must give its test loss. Any
# earlier folder of the variant in DOCS_DIR is removed only after that check passes.
#
#   scripts/multi30k-full-release.sh [--ember BIN] --seeds N SWEEP_DIR VARIANT [DOCS_DIR]
#
# --seeds N: the grid's seeds for this variant; fewer scored runs than N is refused (the grid is
# not complete, and a median of part of it would be a choice made early).
set -euo pipefail
cd "$(dirname "$0")/.."
ember=target/release/ember
seeds=
usage="usage: $0 [--ember BIN] --seeds N SWEEP_DIR VARIANT [DOCS_DIR]"
while [[ ${1:-} == --* ]]; do
  case $1 in
    --ember) ember=$(realpath "$2"); shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    *) echo "unknown option $1; $usage" >&2; exit 2 ;;
  esac
done
[[ $# -ge 2 && $seeds =~ ^[1-9][0-9]*$ ]] || { echo "$usage" >&2; exit 2; }
sweep=${1%/}
variant=$2
docs=${3:-docs/results/multi30k-full}
[[ -d $sweep/runs ]] || { echo "$sweep/runs is not a directory: give the sweep's output directory (ember ablate --out)" >&2; exit 1; }
[[ -d $docs ]] || { echo "$docs is not a directory" >&2; exit 1; }
src=data/multi30k/test_2016_flickr.lc.norm.tok.en
[[ -f $src ]] || { echo "$src is missing: run scripts/get-data.sh" >&2; exit 1; }

# The scored runs of the variant, ascending by validation BLEU (ties by seed), as
# "valid_bleu seed run model penalty" lines; the variant's runs must share one learning rate.
mapfile -t rows < <(python3 - "$sweep" "$variant" <<'PY'
import json, re, sys
from pathlib import Path
sweep, variant = Path(sys.argv[1]), sys.argv[2]
rows, lrs = [], set()
for run in sorted((sweep / "runs").iterdir()):
    m = re.fullmatch(rf"{re.escape(variant)}-lr(.+)-seed(\d+)", run.name)
    if not m or not (run / "selection.json").is_file() or not (run / "test.hyp").is_file():
        continue
    s = json.load(open(run / "selection.json"))
    lrs.add(m[1])
    rows.append((s["valid_bleu"], int(m[2]), str(run), s["model"], s["length_penalty"]))
if len(lrs) > 1:
    sys.exit(f"{variant} has runs at several learning rates ({', '.join(sorted(lrs))}): "
             "release from a sweep with one rate per variant")
for r in sorted(rows, key=lambda r: (r[0], r[1])):
    print(*r)
PY
)
(( ${#rows[@]} >= seeds )) || {
  echo "$variant: ${#rows[@]} of $seeds seeds scored in $sweep; release when its grid is complete" >&2
  exit 1
}
(( ${#rows[@]} == seeds )) || {
  echo "$variant: ${#rows[@]} seeds scored in $sweep, not $seeds: say how many the grid has" >&2
  exit 1
}
read -r valid seed run model penalty <<< "${rows[$(( (seeds - 1) / 2 ))]}"
source scripts/multi30k-checkpoint.sh
checkpoint=$(checkpoint "$run" "$model") || { echo "in $run/selection.json" >&2; exit 1; }
[[ -d $checkpoint ]] || { echo "$checkpoint is missing: its checkpoints are needed to release it" >&2; exit 1; }
listed=()
for row in "${rows[@]}"; do read -r v s _ <<< "$row"; listed+=("seed $s $(printf '%.2f' "$v")"); done
echo "$variant: validation BLEU by seed, ascending: $(IFS=';'; echo "${listed[*]}" | sed 's/;/; /g')"
echo "$variant: the median is seed $seed ($model, $penalty, validation BLEU $(printf '%.2f' "$valid"))"

name=$variant-seed$seed-$model
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
"$ember" package "$checkpoint" "$work/$name" --length-penalty "$penalty" > /dev/null
(cd "$work" && "$ember" translate "$name") < "$src" > "$work/test.hyp"
cmp -s "$work/test.hyp" "$run/test.hyp" || {
  echo "$name: translate writes other test output than $run/test.hyp; nothing released" >&2
  exit 1
}
loss=$("$ember" eval "$work/$name" --split test --beam 5 --json \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
python3 - "$loss" "$run/test.eval.json" <<'PY' || exit 1
import json, math, sys
want = json.load(open(sys.argv[2]))["loss"]
if not math.isclose(float(sys.argv[1]), want, rel_tol=0, abs_tol=1e-12):
    sys.exit(f"the folder's test loss {sys.argv[1]} is not the run's {want}; nothing released")
PY
for old in "$docs/$variant"-seed*; do
  [[ -e $old && $old != "$docs/$name" ]] && rm -rf "$old" && echo "removed $old"
done
rm -rf "${docs:?}/$name"
mv "$work/$name" "$docs/$name"
python3 - "$docs/$name" "$run" "$loss" <<'PY'
import json, sys
folder, run, loss = sys.argv[1:]
b = json.load(open(f"{run}/test.bleu.json"))
print(f"released {folder}: test BLEU {b['bleu']['score']:.2f} (BP {b['bleu']['bp']:.3f}, "
      f"ratio {b['bleu']['ratio']:.3f}), chrF {b['chrf']['score']:.2f}, test loss {float(loss):.4f}; "
      "translate reproduces the run's test.hyp byte for byte")
PY

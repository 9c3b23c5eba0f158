#!/usr/bin/env bash
# nanoGPT parity: karpathy/nanoGPT's own train.py and Ember, trained side by side on Tiny
# Shakespeare (characters) at nanoGPT's CPU shape, same steps, learning rates and seed labels;
# writes both validation curves.
#
#   scripts/nanogpt-parity.sh [--seeds 1,2,3] [--lrs 1e-3[,3e-3...]] [--steps 1000]
#       [--eval-every 250] [--eval-iters 100] [--threads 1] [--nanogpt DIR] [--out DIR]
#       [--ember-config FILE] [--set KEY=VALUE]... [--nanogpt-set KEY=VALUE]...
#       [--nanogpt-positions learned|rope] [--label NAME] [--skip-nanogpt] [--skip-ember] [--no-build]
#
# nanoGPT: `train.py config/train_shakespeare_char.py` with its README's CPU overrides (block 64,
# batch 12, 4 layers, 4 heads, d=128, dropout 0, float32, no compile), max_iters and
# lr_decay_iters = --steps, min_lr = lr/10, evaluating every --eval-every steps on --eval-iters
# random batches per split (its estimator; default 100). Seeds: train.py always seeds 1337; seed
# S runs it through scripts/nanogpt_seeded.py, which makes that 1337 + S - 1 (seed 1 = nanoGPT as
# published). --nanogpt-set KEY=VALUE adds --KEY=VALUE (e.g. dropout=0.2) to every nanoGPT run;
# --nanogpt-positions rope swaps its learned position table for rotary embeddings applied by the
# same wrapper (see its docstring; nanoGPT's files stay untouched).
#
# Ember: `ember train --ember-config` (default configs/shakespeare-char-nanogpt.yaml, the same
# recipe in Ember's terms) with train.steps, train.seed, train.lr, train.min_lr = lr/10,
# eval.every and train.threads set from the flags, plus every --set. Its evaluation is the
# config's (the parity config: the whole validation split, the mean nanoGPT's random batches
# estimate). The same seed label does not give the same weights or batches on both sides (two
# different generators): compare the spread across seeds, not seed against seed.
#
# Layout of --out (default runs/nanogpt-parity): <side>/side.json (implementation, command,
# commit) and <side>/lr<LR>-seed<S>/ per run (nanoGPT: train.log; Ember: its run directory),
# sides named nanogpt and ember, or --label (one side per invocation when given; add variants
# to the same --out with --skip-nanogpt/--skip-ember). Finished runs are kept, unfinished ones
# rerun. Then scripts/parity_curves.py writes curves.csv, curves.json, table.md and
# val_loss.png over every side in --out and prints the table.
#
# nanoGPT comes from --nanogpt DIR (default $NANOGPT_DIR or ~/.cache/ember/nanoGPT, cloned at the
# pinned commit from $NANOGPT_REPO when missing, see scripts/nanogpt.sh; its commit is printed
# when DIR is a git checkout). Needs scripts/get-data.sh's data and the torch venv
# (scripts/torch-venv.sh; matplotlib in it for the plot). CPU only; not part of CI.
set -euo pipefail

die() { echo "nanogpt-parity: error: $*" >&2; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit "${1:-0}"; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

seeds=1,2,3 lrs=1e-3 steps=1000 eval_every=250 eval_iters=100 threads=1 nanogpt="" out=runs/nanogpt-parity
ember_config=configs/shakespeare-char-nanogpt.yaml label="" run_nanogpt=1 run_ember=1 build=1
ember_sets=() nanogpt_sets=() nanogpt_positions=learned
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage 0 ;;
    --seeds) seeds="${2:?--seeds needs a list like 1,2,3}"; shift 2 ;;
    --lrs) lrs="${2:?--lrs needs a list like 1e-3,3e-3}"; shift 2 ;;
    --steps) steps="${2:?--steps needs a number}"; shift 2 ;;
    --eval-every) eval_every="${2:?--eval-every needs a number}"; shift 2 ;;
    --eval-iters) eval_iters="${2:?--eval-iters needs a number}"; shift 2 ;;
    --threads) threads="${2:?--threads needs a number}"; shift 2 ;;
    --nanogpt) nanogpt="${2:?--nanogpt needs a directory}"; shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --ember-config) ember_config="${2:?--ember-config needs a file}"; shift 2 ;;
    --set) ember_sets+=(--set "${2:?--set needs KEY=VALUE}"); shift 2 ;;
    --nanogpt-set) nanogpt_sets+=("--${2:?--nanogpt-set needs KEY=VALUE}"); shift 2 ;;
    --nanogpt-positions) nanogpt_positions="${2:?--nanogpt-positions needs learned or rope}"; shift 2 ;;
    --label) label="${2:?--label needs a name}"; shift 2 ;;
    --skip-nanogpt) run_nanogpt=0; shift ;;
    --skip-ember) run_ember=0; shift ;;
    --no-build) build=0; shift ;;
    *) echo "nanogpt-parity: unknown argument $1" >&2; usage 2 ;;
  esac
done
for v in steps eval_every eval_iters threads; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "--${v//_/-} must be a positive integer, got '${!v}'"
done
[[ "$seeds" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--seeds must be positive integers separated by commas, got '$seeds'"
[[ "$lrs" =~ ^[0-9.eE+-]+(,[0-9.eE+-]+)*$ ]] || die "--lrs must be numbers separated by commas, got '$lrs'"
(( steps % eval_every == 0 )) || die "--steps ($steps) must be a multiple of --eval-every ($eval_every), so both sides evaluate at the last step"
(( run_nanogpt + run_ember > 0 )) || die "--skip-nanogpt and --skip-ember together leave nothing to run"
if [[ -n "$label" ]] && (( run_nanogpt + run_ember > 1 )); then
  die "--label names one side: add --skip-nanogpt or --skip-ember"
fi
[[ "$label" =~ ^[A-Za-z0-9._+-]*$ ]] || die "--label may hold letters, digits and . _ + - only, got '$label'"
[[ "$nanogpt_positions" =~ ^(learned|rope)$ ]] || die "--nanogpt-positions must be learned or rope, got '$nanogpt_positions'"
[[ -f "$ember_config" ]] || die "$ember_config not found"
IFS=, read -r -a seed_list <<< "$seeds"
IFS=, read -r -a lr_list <<< "$lrs"

source scripts/torch-venv.sh   # sets $py
source scripts/nanogpt.sh      # nanogpt_prepare, $NANOGPT_DEFAULT_DIR, $NANOGPT_COMMIT
[[ -f data/tinyshakespeare/input.txt ]] || die "data/tinyshakespeare/input.txt not found; run scripts/get-data.sh"
mkdir -p "$out" || die "cannot create $out"
out="$(cd "$out" && pwd)"

min_lr_of() { "$py" -c 'import sys; print(repr(float(sys.argv[1]) / 10))' "$1"; }

# Writes <side>/side.json: what produced the runs in it. Arguments after the first two are the
# command line (one argument per JSON list element).
write_side() { # dir impl extra-json command...
  local dir="$1" impl="$2" extra="$3"
  shift 3
  mkdir -p "$dir"
  "$py" - "$dir/side.json" "$impl" "$extra" "$@" <<'EOF'
import json, sys
path, impl, extra, *command = sys.argv[1:]
json.dump(dict(impl=impl, command=command, **json.loads(extra)), open(path, "w"), indent=1)
EOF
}

# --- nanoGPT ----------------------------------------------------------------------------------
nanogpt_run() { # side-dir lr seed
  local run="$1/lr$2-seed$3"
  if [[ -f "$run/train.log" ]] && grep -q "^step $steps: " "$run/train.log"; then
    echo "== $run: done already" >&2
    return
  fi
  rm -rf "$run" && mkdir -p "$run"
  echo "== nanoGPT lr $2 seed $3 -> $run" >&2
  # out_dir only receives ckpt.pt, which nobody reads: it goes away with the run.
  (cd "$nanogpt" && OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads" "$py" "$ROOT/scripts/nanogpt_seeded.py" --positions "$nanogpt_positions" "$3" \
      train.py "${nanogpt_args[@]}" --learning_rate="$2" --min_lr="$(min_lr_of "$2")" --out_dir="$run/out" \
      >"$run/train.log" 2>&1) || { tail -20 "$run/train.log" >&2; die "nanoGPT's train.py failed (log: $run/train.log)"; }
  rm -rf "$run/out"
}

if (( run_nanogpt )); then
  nanogpt="${nanogpt:-$NANOGPT_DEFAULT_DIR}"
  nanogpt_prepare "$nanogpt"
  nanogpt="$(cd "$nanogpt" && pwd)"
  # config/train_shakespeare_char.py, then the CPU shape of nanoGPT's README, then parity's own.
  nanogpt_args=(config/train_shakespeare_char.py --device=cpu --compile=False --dtype=float32
    --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --dropout=0.0
    --max_iters="$steps" --lr_decay_iters="$steps" --warmup_iters=100 --beta2=0.99 --weight_decay=0.1
    --grad_clip=1.0 --eval_interval="$eval_every" --eval_iters="$eval_iters" --log_interval=50
    --always_save_checkpoint=False "${nanogpt_sets[@]}")
  side="$out/${label:-nanogpt}"
  commit="$(git -C "$nanogpt" rev-parse --verify --quiet HEAD 2>/dev/null || echo "unknown (pinned: $NANOGPT_COMMIT)")"
  write_side "$side" nanogpt "{\"nanogpt_dir\": \"$nanogpt\", \"nanogpt_commit\": \"$commit\"}" \
    "$py" scripts/nanogpt_seeded.py --positions "$nanogpt_positions" SEED train.py "${nanogpt_args[@]}" --learning_rate=LR --min_lr=LR/10
  for lr in "${lr_list[@]}"; do
    for seed in "${seed_list[@]}"; do nanogpt_run "$side" "$lr" "$seed"; done
  done
fi

# --- Ember ------------------------------------------------------------------------------------
ember_run() { # side-dir lr seed
  local run="$1/lr$2-seed$3"
  if [[ -f "$run/summary.json" ]]; then
    echo "== $run: done already" >&2
    return
  fi
  rm -rf "$run"
  echo "== Ember lr $2 seed $3 -> $run" >&2
  "$ember" train "$ember_config" "${ember_args[@]}" --set train.lr="$2" --set train.min_lr="$(min_lr_of "$2")" \
    --set train.seed="$3" --run-dir "$run" --quiet >"$run.log" 2>&1 \
    || { tail -20 "$run.log" >&2; die "ember train failed (log: $run.log)"; }
  mv "$run.log" "$run/train.log"
  rm -f "$run/token-cache.bin"   # 4 MB, rebuilt from the text when needed
}

if (( run_ember )); then
  source scripts/ember-release.sh   # ember_release_binary
  ember_release_binary "$build"
  ember_args=(--set train.steps="$steps" --set eval.every="$eval_every" --set checkpoint.every="$steps"
    --set train.threads="$threads" "${ember_sets[@]}")
  side="$out/${label:-ember}"
  write_side "$side" ember "{\"ember_commit\": \"$(git rev-parse HEAD)$(git diff --quiet HEAD -- crates src Cargo.lock || echo '+dirty')\", \"config\": \"$ember_config\"}" \
    "$ember" train "$ember_config" "${ember_args[@]}" --set train.lr=LR --set train.min_lr=LR/10 --set train.seed=SEED
  for lr in "${lr_list[@]}"; do
    for seed in "${seed_list[@]}"; do ember_run "$side" "$lr" "$seed"; done
  done
fi

"$py" scripts/parity_curves.py "$out"

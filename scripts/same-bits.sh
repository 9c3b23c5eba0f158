#!/usr/bin/env bash
# Do two Ember binaries train the same bits? For refactors that must not change behaviour.
#
#   scripts/same-bits.sh BINARY OUT_DIR [--set KEY=VALUE ...]  # train the reference runs, print their hashes
#   scripts/same-bits.sh --compare DIR_A DIR_B                 # same checkpoint files in both?
#
# `--set` overrides go to every run: `--set train.precision=bf16` compares bf16's bits (with
# EMBER_CPU_BF16=emulate on a CPU without AVX512_BF16).
#
# The runs: the quickstart config for 40 steps (checkpoint at 20 and 40) at each QK-norm variant
# (none, layernorm, rmsnorm, l2), and shakespeare-char for 40 steps (needs scripts/get-data.sh).
# Every file under each run's checkpoints/ is hashed (weights, optimizer moments, RNG and data
# position), and tokenizer.json beside them; state.json is hashed without its wall time
# (`elapsed_secs`, `log_window.secs`) and without the record of the vector units that computed
# the steps (`vector_units`, which binaries before it do not write; a unit that changed the
# numbers shows in every other file), and metrics are left out (they hold wall times too).
set -euo pipefail
die() { echo "same-bits: error: $*" >&2; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit "${1:-0}"; }

hashes() { # dir -> sorted "sha256  relative path" lines
  (cd "$1" && find . \( -path '*/checkpoints/*' -o -name tokenizer.json \) -type f -print | sort \
    | while read -r f; do
        if [[ "$(basename "$f")" == state.json ]]; then
          python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d.pop("elapsed_secs"); d.pop("vector_units", None); d.get("log_window", {}).pop("secs", None); print(json.dumps(d, sort_keys=True))' "$f" \
            | sha256sum | sed "s|-\$|$f|"
        else
          sha256sum "$f"
        fi
      done)
}

[[ $# -ge 1 ]] || usage 2
case "$1" in
  -h|--help) usage 0 ;;
  --compare)
    [[ $# -eq 3 ]] || usage 2
    for dir in "$2" "$3"; do
      [[ -d "$dir" ]] || die "$dir is not a directory"
      [[ -n "$(hashes "$dir")" ]] || die "$dir holds no checkpoint files (no run finished there?)"
    done
    if diff <(hashes "$2") <(hashes "$3"); then
      echo "same-bits: identical: $(hashes "$2" | wc -l) files"
    else
      die "the checkpoint files differ (above: < $2, > $3)"
    fi
    ;;
  *)
    [[ $# -ge 2 ]] || usage 2
    ember="$1" out="$2"
    shift 2
    overrides=()
    while [[ $# -gt 0 ]]; do
      [[ "$1" == --set && $# -ge 2 ]] || die "expected --set KEY=VALUE, got: $*"
      overrides+=(--set "$2")
      shift 2
    done
    [[ -x "$ember" ]] || die "$ember is not an executable"
    [[ ! -e "$out" ]] || die "$out exists; give a new directory"
    [[ -f data/tinyshakespeare/input.txt ]] || die "data/tinyshakespeare missing: run scripts/get-data.sh"
    mkdir -p "$out"
    for variant in none layernorm rmsnorm l2; do
      "$ember" train configs/quickstart.yaml --quiet --run-dir "$out/quickstart-$variant" \
        --set model.qk_norm=$variant --set train.steps=40 --set train.warmup_steps=10 \
        --set eval.every=40 --set checkpoint.every=20 --set train.threads=1 "${overrides[@]}" >/dev/null
    done
    "$ember" train configs/shakespeare-char.yaml --quiet --run-dir "$out/shakespeare-char" \
      --set train.steps=40 --set train.warmup_steps=10 --set eval.every=40 --set checkpoint.every=20 \
      --set train.threads=1 "${overrides[@]}" >/dev/null
    hashes "$out"
    ;;
esac

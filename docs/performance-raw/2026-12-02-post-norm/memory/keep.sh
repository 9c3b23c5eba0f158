#!/usr/bin/env bash
# Heap peak and peak RSS of multi30k-tiny-wu (and Transformer-base's shape) with one build,
# train.activations keep, in each precision named: keep.sh BIN LABEL PRECISION...
# 2026-12-03: `keep.sh /work/bin/ember-head a9c9c15 f32 bf16 > head.jsonl` and
# `keep.sh /work/bin/ember-post3 17e6d26 bf16 > bf16-no-copy.jsonl` (bf16 emulated).
set -euo pipefail
bin=$1 label=$2; shift 2
cd "$(dirname "$0")/../../../.."
BASE="--set model.d_model=512 --set model.n_heads=8 --set model.d_ff=2048 --set model.n_encoder_layers=6 --set model.n_decoder_layers=6"
for shape in tiny base; do
  extra=""; [[ $shape == base ]] && extra=$BASE
  for p in "$@"; do
    out=$(EMBER_CPU_BF16=emulate "$bin" bench configs/multi30k-tiny-wu.yaml --steps 2 --warmup 1 --json \
      --set train.threads=2 --set train.precision=$p $extra 2>/dev/null | python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)))")
    echo "{\"shape\":\"$shape\",\"precision\":\"$p\",\"binary\":\"$label\",\"activations\":\"keep\",\"bench\":$out}"
  done
done

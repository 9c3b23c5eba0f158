#!/usr/bin/env bash
# Heap peak and peak RSS of multi30k-tiny-wu (and Transformer-base's shape) at the build of 17e6d26
# (2026-12-03: a bf16 post-norm branch keeps no rounded copy of x; the same bits), bf16, train.activations keep.
cd /work/main
BASE="--set model.d_model=512 --set model.n_heads=8 --set model.d_ff=2048 --set model.n_encoder_layers=6 --set model.n_decoder_layers=6"
for shape in tiny base; do
  extra=""; [[ $shape == base ]] && extra=$BASE
  for p in bf16; do
    out=$(EMBER_CPU_BF16=emulate /work/bin/ember-post3 bench configs/multi30k-tiny-wu.yaml --steps 2 --warmup 1 --json \
      --set train.threads=2 --set train.precision=$p $extra 2>/dev/null | python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)))")
    echo "{\"shape\":\"$shape\",\"precision\":\"$p\",\"binary\":\"17e6d26\",\"activations\":\"keep\",\"bench\":$out}"
  done
done

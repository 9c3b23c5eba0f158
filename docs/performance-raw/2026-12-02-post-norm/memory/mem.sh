#!/usr/bin/env bash
# Heap peak and peak RSS of multi30k-tiny-wu (and Transformer-base's shape) per build, precision and train.activations.
cd /work/main
BASE="--set model.d_model=512 --set model.n_heads=8 --set model.d_ff=2048 --set model.n_encoder_layers=6 --set model.n_decoder_layers=6"
for shape in tiny base; do
  extra=""; [[ $shape == base ]] && extra=$BASE
  for p in f32 bf16; do
    for run in "reread keep" "post1 keep" "post1 recompute_attention" "post1 recompute"; do
      set -- $run
      out=$(EMBER_CPU_BF16=emulate /work/bin/ember-$1 bench configs/multi30k-tiny-wu.yaml --steps 2 --warmup 1 --json \
        --set train.threads=2 --set train.precision=$p --set train.activations=$2 $extra 2>/dev/null | python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)))")
      echo "{\"shape\":\"$shape\",\"precision\":\"$p\",\"binary\":\"$1\",\"activations\":\"$2\",\"bench\":$out}"
    done
  done
done

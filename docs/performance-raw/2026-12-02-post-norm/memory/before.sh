#!/usr/bin/env bash
# The "before" side again with the build of bcbb5e5 (main at the session's start).
cd /work/main
BASE="--set model.d_model=512 --set model.n_heads=8 --set model.d_ff=2048 --set model.n_encoder_layers=6 --set model.n_decoder_layers=6"
for shape in tiny base; do
  extra=""; [[ $shape == base ]] && extra=$BASE
  for p in f32 bf16; do
      out=$(EMBER_CPU_BF16=emulate /work/bin/ember-final31 bench configs/multi30k-tiny-wu.yaml --steps 2 --warmup 1 --json \
        --set train.threads=2 --set train.precision=$p $extra 2>/dev/null | python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)))")
      echo "{\"shape\":\"$shape\",\"precision\":\"$p\",\"binary\":\"final31\",\"activations\":\"keep\",\"bench\":$out}"
  done
done

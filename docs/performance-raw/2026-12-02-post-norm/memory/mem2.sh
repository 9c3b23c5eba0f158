#!/usr/bin/env bash
# post1 (h kept as a copy of x in f32 post-norm branches) against post2 (not kept), f32 keep and recompute, tiny and base.
cd /work/main
BASE="--set model.d_model=512 --set model.n_heads=8 --set model.d_ff=2048 --set model.n_encoder_layers=6 --set model.n_decoder_layers=6"
for shape in tiny base; do
  extra=""; [[ $shape == base ]] && extra=$BASE
  for act in keep recompute; do
    for bin in post1 post2; do
      out=$(/work/bin/ember-$bin bench configs/multi30k-tiny-wu.yaml --steps 2 --warmup 1 --json \
        --set train.threads=2 --set train.activations=$act $extra 2>/dev/null | python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)))")
      echo "{\"shape\":\"$shape\",\"precision\":\"f32\",\"binary\":\"$bin\",\"activations\":\"$act\",\"bench\":$out}"
    done
  done
done

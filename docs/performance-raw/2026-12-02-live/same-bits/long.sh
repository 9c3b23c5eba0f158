#!/usr/bin/env bash
# Same-bits at 256 positions (live-block compaction of the kept probabilities under bf16).
set -euo pipefail
bin=$1 out=$2
cd /work/main
for prec in f32 bf16; do
  for qk in none rmsnorm; do
    EMBER_CPU_BF16=emulate "$bin" train configs/shakespeare-char.yaml --quiet --run-dir "$out/$prec-$qk" \
      --set model.d_model=128 --set model.n_heads=2 --set model.d_ff=256 --set model.max_seq_len=256 \
      --set train.block_size=256 --set train.batch_size=4 --set model.qk_norm=$qk \
      --set train.steps=6 --set train.warmup_steps=2 --set eval.every=6 --set checkpoint.every=6 \
      --set train.threads=1 --set train.precision=$prec >/dev/null
  done
done

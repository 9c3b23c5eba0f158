#!/usr/bin/env bash
# Post-norm models' bits: BIN OUT [extra --set ...]. fairseq's Transformer-Tiny (multi30k-tiny-wu)
# for 20 steps with a checkpoint at 10 and 20, and a post-norm ReLU biased quickstart LM.
set -euo pipefail
bin=$1 out=$2; shift 2
mkdir -p "$out"
"$bin" train configs/multi30k-tiny-wu.yaml --quiet --run-dir "$out/wu" --set train.steps=20 --set train.max_tokens=1024 \
  --set train.warmup_steps=5 --set checkpoint.every=10 --set eval.every=20 \
  --set train.threads=2 "$@"
for qk in none layernorm; do
"$bin" train configs/quickstart.yaml --quiet --run-dir "$out/qs-post-$qk" --set model.norm_placement=post \
  --set model.mlp=relu --set model.proj_bias=true --set model.qk_norm=$qk --set train.steps=40 \
  --set train.warmup_steps=10 --set checkpoint.every=20 --set eval.every=40 --set train.threads=2 "$@"
done

#!/usr/bin/env bash
# What one short GPU loan verifies (a `device` call of at most 10 minutes, within a loan of 15
# with the machine's start-up): scripts/gpu-check.sh's sections in stages, each under its own time
# limit, so that a stage that runs long (a test that hangs, torch.compile recompiling) cannot take
# the later stages' time. Every stage's files come back even when it is cut short: gpu-check.sh
# packs its results after each section and each bench config.
#
#   scripts/gpu-prepare.sh                 # here, first: builds and packs .dev/
#   scripts/gpu-loan.sh [--scale S]        # there: `carry: [".dev"]`, timeout_s ≥ 590
#
# Stages (seconds at --scale 1):
#   suite    150  the GPU suite: every CUDA kernel against its composition, f32 and bf16; the
#                 model's bf16 branches; the CPU-vs-CUDA, kernels-on-vs-off and bf16-vs-f32
#                 trajectories; kill -9 resumes
#   bench    230  ember f32 and bf16 beside PyTorch eager f32 and under bf16 autocast, on
#                 standard, shakespeare-char, multi30k-tiny and quickstart, 2 pairs of 20 steps
#   amx       70  the host CPU's AMX tiles against their emulator, and bf16 on the tiles against
#                 vdpbf16ps at 16 threads (where the CPU has AMX)
#   compile  110  PyTorch under autocast through torch.compile (1 run per config: its compile
#                 time is paid again by every run), standard first
#
# Writes $OUT/gpu-loan.tgz (each stage's folder and log) and prints each stage's summary.
set -uo pipefail
cd "$(dirname "$0")/.."
scale=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --scale) scale=$2; shift 2 ;;
    *) echo "gpu-loan: unknown argument $1" >&2; exit 2 ;;
  esac
done
results=${OUT:-/tmp/gpu-loan}
mkdir -p "$results"
limit() { python3 -c "print(max(1, round($1 * $scale)))"; }

stage() {
  local name=$1 seconds; seconds=$(limit "$2"); shift 2
  mkdir -p "$results/$name"
  echo "== $name (limit ${seconds}s)"
  OUT=$results/$name timeout "$seconds" scripts/gpu-check.sh "$@" > "$results/$name.log" 2>&1
  local rc=$?
  [[ $rc -eq 124 ]] && echo "   cut short at ${seconds}s"
  tail -n 40 "$results/$name.log"
}

stage suite 150 --sections suite
# ember-bf16 runs every kernel, the unverified bf16 variants included (bf16 branch activations,
# bf16 logits); gpu-check.sh's ember-bf16-verified is the default kernel set in bf16.
stage bench 230 --sections bench --configs standard,shakespeare-char,multi30k-tiny,quickstart \
  --impls ember,ember-bf16,torch,torch-bf16 --pairs 2 --steps 20
stage amx 70 --sections amx --pairs 1
stage compile 110 --sections bench --configs standard,shakespeare-char,multi30k-tiny \
  --impls torch-bf16-compile --pairs 1 --steps 20

# A device call brings back at most 8 files: one archive.
(cd "$results" && tar czf gpu-loan.tgz suite bench amx compile ./*.log && rm -rf suite bench amx compile ./*.log)
echo "results: $results/gpu-loan.tgz"

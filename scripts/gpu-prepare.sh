#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs on a lent GPU machine and packs it into .dev/, the folder
# a `device` call carries (../shared/cuda/README.md): the CUDA build of `ember`, the GPU suite's
# test binaries (crates/kernels/tests/gpu, crates/model/tests/gpu_bf16_branches.rs,
# tests/gpu_training.rs), the CUDA call counter
# (scripts/gpu/cuda-call-counter.c, a CUPTI injection library), ember-kernels' unit tests (their
# ignored AMX test holds the machine's AMX tiles to their emulator) and the data the benchmarks read.
# Binaries are stripped and xz-compressed (a call carries at most 64 MiB).
#
#   scripts/gpu-prepare.sh            # ~20 min cold on 2 cores (candle's kernels), minutes after
#
# Then, in one device call: `carry: [".dev"]`, command `scripts/gpu-check.sh` with its sections,
# or `scripts/gpu-loan.sh` (every check that fits a 15-minute loan, in stages).
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-common-dir)/info/exclude
mkdir -p "$(dirname "$exclude")"
grep -qx '/.dev/' "$exclude" 2>/dev/null || echo '/.dev/' >> "$exclude"
# setup-toolkit.sh reads cudarc's sources (for the driver's link stub), which only a fetch
# brings to a fresh machine; without them it exits before printing anything, and an `eval` of
# nothing would go on to a build that fails on the missing nvcc instead.
cargo fetch --quiet
toolkit_env=$(../shared/cuda/setup-toolkit.sh) || {
  echo "gpu-prepare: ../shared/cuda/setup-toolkit.sh exited with status $?; run it alone to see where" >&2
  exit 1
}
eval "$toolkit_env"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target-cuda}
case $CARGO_TARGET_DIR in
  /*) ;;  # outside the tree
  *) grep -qx "/$CARGO_TARGET_DIR/" "$exclude" 2>/dev/null || echo "/$CARGO_TARGET_DIR/" >> "$exclude" ;;
esac

cargo build --release --features cuda
# Test executables of the given targets, one "name path" line each, as cargo names them.
test_executables() {
  cargo test --release --features cuda --no-run --message-format=json "$@" 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["target"]["name"], m["executable"])'
}
# The GPU suite's, and ember-kernels' unit tests for the AMX check (kept out of .dev/tests, which
# the suite runs whole).
tests=$(test_executables -p ember-kernels --test gpu -p ember-model --test gpu_bf16_branches -p ember --test gpu_training)
kernels_lib=$(test_executables -p ember-kernels --lib | cut -d' ' -f2)
rm -rf .dev && mkdir -p .dev/tests .dev/amx .dev/data
strip -o .dev/ember "$CARGO_TARGET_DIR/release/ember"
while read -r name exe; do strip -o ".dev/tests/$name" "$exe"; done <<< "$tests"
strip -o .dev/amx/ember_kernels "$kernels_lib"
xz -T2 -6 .dev/ember .dev/tests/* .dev/amx/*

# The CUDA call counter, against CUPTI 13.0 (the lent machines' PyTorch ships libcupti.so.13).
cupti=${TMPDIR:-/tmp}/cupti-13.0
if [[ ! -f $cupti/nvidia/cu13/include/cupti.h ]]; then
  mkdir -p "$cupti"
  python3 -m pip download -q --no-deps nvidia-cuda-cupti==13.0.85 -d "$cupti"
  (cd "$cupti" && python3 -m zipfile -e nvidia_cuda_cupti-*.whl .)
fi
gcc -O2 -shared -fPIC -Wall -I "$cupti/nvidia/cu13/include" -I "$CUDA_ROOT/include" \
    scripts/gpu/cuda-call-counter.c -o .dev/libcuda-call-counter.so \
    -L "$cupti/nvidia/cu13/lib" -l:libcupti.so.13

scripts/get-data.sh >/dev/null
mkdir -p .dev/data/multi30k .dev/data/tinyshakespeare
cp data/multi30k/{train,val,test_2016_flickr}.{en,de}.gz .dev/data/multi30k/
cp data/tinyshakespeare/input.txt .dev/data/tinyshakespeare/
git rev-parse HEAD > .dev/commit
git diff --quiet HEAD || echo "(with uncommitted changes)" >> .dev/commit
du -sh .dev; ls -la .dev .dev/tests

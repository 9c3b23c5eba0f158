#!/usr/bin/env bash
# A link-time stand-in for NCCL, so that `cargo build --release --features nccl` links on a
# machine without NCCL (and without a GPU), e.g. next to ../shared/cuda/setup-toolkit.sh's
# toolkit. The binary then loads the real libnccl.so.2 at run time (the GPU machine's PyTorch
# wheels ship it: nvidia/nccl/lib).
#
#   eval "$(../shared/cuda/setup-toolkit.sh)"     # CUDA_ROOT
#   scripts/nccl-link-stub.sh                     # writes $CUDA_ROOT/lib64/libnccl.so (soname libnccl.so.2)
#   CARGO_TARGET_DIR=target-cuda cargo build --release --features nccl
#
# The stub defines every function cudarc's NCCL bindings declare, as empty functions; it is
# never loaded: its soname sends the loader to the real library. Do not use it where NCCL is
# installed (link against that instead).
set -euo pipefail
die() { echo "nccl-link-stub: $*" >&2; exit 1; }
[[ -n ${CUDA_ROOT:-} ]] || die "CUDA_ROOT is not set (eval \"\$(../shared/cuda/setup-toolkit.sh)\" first)"
src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-*/src/nccl/sys/mod.rs 2>/dev/null | sort -V | tail -1)
[[ -n $src ]] || die "cudarc's sources are missing: run 'cargo fetch' in the project first"
out="$CUDA_ROOT/lib64/libnccl.so"
mkdir -p "$CUDA_ROOT/lib64"
c=$(mktemp --suffix=.c)
grep -oE 'pub (unsafe )?fn nccl[A-Za-z0-9_]+' "$src" | awk '{print $NF}' | sort -u \
  | awk '{print "void "$1"(void){}"}' >"$c"
gcc -shared -fPIC -o "$out" -Wl,-soname,libnccl.so.2 "$c"
rm -f "$c"
echo "wrote $out ($(grep -c . <(nm -D --defined-only "$out" | grep ' T nccl')) NCCL symbols, soname libnccl.so.2)"

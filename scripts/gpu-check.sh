#!/usr/bin/env bash
# One GPU session's verification of Ember's CUDA path, run in one `device` call over what
# scripts/gpu-prepare.sh packed into .dev/ (carry: [".dev"]). Sections (all by default):
#
#   suite   the GPU suite: every CUDA kernel against its unfused candle composition (values,
#           gradients, strided inputs, determinism), CUDA dropout masks = CPU masks, a 50-step
#           CPU-vs-CUDA trajectory, kernels on vs off, bf16 branches against f32 ones in every
#           model configuration, and a CUDA kill -9 resume (bit-identical)
#   counts  CUDA driver calls per training step (kernel launches, host<->device copies,
#           synchronisations) from two `ember bench` runs that differ only in their step count,
#           counted by a CUPTI injection library (.dev/libcuda-call-counter.so)
#   bench   `ember bench --set device=cuda:0` (CUDA kernels on, and off; f32 and bf16) beside the
#           PyTorch reference (scripts/reference/ember_ref.py --device cuda: f32, and bf16 under
#           autocast, eager and torch.compile) on quickstart, multi30k-tiny, shakespeare-char and
#           `standard` (shakespeare-char at nanoGPT's standard shape), alternating, every timer
#           read after a synchronisation; ms/step, tokens/s and peak GPU memory (nvidia-smi,
#           polled every 50 ms, above the idle level)
#   cpu     the CPU thread/share sweep of `ember bench` on this machine's 16 cores
#   amx     where this machine's CPU has AMX: ember-kernels' ignored test holding the AMX tiles'
#           bf16 products to their emulator (every layout and edge), and `ember bench` in bf16 at
#           the standard shape on the tiles against EMBER_CPU_VECTOR_UNIT=avx512 (vdpbf16ps),
#           alternating, 16 threads; otherwise the CPU's name and that it has none
#
#   scripts/gpu-check.sh [--sections suite,counts,bench,cpu,amx] [--configs a,b] [--pairs N] [--steps N]
#                        [--impls ember,ember-off,ember-nocache,torch,ember-bf16,ember-bf16-verified,ember-bf16-composed,torch-bf16,torch-bf16-compile]
#                        [--kernels all,none,nocache]
#
# --configs: which of quickstart, multi30k-tiny, shakespeare-char, standard the counts, bench and
# cpu sections run (default: all four for bench, multi30k-tiny and shakespeare-char for counts and
# cpu). --impls: what the bench section times (ember: every kernel, EMBER_CUDA_KERNELS=all: the
# defaults plus the bf16 variants, which f32 activations never reach; ember-off: CUDA kernels off;
# ember-nocache: candle's upload cache off, EMBER_CUDA_PARAM_CACHE=0; ember-bf16:
# train.precision=bf16 with every kernel, so the pre-norm branches' activations are bf16 and the
# loss keeps cuBLAS's bf16 logits for its bf16 variant (the widened logits' bits, half their
# memory); ember-bf16-verified: the same with the verified kernels only, f32 activations and the
# logits widened to f32; ember-bf16-composed: the same with the attention and cross-entropy
# kernels off, so candle's compositions around cuBLAS's bf16 GEMMs instead (bf16's path before
# those kernels took bf16: which is faster is unmeasured); torch-bf16: the reference under bf16
# autocast; torch-bf16-compile: the
# same through torch.compile); --kernels: the settings the counts section counts under (all: every
# kernel, the defaults plus the bf16 variants, which training's f32 activations never reach;
# none: kernels off; nocache: all kernels, upload cache off).
#
# The defaults run every section, config and impl (over an hour on a GPU): a device call with a
# time budget names its --sections, --configs, --impls and --pairs. Within a 15-minute loan
# (start-up included), scripts/gpu-loan.sh runs this script's sections in stages, each under its
# own time limit (earlier calls of suite+counts+bench at two configs and two impls took 127 s,
# docs/performance.md).
#
# Prints one table last. Logs and JSON go to a work folder, packed after every section into
# $OUT/gpu-check.tgz (a device call returns at most 8 files) beside $OUT/summary.md.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${OUT:-/tmp}
OUT=$(mktemp -d /tmp/gpu-check.XXXXXX)
pack() { tar czf "$RESULTS/gpu-check.tgz" -C "$OUT" . 2>/dev/null; }
sections=suite,counts,bench,cpu,amx pairs=2 steps=30 configs="" kernel_sets=all,none,nocache
impls=ember,ember-off,ember-nocache,torch,ember-bf16,ember-bf16-verified,ember-bf16-composed,torch-bf16,torch-bf16-compile
while [[ $# -gt 0 ]]; do
  case $1 in
    --sections) sections=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --impls) impls=$2; shift 2 ;;
    --kernels) kernel_sets=$2; shift 2 ;;
    *) echo "gpu-check: unknown argument $1" >&2; exit 2 ;;
  esac
done
has() { [[ ",$sections," == *",$1,"* ]]; }
started=$SECONDS
mark() { echo "[$((SECONDS - started))s] $*"; }

# Unpacked once per machine: a second call of this script in the same device command reuses them.
for f in .dev/ember.xz .dev/tests/*.xz .dev/amx/*.xz; do
  # Through a temporary name: a call cut short mid-way leaves no half binary behind.
  [[ ${f%.xz} -nt $f ]] || { xz -dc "$f" > "${f%.xz}.part" && chmod +x "${f%.xz}.part" && mv "${f%.xz}.part" "${f%.xz}"; }
done
mkdir -p data && cp -rn .dev/data/. data/
export LD_LIBRARY_PATH=$(python3 -c "import glob,os,nvidia;print(':'.join(d for r in nvidia.__path__ for d in sorted(glob.glob(os.path.join(r,'*','lib')))))")
export EMBER_BIN=$PWD/.dev/ember
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
echo "ember $(tr '\n' ' ' < .dev/commit)" | tee -a "$OUT/gpu.txt"
if [[ -n $configs ]]; then
  IFS=, read -r -a CONFIGS <<< "$configs"; LARGE=("${CONFIGS[@]}")
else
  CONFIGS=(quickstart multi30k-tiny shakespeare-char standard); LARGE=(multi30k-tiny shakespeare-char)
fi
# The config file (and overrides) of a config name; `standard` is nanoGPT's standard Shakespeare
# shape (6 layers, d 384, 6 heads, block 256, batch 16, no dropout) on shakespeare-char.
cfg_args() {
  case $1 in
    standard) echo "configs/shakespeare-char.yaml --set model.n_layers=6 --set model.n_heads=6 --set model.d_model=384" \
                "--set model.d_ff=1536 --set model.max_seq_len=256 --set train.block_size=256 --set train.batch_size=16" \
                "--set model.dropout=0.0" ;;
    *) echo "configs/$1.yaml" ;;
  esac
}

if has suite; then
  for t in .dev/tests/*; do
    [[ $t == *.xz ]] && continue
    name=$(basename "$t")
    mark "suite: $name"
    # --nocapture: the tests print what they measured (e.g. the CPU-vs-CUDA drift) even when passing.
    timeout 300 "$t" --test-threads=1 --nocapture > "$OUT/suite-$name.log" 2>&1
    echo "exit $?" >> "$OUT/suite-$name.log"
    grep -E '^test .* (FAILED|ok)$|^test result|panicked|relative|max relative|difference' "$OUT/suite-$name.log" | head -60
  done
fi

# Peak GPU memory of one command: nvidia-smi's used memory, polled, above the level before it.
with_memory() {
  local mem=$1; shift
  local idle; idle=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 > "$mem.poll" 2>/dev/null &
  local poller=$!
  "$@"
  local rc=$?
  kill $poller 2>/dev/null; wait $poller 2>/dev/null
  python3 -c "import sys;v=[int(x) for x in open('$mem.poll') if x.strip().isdigit()];print(max(v+[$idle])-$idle)" > "$mem"
  return $rc
}

pack
if has bench; then
  for cfg in "${CONFIGS[@]}"; do
    for ((p = 1; p <= pairs; p++)); do
      for impl in ${impls//,/ }; do
        tag=$OUT/bench-$cfg-$impl-$p
        mark "bench: $cfg $impl pair $p"
        case $impl in
          ember) with_memory "$tag.mem" env EMBER_CUDA_KERNELS=all timeout 300 .dev/ember bench $(cfg_args "$cfg") \
                   --steps "$steps" --set device=cuda:0 --json > "$tag.json" 2> "$tag.err" ;;
          ember-off) with_memory "$tag.mem" env EMBER_CUDA_KERNELS=none timeout 300 .dev/ember bench $(cfg_args "$cfg") \
                   --steps "$steps" --set device=cuda:0 --json > "$tag.json" 2> "$tag.err" ;;
          # without candle's upload cache for its strided ops' parameters (on by default).
          ember-nocache) with_memory "$tag.mem" env EMBER_CUDA_KERNELS=all EMBER_CUDA_PARAM_CACHE=0 timeout 300 .dev/ember \
                   bench $(cfg_args "$cfg") --steps "$steps" --set device=cuda:0 --json > "$tag.json" 2> "$tag.err" ;;
          ember-bf16) with_memory "$tag.mem" env EMBER_CUDA_KERNELS=all timeout 300 .dev/ember bench $(cfg_args "$cfg") \
                   --steps "$steps" --set device=cuda:0 --set train.precision=bf16 --json > "$tag.json" 2> "$tag.err" ;;
          ember-bf16-verified) with_memory "$tag.mem" env EMBER_CUDA_KERNELS=verified timeout 300 .dev/ember bench \
                   $(cfg_args "$cfg") --steps "$steps" --set device=cuda:0 --set train.precision=bf16 --json \
                   > "$tag.json" 2> "$tag.err" ;;
          ember-bf16-composed) with_memory "$tag.mem" env EMBER_CUDA_KERNELS=dropout,optimizer,softmax,norm,activation,rope \
                   timeout 300 .dev/ember bench $(cfg_args "$cfg") --steps "$steps" --set device=cuda:0 \
                   --set train.precision=bf16 --json > "$tag.json" 2> "$tag.err" ;;
          torch) with_memory "$tag.mem" timeout 300 python3 scripts/reference/ember_ref.py $(cfg_args "$cfg") --bench \
                   --steps "$steps" --device cuda --ember "$EMBER_BIN" --json > "$tag.json" 2> "$tag.err" ;;
          torch-bf16) with_memory "$tag.mem" timeout 300 python3 scripts/reference/ember_ref.py $(cfg_args "$cfg") --bench \
                   --steps "$steps" --device cuda --autocast bf16 --ember "$EMBER_BIN" --json > "$tag.json" 2> "$tag.err" ;;
          torch-bf16-compile) with_memory "$tag.mem" timeout 300 python3 scripts/reference/ember_ref.py $(cfg_args "$cfg") \
                   --bench --steps "$steps" --device cuda --autocast bf16 --compile --ember "$EMBER_BIN" --json \
                   > "$tag.json" 2> "$tag.err" ;;
        esac
        [[ $? -eq 0 ]] || echo "  failed: $(tail -3 "$tag.err")"
      done
    done
    pack  # after each config: a call that runs out of time still brings back what was timed
  done
fi

pack
if has counts; then
  for cfg in "${LARGE[@]}"; do
    for kernels in ${kernel_sets//,/ }; do
      for n in 10 20; do
        mark "counts: $cfg kernels=$kernels steps=$n"
        cache=1; k=$kernels; [[ $kernels == nocache ]] && { cache=0; k=all; }
        CUDA_INJECTION64_PATH=$PWD/.dev/libcuda-call-counter.so EMBER_CUDA_COUNTS=$OUT/counts-$cfg-$kernels-$n.json \
          EMBER_CUDA_KERNELS=$k EMBER_CUDA_PARAM_CACHE=$cache timeout 300 .dev/ember bench $(cfg_args "$cfg") --steps $n --set device=cuda:0 --json \
          > "$OUT/counts-$cfg-$kernels-$n.bench.json" 2> "$OUT/counts-$cfg-$kernels-$n.err" || echo "  failed: see counts-$cfg-$kernels-$n.err"
      done
    done
  done
fi

pack
if has cpu; then
  for cfg in "${LARGE[@]}"; do
    for ts in 1:1 4:4 8:8 16:16; do
      t=${ts%:*} s=${ts#*:}
      mark "cpu: $cfg threads $t shares $s"
      timeout 300 .dev/ember bench $(cfg_args "$cfg") --steps 10 --set train.threads=$t --set train.shares=$s --json \
        > "$OUT/cpu-$cfg-$t-$s.json" 2> "$OUT/cpu-$cfg-$t-$s.err" || echo "  failed: $(tail -2 "$OUT/cpu-$cfg-$t-$s.err")"
    done
  done
fi

pack
if has amx; then
  grep -m1 "model name" /proc/cpuinfo | tee "$OUT/amx-cpu.txt"
  if grep -qw amx_bf16 /proc/cpuinfo; then
    mark "amx: the tiles against their emulator"
    timeout 300 .dev/amx/ember_kernels --ignored --exact gemm::amx_tests::amx_hardware_gives_the_emulated_products \
      --nocapture > "$OUT/amx-test.log" 2>&1
    echo "exit $?" >> "$OUT/amx-test.log"
    grep -E '^test |panicked|AMX hardware|exit' "$OUT/amx-test.log" | tee -a "$OUT/amx-cpu.txt"
    for ((p = 1; p <= pairs; p++)); do
      for unit in amx avx512; do
        mark "amx: bench standard bf16 on $unit, pair $p"
        EMBER_CPU_VECTOR_UNIT=$unit timeout 300 .dev/ember bench $(cfg_args standard) --steps 10 --set train.precision=bf16 \
          --set train.threads=16 --json > "$OUT/amx-bench-$unit-$p.json" 2> "$OUT/amx-bench-$unit-$p.err" ||
          echo "  failed: $(tail -2 "$OUT/amx-bench-$unit-$p.err")"
        python3 -c "import json;d=json.load(open('$OUT/amx-bench-$unit-$p.json'));print('  ', d['products'], d['ms_per_step_median'], 'ms/step')" 2>/dev/null
      done
    done
  else
    echo "no AMX on this CPU" | tee -a "$OUT/amx-cpu.txt"
  fi
  cp "$OUT/amx-cpu.txt" "$RESULTS/amx.txt"
fi

mark "done"
pack
python3 scripts/gpu/summarize.py "$OUT" | tee "$RESULTS/summary.md"

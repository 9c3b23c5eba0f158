#!/usr/bin/env bash
# Ember vs. real nanoGPT on Tiny Shakespeare (character level), side by side, in f32 and bf16.
#
#   scripts/bench-vs-nanogpt.sh [--shape cpu|standard] [--precision f32|bf16|both]
#                               [--pairs N] [--iters N] [--warmup N] [--threads N[,N...]]
#                               [--nanogpt DIR] [--out FILE] [--ember BIN | --no-build]
#
# Alternates `ember bench configs/shakespeare-char.yaml` and nanoGPT's own
# `train.py config/train_shakespeare_char.py --device=cpu --compile=False` at one model shape,
# for N pairs (default 3), so that load from other tenants of a shared machine hits both alike.
# nanoGPT's per-iteration times are its own `time ...ms` log lines; the first --warmup iterations
# (default 5; they include its initial evaluation) are dropped, the next --iters (default 40) are
# timed. Ember times as many steps after as many warm-up steps. Prints per pair the median and
# p10 ms/step of each and the ratio (nanoGPT ms ÷ Ember ms, above 1: Ember faster), then per
# precision the medians over pairs, their range, and the median (range) of the ratios; raw
# results, one JSON object per run, then the summary lines, go to --out
# (scripts/bench_vs_nanogpt.py keeps the books).
#
# --shape (both sides get the same one; dropout 0, so both do the same work):
#   cpu       (default) the CPU shape of nanoGPT's README: 4 layers, 4 heads, d 128, d_ff 512,
#             block 64, batch 12 — what configs/shakespeare-char.yaml is, so Ember takes it as is.
#   standard  the model of nanoGPT's config/train_shakespeare_char.py: 6 layers, 6 heads, d 384,
#             d_ff 1536, block 256, at batch 16 (the config's own is 64, with dropout 0.2):
#             Ember gets --set model.n_layers=6 model.n_heads=6 model.d_model=384
#             model.d_ff=1536 model.max_seq_len=256 train.block_size=256 train.batch_size=16
#             model.dropout=0.0. One pair there takes minutes, not seconds.
#
# --precision (default f32):
#   f32   Ember as configured (f32); nanoGPT with --dtype=float32, its train.py untouched.
#   bf16  Ember with --set train.precision=bf16 (mixed precision; needs AVX512_BF16, which Ember
#         checks and names when missing). nanoGPT with --dtype=bfloat16 under
#         torch.autocast("cpu", dtype=torch.bfloat16) — PyTorch's mixed precision. nanoGPT's
#         train.py never autocasts on the CPU (`ctx = nullcontext() if device_type == 'cpu' else
#         torch.amp.autocast(...)`), so this script copies train.py into its scratch folder
#         (deleted at exit), rewrites that one line there to always autocast, and runs the copy
#         beside links to the checkout's model.py, configurator.py, config/ and data/; the
#         checkout itself, and this repository, are never patched, and no nanoGPT code is
#         committed here. The two recipes differ in what is bf16: Ember rounds the operands of
#         its matrix products and keeps activations f32; autocast casts the inputs and outputs
#         of the ops on its bf16 list (linear layers, matmuls, attention) to bf16.
#   both  each pair runs all four, Ember f32, nanoGPT f32, Ember bf16, nanoGPT bf16, and the
#         summary adds each side's bf16 speed-up (f32 ms ÷ bf16 ms, per pair) and each side's
#         faster precision against the other's. On a CPU without AVX512_BF16 Ember refuses bf16
#         (the script says so and goes on): nanoGPT's autocast then runs beside both f32 runs,
#         which is what bf16 gives a PyTorch user on that CPU.
#
# --threads N runs both at N threads (Ember: train.threads; nanoGPT: OMP_NUM_THREADS, which torch
# reads at start); a list is a sweep. Without it each takes its own default (Ember: the physical
# cores; torch: its default).
#
# Ember: --ember BIN benchmarks that binary (a build of another commit, say); otherwise
# `cargo build --release` builds target/release/ember first, unless --no-build. Before the first
# pair, one untimed Ember step in each precision at the shape checks that it can run there (a
# binary too old for train.precision stops the script at once, and so does a CPU without
# AVX512_BF16 unless --precision both).
#
# nanoGPT is cloned at a pinned commit into $NANOGPT_DIR (default ~/.cache/ember/nanoGPT) unless
# --nanogpt names a checkout; the clone comes from $NANOGPT_REPO (default GitHub; a local mirror
# where GitHub is out of reach, see scripts/nanogpt.sh). Its shakespeare_char data is prepared
# from data/tinyshakespeare/input.txt (scripts/get-data.sh). Python: as scripts/bench-vs-torch.sh
# ($EMBER_TORCH_VENV). Not part of CI.
set -euo pipefail

die() { echo "bench-vs-nanogpt: error: $*" >&2; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit "${1:-0}"; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
here="$PWD"
cd "$ROOT"

pairs=3 iters=40 warmup=5 threads_list=default out="" build=1 nanogpt="" shape=cpu precision=f32 ember=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage 0 ;;
    --shape) shape="${2:?--shape needs cpu or standard}"; shift 2 ;;
    --precision) precision="${2:?--precision needs f32, bf16 or both}"; shift 2 ;;
    --pairs) pairs="${2:?--pairs needs a number}"; shift 2 ;;
    --iters) iters="${2:?--iters needs a number}"; shift 2 ;;
    --warmup) warmup="${2:?--warmup needs a number}"; shift 2 ;;
    --threads) threads_list="${2:?--threads needs a number or a list like 1,2}"; shift 2 ;;
    --nanogpt) nanogpt="${2:?--nanogpt needs a directory}"; shift 2 ;;
    --out) out="${2:?--out needs a file}"; shift 2 ;;
    --ember) ember="${2:?--ember needs the path of an ember binary}"; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "bench-vs-nanogpt: unknown argument $1" >&2; usage 2 ;;
  esac
done
for v in pairs iters; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "--$v must be a positive integer, got '${!v}'"
done
[[ "$warmup" =~ ^[0-9]+$ ]] || die "--warmup must be a non-negative integer, got '$warmup'"
if [[ "$threads_list" != default ]]; then
  [[ "$threads_list" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--threads must be positive integers separated by commas, got '$threads_list'"
fi
IFS=, read -r -a thread_counts <<< "$threads_list"
# Paths given on the command line are the caller's, wherever the script runs.
for v in nanogpt out ember; do
  [[ -z "${!v}" || "${!v}" = /* ]] || printf -v "$v" '%s/%s' "$here" "${!v}"
done
[[ -z "$ember" || ( -f "$ember" && -x "$ember" ) ]] || die "--ember $ember is not an executable file"

# Each side's arguments for the shape (see the header); nanoGPT's d_ff is always 4 × n_embd.
case "$shape" in
  cpu) ember_shape=()
       nanogpt_shape=(--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --dropout=0.0) ;;
  standard) ember_shape=(--set model.n_layers=6 --set model.n_heads=6 --set model.d_model=384
                         --set model.d_ff=1536 --set model.max_seq_len=256 --set train.block_size=256
                         --set train.batch_size=16 --set model.dropout=0.0)
            nanogpt_shape=(--block_size=256 --batch_size=16 --n_layer=6 --n_head=6 --n_embd=384 --dropout=0.0) ;;
  *) die "--shape must be cpu or standard, got '$shape'" ;;
esac
case "$precision" in
  f32|bf16) precisions=("$precision") ;;
  both) precisions=(f32 bf16) ;;
  *) die "--precision must be f32, bf16 or both, got '$precision'" ;;
esac
precision_list="$(IFS=,; echo "${precisions[*]}")"

source scripts/torch-venv.sh   # sets $py
source scripts/nanogpt.sh      # nanogpt_prepare, $NANOGPT_DEFAULT_DIR, $NANOGPT_COMMIT
source scripts/ember-release.sh   # ember_release_binary
books=scripts/bench_vs_nanogpt.py   # the JSONL records, the table rows, the summary

# --- nanoGPT and its data ---------------------------------------------------------------------
nanogpt="${nanogpt:-$NANOGPT_DEFAULT_DIR}"
nanogpt_prepare "$nanogpt"
nanogpt="$(cd "$nanogpt" && pwd)"
nanogpt_commit="$(git -C "$nanogpt" rev-parse --verify --quiet HEAD 2>/dev/null || echo unknown)"
torch_info="$("$py" -c 'import torch; print(torch.__version__, getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")())')" \
  || die "cannot import torch from $py"
echo "== torch ${torch_info% *} (its CPU kernels: ${torch_info#* })" >&2

# --- Ember ------------------------------------------------------------------------------------
[[ -n "$ember" ]] || ember_release_binary "$build" "name a binary with --ember"
echo "== Ember: $ember" >&2

out="${out:-$(mktemp "${TMPDIR:-/tmp}/bench-vs-nanogpt.XXXXXX.jsonl")}"
: >"$out" || die "cannot write $out"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# One `ember bench` at the shape: precision, threads, timed steps, warm-up steps. f32 is the
# config's own precision (so binaries from before train.precision run it too).
ember_bench() { # precision threads steps warmup
  local args=(bench configs/shakespeare-char.yaml --json --steps "$3" --warmup "$4" "${ember_shape[@]}")
  [[ "$1" == f32 ]] || args+=(--set "train.precision=$1")
  [[ "$2" == default ]] || args+=(--set "train.threads=$2")
  "$ember" "${args[@]}"
}

# Refuse what cannot run before the first timed run rather than minutes into it: one step of
# each precision at the shape (Ember names a missing CPU feature or a key it does not know).
# With --precision both on a CPU without AVX512_BF16, Ember's bf16 is refused and nanoGPT's
# autocast runs alone beside both f32 runs: what a PyTorch user gets from bf16 on that CPU.
ember_refuses=()
for p in "${precisions[@]}"; do
  if ! err="$(ember_bench "$p" default 1 0 2>&1 >/dev/null)"; then
    if [[ "$p" == bf16 && "$precision" == both && "$err" == *AVX512_BF16* ]]; then
      printf '== Ember refuses bf16 on this CPU, so only nanoGPT runs bf16. Ember says:\n%s\n' "$err" >&2
      ember_refuses+=(bf16)
      continue
    fi
    echo "$err" >&2
    hint=""
    [[ "$err" != *AVX512_BF16* ]] || hint="; --precision both times nanoGPT's autocast beside both sides' f32 here"
    die "Ember cannot run the $shape shape in $p (its error is above)$hint"
  fi
done

# nanoGPT in bf16: a scratch copy of train.py, its CPU autocast line rewritten, run beside links
# to the checkout's model.py, configurator.py, config/ and data/.
nanogpt_dir_for() { # precision
  if [[ "$1" == f32 ]]; then echo "$nanogpt"; else echo "$scratch/nanogpt-autocast"; fi
}
if [[ " ${precisions[*]} " == *" bf16 "* ]]; then
  autocast="$scratch/nanogpt-autocast"
  mkdir "$autocast"
  for f in model.py configurator.py config data; do ln -s "$nanogpt/$f" "$autocast/$f"; done
  cpu_line="ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)"
  grep -qxF "$cpu_line" "$nanogpt/train.py" \
    || die "$nanogpt/train.py has no line '$cpu_line' to patch for CPU autocast (pinned commit: $NANOGPT_COMMIT)"
  sed 's/^ctx = nullcontext() if device_type == .cpu. else \(torch\.amp\.autocast(.*)\)$/ctx = \1/' \
    "$nanogpt/train.py" >"$autocast/train.py"
  grep -qxF "ctx = torch.amp.autocast(device_type=device_type, dtype=ptdtype)" "$autocast/train.py" \
    || die "patching nanoGPT's train.py for CPU autocast failed"
fi

run_ember() { # pair threads precision
  local report
  report="$(ember_bench "$3" "$2" "$iters" "$warmup")" || die "ember bench failed ($3, pair $1)"
  "$py" "$books" record "$out" ember "$1" "$2" "$3" "$shape" "$report" "ember=$ember"
}

run_nanogpt() { # pair threads precision
  local env=() log="$scratch/nanogpt.log" dtype=float32
  [[ "$2" == default ]] || env=(OMP_NUM_THREADS="$2" MKL_NUM_THREADS="$2")
  [[ "$3" == f32 ]] || dtype=bfloat16
  # train.py runs iterations 0 to max_iters inclusive, so this times exactly --iters of them.
  (cd "$(nanogpt_dir_for "$3")" && env "${env[@]}" "$py" train.py config/train_shakespeare_char.py \
      --device=cpu --compile=False --dtype="$dtype" "${nanogpt_shape[@]}" \
      --eval_iters=1 --eval_interval=1000000 --log_interval=1 --max_iters=$((warmup + iters - 1)) \
      --lr_decay_iters=2000 --out_dir="$scratch/out" >"$log" 2>&1) || { cat "$log" >&2; die "nanoGPT's train.py failed ($3, pair $1)"; }
  local ms
  ms="$(awk -v w="$warmup" '/^iter [0-9]+:/ { it = $2 + 0; if (it >= w) for (i = 1; i <= NF; i++) if ($i == "time") { sub(/ms,?$/, "", $(i + 1)); print $(i + 1) } }' "$log")"
  [[ "$(wc -w <<<"$ms")" -eq "$iters" ]] || { cat "$log" >&2; die "expected $iters timed iterations in nanoGPT's log, found $(wc -w <<<"$ms")"; }
  "$py" "$books" record "$out" nanogpt "$1" "$2" "$3" "$shape" "$ms" \
    "torch=${torch_info% *}" "nanogpt_commit=$nanogpt_commit"
}

# Alternation shares the load between the sides, but not its effect: torch's OpenMP threads wait
# on each other, so one thread descheduled by another tenant stalls a whole nanoGPT iteration,
# at its default threads far more than at fewer.
read -r load _ </proc/loadavg
if awk -v l="$load" -v c="$(nproc)" 'BEGIN { exit !(l >= c) }'; then
  echo "== warning: load average $load on $(nproc) CPUs; under load the sides' threads suffer unlike, so measure on a quiet machine or with --threads below the free cores" >&2
fi
echo "== shakespeare-char, $shape shape: $pairs pair(s) of $iters iterations (+$warmup warm-up), each pair Ember then nanoGPT in ${precisions[*]}, threads: $threads_list" >&2
"$py" "$books" header "$precision_list"
for ((i = 1; i <= pairs; i++)); do
  for t in "${thread_counts[@]}"; do
    for p in "${precisions[@]}"; do
      [[ " ${ember_refuses[*]} " == *" $p "* ]] || run_ember "$i" "$t" "$p"
      run_nanogpt "$i" "$t" "$p"
    done
    "$py" "$books" pair "$out" "$i" "$t" "$precision_list"
  done
done
"$py" "$books" summary "$out" "$precision_list"
echo "raw results: $out"

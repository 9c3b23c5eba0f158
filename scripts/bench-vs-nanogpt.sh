#!/usr/bin/env bash
# Ember vs. real nanoGPT on Tiny Shakespeare (character level, nanoGPT's CPU shape), side by side.
#
#   scripts/bench-vs-nanogpt.sh [--pairs N] [--iters N] [--warmup N] [--threads N[,N...]]
#                               [--nanogpt DIR] [--out FILE] [--no-build]
#
# Alternates `ember bench configs/shakespeare-char.yaml` and nanoGPT's own
# `train.py config/train_shakespeare_char.py --device=cpu --compile=False` with the CPU shape of
# nanoGPT's README (block 64, batch 12, 4 layers, 4 heads, d=128, dropout 0), for N pairs
# (default 3), so that load from other tenants of a shared machine hits both alike. nanoGPT's
# per-iteration times are its own `time ...ms` log lines; the first --warmup iterations (default
# 5; they include its initial evaluation) are dropped, the next --iters (default 40) are timed.
# Ember times as many steps after as many warm-up steps. Prints per pair the median and p10
# ms/step of each and the ratio (nanoGPT ms ÷ Ember ms, above 1: Ember faster), then the median
# ratio; raw results, one JSON object per line, go to --out.
#
# --threads N runs both at N threads (Ember: train.threads; nanoGPT: OMP_NUM_THREADS, which torch
# reads at start); a list is a sweep. Without it each takes its own default (Ember: the physical
# cores; torch: its default).
#
# nanoGPT is cloned at a pinned commit into $NANOGPT_DIR (default ~/.cache/ember/nanoGPT) unless
# --nanogpt names a checkout; its shakespeare_char data is prepared from
# data/tinyshakespeare/input.txt (scripts/get-data.sh). Python: as scripts/bench-vs-torch.sh
# ($EMBER_TORCH_VENV). Not part of CI.
set -euo pipefail

die() { echo "bench-vs-nanogpt: error: $*" >&2; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit "${1:-0}"; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

pairs=3 iters=40 warmup=5 threads_list=default out="" build=1 nanogpt=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage 0 ;;
    --pairs) pairs="${2:?--pairs needs a number}"; shift 2 ;;
    --iters) iters="${2:?--iters needs a number}"; shift 2 ;;
    --warmup) warmup="${2:?--warmup needs a number}"; shift 2 ;;
    --threads) threads_list="${2:?--threads needs a number or a list like 1,2}"; shift 2 ;;
    --nanogpt) nanogpt="${2:?--nanogpt needs a directory}"; shift 2 ;;
    --out) out="${2:?--out needs a file}"; shift 2 ;;
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

source scripts/torch-venv.sh   # sets $py
source scripts/nanogpt.sh      # nanogpt_prepare, $NANOGPT_DEFAULT_DIR

# --- nanoGPT and its data ---------------------------------------------------------------------
nanogpt="${nanogpt:-$NANOGPT_DEFAULT_DIR}"
nanogpt_prepare "$nanogpt"

# --- Ember ------------------------------------------------------------------------------------
target="${CARGO_TARGET_DIR:-target}"
[[ "$target" = /* ]] || target="$ROOT/$target"
ember="$target/release/ember"
if [[ $build -eq 1 ]]; then
  echo "== cargo build --release" >&2
  cargo build --release --quiet || die "cargo build --release failed"
fi
[[ -x "$ember" ]] || die "$ember not found (build with cargo build --release, or drop --no-build)"

out="${out:-$(mktemp "${TMPDIR:-/tmp}/bench-vs-nanogpt.XXXXXX.jsonl")}"
: >"$out" || die "cannot write $out"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# Appends one JSON line: the side, pair, thread setting and its median/p10 ms per step.
record() { # impl pair threads json-or-ms-list
  "$py" - "$@" >>"$out" <<'EOF'
import json, statistics, sys
impl, pair, threads, data = sys.argv[1:]
if impl == "ember":
    r = json.loads(data)
    med, p10 = r["ms_per_step_median"], r["ms_per_step_p10"]
else:
    ms = sorted(float(x) for x in data.split())
    med, p10 = statistics.median(ms), ms[int(0.1 * (len(ms) - 1))]
print(json.dumps(dict(impl=impl, pair=int(pair), threads=threads, ms_median=med, ms_p10=p10,
                      loadavg=open("/proc/loadavg").read().split()[:3])))
EOF
}

run_ember() { # pair threads
  local at=()
  [[ "$2" == default ]] || at=(--set "train.threads=$2")
  record ember "$1" "$2" "$("$ember" bench configs/shakespeare-char.yaml --json --steps "$iters" --warmup "$warmup" "${at[@]}")"
}

run_nanogpt() { # pair threads
  local env=() log="$scratch/nanogpt.log"
  [[ "$2" == default ]] || env=(OMP_NUM_THREADS="$2" MKL_NUM_THREADS="$2")
  (cd "$nanogpt" && env "${env[@]}" "$py" train.py config/train_shakespeare_char.py --device=cpu --compile=False \
      --eval_iters=1 --eval_interval=1000000 --log_interval=1 --block_size=64 --batch_size=12 \
      --n_layer=4 --n_head=4 --n_embd=128 --dropout=0.0 --max_iters=$((warmup + iters)) \
      --lr_decay_iters=2000 --out_dir="$scratch/out" >"$log" 2>&1) || { cat "$log" >&2; die "nanoGPT's train.py failed"; }
  local ms
  ms="$(awk -v w="$warmup" '/^iter [0-9]+:/ { it = $2 + 0; if (it >= w) for (i = 1; i <= NF; i++) if ($i == "time") { sub(/ms,?$/, "", $(i + 1)); print $(i + 1) } }' "$log")"
  [[ -n "$ms" ]] || die "no timed iterations in nanoGPT's log ($log)"
  record nanogpt "$1" "$2" "$ms"
}

echo "== shakespeare-char: $pairs pair(s) of $iters iterations (+$warmup warm-up), Ember then nanoGPT, threads: $threads_list" >&2
printf '%-8s %-5s %22s %22s %8s\n' threads pair "Ember ms (p10)" "nanoGPT ms (p10)" ratio
for ((i = 1; i <= pairs; i++)); do
  for t in "${thread_counts[@]}"; do
    run_ember "$i" "$t"
    run_nanogpt "$i" "$t"
    "$py" - "$out" "$i" "$t" <<'EOF'
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
e, n = (next(r for r in rs if r["impl"] == impl and r["pair"] == int(sys.argv[2]) and r["threads"] == sys.argv[3])
        for impl in ("ember", "nanogpt"))
print(f"{sys.argv[3]:<8} {sys.argv[2]:<5} {e['ms_median']:>13.1f} ({e['ms_p10']:>5.1f}) {n['ms_median']:>13.1f} ({n['ms_p10']:>5.1f}) {n['ms_median'] / e['ms_median']:>8.2f}")
EOF
  done
done
"$py" - "$out" <<'EOF'
import json, statistics, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
print("\nthreads | Ember ms/step median (p10) | nanoGPT ms/step median (p10) | ratio nanoGPT ÷ Ember, median (min–max) of pairs")
print("---|---|---|---")
for t in dict.fromkeys(r["threads"] for r in rs):
    by = {impl: {r["pair"]: r for r in rs if r["impl"] == impl and r["threads"] == t} for impl in ("ember", "nanogpt")}
    pairs = sorted(set(by["ember"]) & set(by["nanogpt"]))
    med = lambda impl, k: statistics.median(by[impl][p][k] for p in pairs)
    ratios = [by["nanogpt"][p]["ms_median"] / by["ember"][p]["ms_median"] for p in pairs]
    print(f"{t} | {med('ember', 'ms_median'):.1f} ({med('ember', 'ms_p10'):.1f}) | {med('nanogpt', 'ms_median'):.1f} "
          f"({med('nanogpt', 'ms_p10'):.1f}) | {statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}), {len(pairs)} pairs")
EOF
echo "raw results: $out"

#!/usr/bin/env bash
# Ember vs. a PyTorch reference of the same model, batches, loss and optimizer, side by side.
#
#   scripts/bench-vs-torch.sh CONFIG [--pairs N] [--steps N] [--warmup N] [--out FILE]
#                             [--threads N[,N...]] [--no-build] [--set KEY=VALUE]...
#
# Runs `ember bench CONFIG --json` and `scripts/reference/ember_ref.py CONFIG --bench --json`
# alternately (Ember, PyTorch, Ember, PyTorch, ... for N pairs, default 5) so that load from
# other jobs on a shared machine hits both alike, prints a row per pair (ms/step, tokens/s, peak
# RSS of each; ratio = Ember tokens/s ÷ PyTorch tokens/s) and the median ratio, and writes every
# raw JSON result, one per line, to --out (default: a new file under ${TMPDIR:-/tmp}).
# `--set` overrides go to both sides (e.g. --set train.threads=1).
# `--threads N` runs both sides at N threads (train.threads on both); a list (`--threads 1,2,4`)
# is a thread sweep: every pair runs each thread count in turn, and the end prints the scaling
# table (ms/step of each side per thread count, and the ratio). Without it each side takes its
# own default (Ember: the physical cores; PyTorch: torch's default).
#
# PyTorch lives in a virtual environment outside the repository, created on first use:
# $EMBER_TORCH_VENV, default ~/.cache/ember/torch-venv (CPU torch, pyyaml, numpy, tokenizers).
# Ember is built with `cargo build --release` into ${CARGO_TARGET_DIR:-target}.
# Not part of CI.
set -euo pipefail

die() { echo "bench-vs-torch: error: $*" >&2; exit 1; }
# The help text is the comment block at the top of this file.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit "${1:-0}"; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

config="" pairs=5 steps=30 warmup=3 out="" build=1 threads_list="default"
sets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage 0 ;;
    --pairs) [[ $# -ge 2 ]] || die "--pairs needs a number"; pairs="$2"; shift 2 ;;
    --steps) [[ $# -ge 2 ]] || die "--steps needs a number"; steps="$2"; shift 2 ;;
    --warmup) [[ $# -ge 2 ]] || die "--warmup needs a number"; warmup="$2"; shift 2 ;;
    --out) [[ $# -ge 2 ]] || die "--out needs a file name"; out="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --threads) [[ $# -ge 2 ]] || die "--threads needs a number or a list like 1,2,4"; threads_list="$2"; shift 2 ;;
    --set) [[ $# -ge 2 ]] || die "--set needs KEY=VALUE"; sets+=(--set "$2"); shift 2 ;;
    --set=*) sets+=(--set "${1#--set=}"); shift ;;
    -*) echo "bench-vs-torch: unknown option $1" >&2; usage 2 ;;
    *) [[ -z "$config" ]] || die "only one CONFIG, got '$config' and '$1'"; config="$1"; shift ;;
  esac
done
[[ -n "$config" ]] || usage 2
[[ -f "$config" ]] || die "$config: no such config file"
for v in pairs steps; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "--$v must be a positive integer, got '${!v}'"
done
[[ "$warmup" =~ ^[0-9]+$ ]] || die "--warmup must be a non-negative integer, got '$warmup'"
if [[ "$threads_list" != default ]]; then
  [[ "$threads_list" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--threads must be positive integers separated by commas, got '$threads_list'"
fi
IFS=, read -r -a thread_counts <<< "$threads_list"

# --- the PyTorch environment (outside the repository) ---------------------------------------
source scripts/torch-venv.sh   # sets $py

# --- Ember -----------------------------------------------------------------------------------
source scripts/ember-release.sh   # ember_release_binary
ember_release_binary "$build"

ref=(scripts/reference/ember_ref.py "$config" --ember "$ember" ${sets[@]+"${sets[@]}"})
table=("$py" scripts/reference/bench_table.py)

# Token ids for BPE/translation configs are prepared once here, outside any timed run, and the
# parameter counts must agree before timing means anything.
torch_params="$("$py" "${ref[@]}" --params --json | "$py" -c 'import json,sys; print(json.load(sys.stdin)["params"])')" \
  || die "the PyTorch reference cannot build this config (see above)"

if [[ -z "$out" ]]; then
  out="$(mktemp "${TMPDIR:-/tmp}/bench-vs-torch.XXXXXX")"
  mv "$out" "$out.jsonl" && out="$out.jsonl"
fi
: > "$out" || die "cannot write $out"

"$py" - "$config" "$pairs" "$steps" "$warmup" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  ${sets[@]+"${sets[@]}"} >> "$out" <<'EOF'
import json, os, platform, sys, time, torch
config, pairs, steps, warmup, commit, *sets = sys.argv[1:]
print(json.dumps(dict(kind="meta", config=config, pairs=int(pairs), steps=int(steps), warmup=int(warmup),
                      sets=[s for s in sets if s != "--set"], commit=commit, torch=torch.__version__,
                      host=platform.node(), cpus=os.cpu_count(), started=time.strftime("%Y-%m-%dT%H:%M:%S%z"))))
EOF

# Runs one side and appends its result, tagged with the pair, the thread setting and the load
# average, to $out.
run_side() {
  local impl="$1" pair="$2" threads="$3" json
  shift 3
  if ! json="$("$@")"; then
    die "$impl run of pair $pair failed: $*"
  fi
  printf '%s' "$json" | "$py" -c '
import json, sys
r = json.load(sys.stdin)
r.update(kind="bench", impl=sys.argv[1], pair=int(sys.argv[2]), threads_setting=sys.argv[3],
         loadavg=open("/proc/loadavg").read().split()[:3])
print(json.dumps(r))' "$impl" "$pair" "$threads" >> "$out" || die "$impl run of pair $pair printed no JSON"
}

echo "== $config: $pairs pair(s) of $steps timed steps (+$warmup warm-up), Ember then PyTorch, threads: $threads_list" >&2
"${table[@]}" header
for ((i = 1; i <= pairs; i++)); do
  for t in "${thread_counts[@]}"; do
    at=()
    [[ "$t" == default ]] || at=(--set "train.threads=$t")
    run_side ember "$i" "$t" "$ember" bench "$config" --json --steps "$steps" --warmup "$warmup" ${sets[@]+"${sets[@]}"} "${at[@]}"
    run_side torch "$i" "$t" "$py" "${ref[@]}" "${at[@]}" --bench --json --steps "$steps" --warmup "$warmup"
    "${table[@]}" row "$out" "$i" "$t"
  done
done
for t in "${thread_counts[@]}"; do
  [[ ${#thread_counts[@]} -eq 1 ]] || echo; [[ ${#thread_counts[@]} -eq 1 ]] || echo "-- threads: $t"
  "${table[@]}" summary "$out" "$t"
done
[[ ${#thread_counts[@]} -eq 1 ]] || { echo; "${table[@]}" scaling "$out"; }

ember_params="$("$py" -c 'import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
print(next(r["params"] for r in rs if r.get("impl") == "ember"))' "$out")"
if [[ "$ember_params" != "$torch_params" ]]; then
  echo "WARNING: parameter counts differ: Ember $ember_params, PyTorch $torch_params — the models are not the same" >&2
else
  echo "parameters: $ember_params on both sides"
fi
echo "raw results: $out"

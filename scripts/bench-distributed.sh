#!/usr/bin/env bash
# Ranks x threads, side by side: `ember bench` of one config as 1 process and as mpirun jobs.
#
#   scripts/bench-distributed.sh CONFIG [--splits 1x1,1x2,2x1] [--rounds N] [--steps N]
#                                [--warmup N] [--ember BINARY] [--out FILE] [--set KEY=VALUE]...
#
# A split RxT runs R ranks of T threads each (R = 1: one process, no mpirun). Each round runs
# every split once, in order, so that load from other tenants of a shared machine hits all of
# them alike. Prints a row per round (tokens/s of each split, and each split's ratio to the
# first), then per split the median and range over rounds of tokens/s, the ratio, ms per step,
# and for jobs the median time per step waiting for the slowest rank and summing the gradients
# (all-reduce), and the all-reduce's share of the step. Every raw `ember bench --json` result
# goes to --out (JSON lines, each with "split"). BINARY must be built with
# `--features distributed` (default: target/release/ember). Not part of CI.
set -euo pipefail
die() { echo "bench-distributed: error: $*" >&2; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit "${1:-0}"; }

[[ $# -ge 1 ]] || usage 2
config="$1"; shift
splits="1x1,1x2,2x1" rounds=3 steps=10 warmup=2 out="" ember="target/release/ember"
sets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage 0 ;;
    --splits) splits="${2:?--splits needs RxT,...}"; shift 2 ;;
    --rounds) rounds="${2:?--rounds needs a number}"; shift 2 ;;
    --steps) steps="${2:?--steps needs a number}"; shift 2 ;;
    --warmup) warmup="${2:?--warmup needs a number}"; shift 2 ;;
    --ember) ember="${2:?--ember needs a binary}"; shift 2 ;;
    --out) out="${2:?--out needs a file}"; shift 2 ;;
    --set) sets+=(--set "${2:?--set needs KEY=VALUE}"); shift 2 ;;
    *) die "unknown argument $1" ;;
  esac
done
[[ -x "$ember" ]] || die "$ember is not an executable (cargo build --release --features distributed)"
[[ -f "$config" ]] || die "$config: no such config"
IFS=, read -r -a split_list <<<"$splits"
for sp in "${split_list[@]}"; do [[ $sp =~ ^[0-9]+x[0-9]+$ ]] || die "split $sp is not RANKSxTHREADS"; done
if [[ $splits == *[2-9]x* || $splits == *[1-9][0-9]x* ]]; then
  command -v mpirun >/dev/null || die "mpirun not found (sudo scripts/mpi-local.sh)"
fi
out="${out:-$(mktemp "${TMPDIR:-/tmp}/bench-distributed.XXXXXX.jsonl")}"
: >"$out"

run() { # split
  local ranks="${1%x*}" threads="${1#*x}" cmd=()
  if ((ranks > 1)); then
    # Each rank's threads need cores of their own: no binding to one core per rank.
    cmd=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks")
  fi
  "${cmd[@]}" "$ember" bench "$config" --steps "$steps" --warmup "$warmup" --json \
      --set "train.threads=$threads" "${sets[@]}" \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); d["split"]=sys.argv[1]; print(json.dumps(d))' "$1" >>"$out"
}
for ((i = 1; i <= rounds; i++)); do
  for sp in "${split_list[@]}"; do run "$sp"; done
done

python3 - "$out" "$splits" <<'PY'
import json, sys
from statistics import median
rows = [json.loads(l) for l in open(sys.argv[1])]
splits = sys.argv[2].split(",")
by = {s: [r for r in rows if r["split"] == s] for s in splits}
n = min(len(v) for v in by.values())
base = splits[0]
print("round | " + " | ".join(f"{s} tok/s" for s in splits) + " | " + " | ".join(f"{s}/{base}" for s in splits[1:]))
for i in range(n):
    t = [by[s][i]["tokens_per_sec"] for s in splits]
    print(f"{i + 1} | " + " | ".join(f"{x:.0f}" for x in t) + " | " + " | ".join(f"{x / t[0]:.3f}" for x in t[1:]))
print()
print(f"split | tokens/s median (range) | ratio to {base} median (range) | ms/step | wait for slowest rank ms | all-reduce ms | all-reduce share of step | peak RSS MiB (all ranks)")
for s in splits:
    t = [r["tokens_per_sec"] for r in by[s][:n]]
    ratios = [by[s][i]["tokens_per_sec"] / by[base][i]["tokens_per_sec"] for i in range(n)]
    ms = median(r["ms_per_step_median"] for r in by[s][:n])
    wait = median(r.get("wait_ms", 0.0) for r in by[s][:n])
    comm = median(r.get("comm_ms", 0.0) for r in by[s][:n])
    rss = median(r["peak_rss_mib"] for r in by[s][:n])
    print(f"{s} | {median(t):.0f} ({min(t):.0f}-{max(t):.0f}) | {median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) | "
          f"{ms:.1f} | {wait:.1f} | {comm:.1f} | {100 * comm / ms:.1f}% | {rss:.0f}")
print(f"\nraw results: {sys.argv[1]}")
PY

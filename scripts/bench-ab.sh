#!/usr/bin/env bash
# Two Ember binaries (or two settings of one) side by side: `ember bench` of A and of B,
# alternated.
#
#   scripts/bench-ab.sh A_BINARY B_BINARY CONFIG [--pairs N] [--steps N] [--warmup N]
#                       [--out FILE] [--set KEY=VALUE]... [--a-set KEY=VALUE]... [--b-set KEY=VALUE]...
#
# Runs A, B, A, B, ... (N pairs, default 5) so that load from other tenants of a shared machine
# hits both alike; prints a row per pair (median and p10 ms/step of each, ratio = A ms ÷ B ms, so
# above 1 means B is faster) and the median and range of the ratios, on median and on p10 step
# times, then each side's peak RSS and heap peak (where both binaries report it) with B ÷ A.
# Every raw `ember bench --json` result goes to --out (JSON lines, each with "binary").
# `--set` overrides go to both sides (e.g. --set train.threads=2), `--a-set` and `--b-set` to one
# (the same binary twice with --b-set train.precision=bf16 compares f32 with bf16). Not part of CI.
set -euo pipefail
die() { echo "bench-ab: error: $*" >&2; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit "${1:-0}"; }

[[ $# -ge 3 ]] || usage 2
a="$1" b="$2" config="$3"; shift 3
pairs=5 steps=30 warmup=3 out=""
sets=() a_sets=() b_sets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage 0 ;;
    --pairs) pairs="${2:?--pairs needs a number}"; shift 2 ;;
    --steps) steps="${2:?--steps needs a number}"; shift 2 ;;
    --warmup) warmup="${2:?--warmup needs a number}"; shift 2 ;;
    --out) out="${2:?--out needs a file}"; shift 2 ;;
    --set) sets+=(--set "${2:?--set needs KEY=VALUE}"); shift 2 ;;
    --a-set) a_sets+=(--set "${2:?--a-set needs KEY=VALUE}"); shift 2 ;;
    --b-set) b_sets+=(--set "${2:?--b-set needs KEY=VALUE}"); shift 2 ;;
    *) die "unknown argument $1" ;;
  esac
done
for x in "$a" "$b"; do [[ -x "$x" ]] || die "$x is not an executable"; done
[[ -f "$config" ]] || die "$config: no such config"
out="${out:-$(mktemp "${TMPDIR:-/tmp}/bench-ab.XXXXXX.jsonl")}"
: >"$out"

run() { # binary label [--set KEY=VALUE]...
  local binary="$1" label="$2"; shift 2
  "$binary" bench "$config" --steps "$steps" --warmup "$warmup" --json "${sets[@]}" "$@" \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); d["binary"]=sys.argv[1]; print(json.dumps(d))' "$label" >>"$out"
}
for ((i = 1; i <= pairs; i++)); do
  run "$a" A "${a_sets[@]}"
  run "$b" B "${b_sets[@]}"
  python3 - "$out" "$i" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
a, b = rows[-2], rows[-1]
print(f"pair {sys.argv[2]}: A {a['ms_per_step_median']:.1f} ms (p10 {a['ms_per_step_p10']:.1f}) | "
      f"B {b['ms_per_step_median']:.1f} ms (p10 {b['ms_per_step_p10']:.1f}) | "
      f"A/B {a['ms_per_step_median'] / b['ms_per_step_median']:.3f}", flush=True)
PY
done
python3 - "$out" "$a" "$b" "$config" "${a_sets[*]}" "${b_sets[*]}" "${sets[*]}" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
pairs = list(zip(rows[0::2], rows[1::2]))
for key in ["ms_per_step_median", "ms_per_step_p10"]:
    r = sorted(a[key] / b[key] for a, b in pairs)
    ma = statistics.median(a[key] for a, _ in pairs); mb = statistics.median(b[key] for _, b in pairs)
    print(f"{key}: A {ma:.1f} ms, B {mb:.1f} ms; A/B median {statistics.median(r):.3f} (range {r[0]:.3f}-{r[-1]:.3f}, {len(r)} pairs)")
# Memory: the process's peak RSS and (binaries that count it) the most heap in use at once.
for key, what in [("peak_rss_mib", "peak RSS"), ("peak_heap_mib", "heap in use at most")]:
    if all(x.get(key) is not None for pair in pairs for x in pair):
        r = sorted(b[key] / a[key] for a, b in pairs)
        ma = statistics.median(a[key] for a, _ in pairs); mb = statistics.median(b[key] for _, b in pairs)
        print(f"{what}: A {ma:.0f} MiB, B {mb:.0f} MiB; B/A median {statistics.median(r):.3f} (range {r[0]:.3f}-{r[-1]:.3f})")
print(f"A = {sys.argv[2]} {sys.argv[5]}\nB = {sys.argv[3]} {sys.argv[6]}\nconfig = {sys.argv[4]} {sys.argv[7]}; raw results: {sys.argv[1]}")
PY

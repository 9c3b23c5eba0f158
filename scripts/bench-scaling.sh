#!/usr/bin/env bash
# Threads x shares: `ember bench` of one config at each thread count and share count, beside the
# PyTorch reference at the same thread count, in one run.
#
#   scripts/bench-scaling.sh CONFIG [--threads 1,2,4] [--shares 1,t] [--rounds N] [--steps N]
#                            [--warmup N] [--ember BINARY]... [--no-torch] [--out FILE]
#                            [--set KEY=VALUE]...
#
# --shares lists train.shares values; `t` means as many shares as threads, `t/2` half as many
# (at least 1). --ember may be given several times (an A/B of builds: each is labelled by its
# file name). Each round runs, for every thread count in turn, every Ember build at every share
# count and then the reference (`scripts/reference/ember_ref.py --bench`), so that load from
# other tenants of a shared machine hits all of them alike. Prints per thread count the median
# ms/step (and range over rounds) of each, and then each side's best setting and the ratio of
# the two (PyTorch ms / Ember ms). Every raw JSON result goes to --out (JSON lines, each with
# "impl", "threads", "shares" and "round").
#
# Python: $EMBER_PYTHON if set (any python3 with torch, pyyaml, numpy, tokenizers), else the
# environment of scripts/torch-venv.sh. Not part of CI.
set -euo pipefail
die() { echo "bench-scaling: error: $*" >&2; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit "${1:-0}"; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ $# -ge 1 ]] || usage 2
config="$1"; shift
[[ $config == -h || $config == --help ]] && usage 0
threads="1,2" shares="1,t" rounds=3 steps=10 warmup=2 out="" torch=1
embers=() sets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage 0 ;;
    --threads) threads="${2:?--threads needs N,N,...}"; shift 2 ;;
    --shares) shares="${2:?--shares needs N|t|t/2,...}"; shift 2 ;;
    --rounds) rounds="${2:?--rounds needs a number}"; shift 2 ;;
    --steps) steps="${2:?--steps needs a number}"; shift 2 ;;
    --warmup) warmup="${2:?--warmup needs a number}"; shift 2 ;;
    --ember) embers+=("${2:?--ember needs a binary}"); shift 2 ;;
    --no-torch) torch=0; shift ;;
    --out) out="${2:?--out needs a file}"; shift 2 ;;
    --set) sets+=(--set "${2:?--set needs KEY=VALUE}"); shift 2 ;;
    *) die "unknown argument $1" ;;
  esac
done
[[ -f "$config" ]] || die "$config: no such config"
[[ ${#embers[@]} -gt 0 ]] || embers=("$ROOT/target/release/ember")
for e in "${embers[@]}"; do [[ -x "$e" ]] || die "$e is not an executable (cargo build --release)"; done
[[ "$threads" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "--threads must be positive integers separated by commas, got '$threads'"
[[ "$shares" =~ ^([1-9][0-9]*|t|t/2)(,([1-9][0-9]*|t|t/2))*$ ]] || die "--shares must be numbers, t or t/2 separated by commas, got '$shares'"
for v in rounds steps; do [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "--$v must be a positive integer"; done
IFS=, read -r -a thread_list <<<"$threads"
IFS=, read -r -a share_list <<<"$shares"
out="${out:-$(mktemp "${TMPDIR:-/tmp}/bench-scaling.XXXXXX.jsonl")}"
: >"$out"

if [[ -n "${EMBER_PYTHON:-}" ]]; then
  py="$EMBER_PYTHON"
else
  source "$ROOT/scripts/torch-venv.sh"   # sets $py
fi

# Appends one result (JSON on stdin) to $out with its labels.
record() { # impl threads shares round
  "$py" -c '
import json, sys
r = json.load(sys.stdin)
r.update(impl=sys.argv[1], threads=int(sys.argv[2]), shares=int(sys.argv[3]), round=int(sys.argv[4]),
         loadavg=open("/proc/loadavg").read().split()[:3])
print(json.dumps(r))' "$@" >>"$out"
}

shares_at() { # spec threads
  case "$1" in
    t) echo "$2" ;;
    t/2) echo $(( $2 / 2 > 0 ? $2 / 2 : 1 )) ;;
    *) echo "$1" ;;
  esac
}

ref=("$py" "$ROOT/scripts/reference/ember_ref.py" "$config" --ember "${embers[0]}" ${sets[@]+"${sets[@]}"})
echo "== $config: $rounds round(s), threads $threads, shares $shares, $steps steps (+$warmup warm-up)" >&2
for ((i = 1; i <= rounds; i++)); do
  for t in "${thread_list[@]}"; do
    done_shares=" "
    for spec in "${share_list[@]}"; do
      s="$(shares_at "$spec" "$t")"
      [[ "$done_shares" == *" $s "* ]] && continue   # t and 1 coincide at one thread
      done_shares+="$s "
      for e in "${embers[@]}"; do
        "$e" bench "$config" --json --steps "$steps" --warmup "$warmup" ${sets[@]+"${sets[@]}"} \
            --set "train.threads=$t" --set "train.shares=$s" \
          | record "ember:$(basename "$e")" "$t" "$s" "$i" || die "ember bench failed ($e, $t threads, $s shares)"
      done
    done
    if ((torch)); then
      "${ref[@]}" --bench --json --steps "$steps" --warmup "$warmup" --set "train.threads=$t" \
        | record torch "$t" 1 "$i" || die "the reference failed at $t threads"
    fi
    echo "   round $i, $t threads done" >&2
  done
done

"$py" - "$out" <<'PY'
import json, sys
from statistics import median
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = sorted({(r["impl"], r["shares"]) for r in rows}, key=lambda k: (k[0] == "torch", k[0], k[1]))
threads = sorted({r["threads"] for r in rows})
def cell(impl, shares, t):
    ms = [r["ms_per_step_median"] for r in rows if (r["impl"], r["shares"], r["threads"]) == (impl, shares, t)]
    return (median(ms), min(ms), max(ms)) if ms else None
names = [f"{i} shares={s}" if i != "torch" else "PyTorch" for i, s in keys]
print("ms/step, median (range) over rounds")
print("threads | " + " | ".join(names))
print("|".join(["---"] * (len(names) + 1)))
best = {}
for t in threads:
    cells = []
    for k in keys:
        c = cell(*k, t)
        cells.append("" if c is None else f"{c[0]:.1f} ({c[1]:.1f}-{c[2]:.1f})")
        if c is not None:
            side = "torch" if k[0] == "torch" else k[0]
            if side not in best or c[0] < best[side][0]:
                best[side] = (c[0], t, k[1])
    print(f"{t} | " + " | ".join(cells))
print()
for side, (ms, t, s) in sorted(best.items()):
    print(f"best {side}: {ms:.1f} ms/step at {t} threads" + ("" if side == "torch" else f", {s} shares"))
if "torch" in best:
    for side, (ms, _, _) in sorted(best.items()):
        if side != "torch":
            print(f"{side} best vs PyTorch best: {best['torch'][0] / ms:.2f}x")
rss = {}
for r in rows:
    rss.setdefault((r["impl"], r["shares"], r["threads"]), []).append(r.get("peak_rss_mib", 0))
print("\npeak RSS MiB (median): " + ", ".join(f"{i} s={s} t={t}: {median(v):.0f}" for (i, s, t), v in sorted(rss.items())))
print(f"\nraw results: {sys.argv[1]}")
PY

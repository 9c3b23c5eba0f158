#!/usr/bin/env python3
"""The table scripts/gpu-check.sh prints last, from the files it wrote into OUT."""
import glob
import json
import os
import re
import statistics
import sys

out = sys.argv[1]


def load(path):
    """A JSON file, or the JSON object on its last line (after other output), or None."""
    try:
        text = open(path).read().strip()
    except OSError:
        return None
    for candidate in (text, text.splitlines()[-1] if text else ""):
        try:
            return json.loads(candidate)
        except ValueError:
            pass
    return None


def mem(path):
    try:
        return float(open(path).read().strip())
    except (OSError, ValueError):
        return float("nan")


print("\n## GPU check\n")
print(open(os.path.join(out, "gpu.txt")).read().strip())

logs = sorted(glob.glob(os.path.join(out, "suite-*.log")))
if logs:
    print("\n| GPU suite | passed | failed |\n|---|---|---|")
    for log in logs:
        text = open(log).read()
        # From cargo's "test result" lines: a test that prints (--nocapture) ends its line elsewhere.
        ok = sum(int(n) for n in re.findall(r"^test result: \w+\. (\d+) passed", text, re.M))
        failed = re.findall(r"^test (.*?) \.\.\. FAILED$", text, re.M)
        name = os.path.basename(log)[6:-4]
        print(f"| {name} | {ok} | {len(failed)}{': ' + ', '.join(failed) if failed else ''} |")

rows = []
for cfg in ("multi30k-tiny", "shakespeare-char"):
    for kernels in ("all", "nocache", "cache", "none"):
        a = load(os.path.join(out, f"counts-{cfg}-{kernels}-10.json"))
        b = load(os.path.join(out, f"counts-{cfg}-{kernels}-20.json"))
        if a and b:
            per = {k: (b["kinds"][k] - a["kinds"][k]) / 10 for k in b["kinds"]}
            rows.append((cfg, kernels, per))
if rows:
    kinds = ["launch", "htod", "dtoh", "dtod", "memcpy_other", "memset", "sync", "alloc", "other"]
    print("\n| CUDA driver calls per step | kernels | " + " | ".join(kinds) + " |")
    print("|---|---|" + "---|" * len(kinds))
    for cfg, kernels, per in rows:
        print(f"| {cfg} | {kernels} | " + " | ".join(f"{per[k]:g}" for k in kinds) + " |")
    for cfg in ("multi30k-tiny", "shakespeare-char"):
        a = load(os.path.join(out, f"counts-{cfg}-all-10.json"))
        b = load(os.path.join(out, f"counts-{cfg}-all-20.json"))
        if a and b:
            per = {n: (b["calls"].get(n, 0) - a["calls"].get(n, 0)) / 10 for n in b["calls"]}
            top = sorted(((c, n) for n, c in per.items() if c), reverse=True)[:14]
            print(f"\n{cfg}, kernels all, driver calls per step: " + ", ".join(f"{n} {c:g}" for c, n in top))
    sized = [(cfg, kernels) for cfg, kernels, _ in rows
             if "htod_bytes" in (load(os.path.join(out, f"counts-{cfg}-{kernels}-20.json")) or {})]
    if sized:
        buckets = ["le_64", "le_1k", "le_64k", "gt_64k", "total"]
        print("\n| host-to-device copies per step by size | kernels | <= 64 B | <= 1 KiB | <= 64 KiB | > 64 KiB | bytes |")
        print("|---|---|---|---|---|---|---|")
        for cfg, kernels in sized:
            a = load(os.path.join(out, f"counts-{cfg}-{kernels}-10.json"))["htod_bytes"]
            b = load(os.path.join(out, f"counts-{cfg}-{kernels}-20.json"))["htod_bytes"]
            print(f"| {cfg} | {kernels} | " + " | ".join(f"{(b[k] - a[k]) / 10:g}" for k in buckets) + " |")

benches = {}
for path in glob.glob(os.path.join(out, "bench-*-*.json")):
    impls = ("ember|ember-off|ember-nocache|ember-cache|ember-bf16-composed|ember-bf16-verified|ember-bf16|torch|"
             "torch-bf16|torch-bf16-compile")
    m = re.match(rf"bench-(.+)-({impls})-(\d+)\.json$", os.path.basename(path))
    r = load(path)
    if m and r:
        r["mem"] = mem(path[:-5] + ".mem")
        benches.setdefault((m.group(1), m.group(2)), []).append(r)
if benches:
    print("\n| config | impl | ms/step (median over pairs; min-max) | tokens/s | peak GPU MiB (nvidia-smi) | torch's own peak allocated MiB |")
    print("|---|---|---|---|---|---|")
    for cfg in ("quickstart", "multi30k-tiny", "shakespeare-char", "standard"):
        for impl in ("ember", "ember-nocache", "ember-cache", "ember-off", "torch",
                     "ember-bf16", "ember-bf16-verified", "ember-bf16-composed", "torch-bf16", "torch-bf16-compile"):
            rs = benches.get((cfg, impl))
            if not rs:
                continue
            ms = [r["ms_per_step_median"] for r in rs]
            tps = statistics.median(r["tokens_per_sec"] for r in rs)
            alloc = rs[0].get("peak_gpu_allocated_mib", "")
            alloc = f"{alloc:.0f}" if isinstance(alloc, float) else ""
            print(f"| {cfg} | {impl} | {statistics.median(ms):.2f} ({min(ms):.2f}-{max(ms):.2f}) | {tps:,.0f} | "
                  f"{max(r['mem'] for r in rs):.0f} | {alloc} |")
        for ours, theirs in (("ember", "torch"), ("ember-bf16", "torch-bf16"), ("ember-bf16", "torch-bf16-compile"),
                             ("ember-bf16", "ember-bf16-composed"), ("ember-bf16", "ember-bf16-verified")):
            e, t = benches.get((cfg, ours)), benches.get((cfg, theirs))
            if e and t:
                ratio = statistics.median(r["tokens_per_sec"] for r in e) / statistics.median(r["tokens_per_sec"] for r in t)
                print(f"| {cfg} | **{ours} ÷ {theirs} tokens/s** | **{ratio:.2f}×** | | | |")

cpu = []
for path in sorted(glob.glob(os.path.join(out, "cpu-*.json"))):
    m = re.match(r"cpu-(.+)-(\d+)-(\d+)\.json$", os.path.basename(path))
    r = load(path)
    if m and r:
        cpu.append((m.group(1), int(m.group(2)), int(m.group(3)), r))
if cpu:
    print("\n| CPU (this machine) | threads | shares | ms/step | tokens/s |\n|---|---|---|---|---|")
    for cfg, t, s, r in sorted(cpu, key=lambda x: (x[0], x[1], x[2])):
        print(f"| {cfg} | {t} | {s} | {r['ms_per_step_median']:.1f} | {r['tokens_per_sec']:,.0f} |")

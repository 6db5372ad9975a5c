#!/usr/bin/env bash
# GPU job for the views issue: a small GPT training script, unmodified, at M, MF and MFLG; its
# analyses as JSON (suggestion gains against the untraced step) and its store, brought back.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 benchmarks/workloads/gpt_lm_train.py --steps 40 2>&1 | tail -2
python3 -m xsp run --levels M,MF,MFLG --iterations 10 --warmup 5 --device cuda --out /tmp/gpt \
    -- python benchmarks/workloads/gpt_lm_train.py --steps 40 2>&1 | tail -25
python3 -m xsp analyze /tmp/gpt --json > "$OUT/gpt-analyze.json" 2> "$OUT/gpt-analyze.err"
python3 -m xsp analyze /tmp/gpt --rows 8 2>&1 | head -60
python3 - "$OUT/gpt-analyze.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("reconstruction", d["reconstruction"])
for r in d["analyses"]["suggestions"]["rows"]:
    print("suggestion", r["rule"], round(r["gain_ms_per_iteration"], 3), "ms", round(r["share_pct"], 1), "%")
PY
tar -C /tmp -czf "$OUT/gpt-store.tgz" gpt
ls -la "$OUT"

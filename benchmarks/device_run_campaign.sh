#!/usr/bin/env bash
# GPU job: one part of the default campaign on the device machine (every GPU, one job each),
# stopped after LIMIT_S seconds; a rerun resumes where it stopped. PART=i/k runs every k-th model
# from the i-th, so that each part spans the model families; PREV=DIR resumes DIR (carried).
# Back in $OUT: the job records, manifests and logs (campaign-part.tgz; span files stay behind,
# they are too large to return) and the complete stores of the KEEP models (stores.tgz).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PART=${PART:-0/1}
KEEP=${KEEP:-"torchvision-resnet50__infer__b1 transformers-bert__infer__b16"}
# ONLY: comma-separated model globs instead of a part
ONLY=${ONLY:-$(python3 - "$PART" <<'PY'
import sys, tomllib
names = tomllib.load(open("campaigns/default.toml", "rb"))["models"]["names"]
i, k = map(int, sys.argv[1].split("/"))
print(",".join(names[i::k]))
PY
)}
nvidia-smi -L > "$OUT/gpus.txt"
# PREV: a campaign directory brought back by an earlier part (carried): its jobs are skipped
if [ -n "${PREV:-}" ]; then cp -r "$PREV" /tmp/c; fi
start=$(date +%s)
# the first job alone: if it fails, say how, and run the rest without the fork server
python3 -m xsp campaign run campaigns/default.toml --out /tmp/c --only "$ONLY" --limit 1 \
    > "$OUT/first-job.log" 2>&1
if ! grep -q '"status": "ok"' /tmp/c/jobs/*.json 2>/dev/null; then
    echo "first job failed: XSP_FORK_SERVER=0 from here" | tee -a "$OUT/first-job.log"
    cat /tmp/c/runs/*/*.stderr.log >> "$OUT/first-job.log" 2>/dev/null
    export XSP_FORK_SERVER=0
fi
timeout ${LIMIT_S:-480} python3 -m xsp campaign run campaigns/default.toml --out /tmp/c \
    --only "$ONLY" ${EXTRA:-} > "$OUT/campaign.log" 2>&1
echo "campaign part $PART: $(( $(date +%s) - start )) s" | tee -a "$OUT/campaign.log"
tail -3 "$OUT/campaign.log"
tar -C /tmp -czf "$OUT/campaign-part.tgz" --exclude='*.parquet' c
(cd /tmp/c/runs && tar -czf "$OUT/stores.tgz" $(ls -d $KEEP 2>/dev/null))
ls -la "$OUT"

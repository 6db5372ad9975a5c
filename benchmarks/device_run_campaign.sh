#!/usr/bin/env bash
# GPU job: a part of the default campaign on the H200 (diverse models, all three batch sizes,
# level sets M, MF, MFLG), stopped after LIMIT_S seconds; the campaign resumes where it stopped.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ONLY=${ONLY:-"torchvision:resnet50,torchvision:mobilenet_v2,torchvision:vit_b_16,transformers:bert"}
timeout ${LIMIT_S:-200} python3 -m xsp campaign run campaigns/default.toml --out /tmp/c \
    --only "$ONLY" > "$OUT/campaign.log" 2>&1
tail -5 "$OUT/campaign.log"
python3 -m xsp campaign report /tmp/c --no-run-reports -o /tmp/c/report.html 2>&1 | tail -1
tar -C /tmp -czf "$OUT/campaign-part.tgz" c

#!/usr/bin/env bash
# GPU job for the replay issue: fresh measurements with the current capture (calibration, settling
# warm-up) of ResNet-50 b64 training (NCHW and channels_last), ResNet-50 b1 inference (launch-bound),
# the GPT LM training script and the
# known-duration workload (with its CUDA-event truth), brought back as one archive; the GPU tests.
set -u
source benchmarks/device_setup.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
gpu_tests 320
R=/tmp/replay; mkdir -p $R
xrun() { timeout "$1" python3 -m xsp run "${@:2}" 2>&1 | tail -12; }
python3 benchmarks/workloads/known_layers.py --truth $R/known-truth.json --steps 60
xrun 150 --levels M,MF,MFLG --iterations 20 --warmup 5 --device cuda --out $R/known-layers \
  -- python3 benchmarks/workloads/known_layers.py --steps 40
cp $R/known-truth.json $R/known-layers/truth.json
common="--model torchvision:resnet50 --batch-size 64 --mode train --levels M,MF,MFLG --iterations 20 --warmup 3 --device cuda"
xrun 200 $common --out $R/r50-b64-train
xrun 200 $common --channels-last --out $R/r50-b64-train-cl
xrun 200 --model torchvision:resnet50 --batch-size 1 --mode infer --levels M,MF,MFLG \
  --iterations 20 --warmup 3 --device cuda --out $R/r50-b1-infer
xrun 200 --levels M,MF,MFLG --iterations 10 --warmup 5 --device cuda --out $R/gpt-lm-train \
  -- python3 benchmarks/workloads/gpt_lm_train.py --steps 40
python3 - <<'PY'
import json, glob
for p in sorted(glob.glob("/tmp/replay/*/*/run.json")):
    m = json.load(open(p))
    print(p, m.get("status"), "warmup", m.get("warmup"), m.get("warmup_settled"), "calib", m.get("calibration"))
PY
python3 - <<'PY'
from xsp.analysis import critical_path
from xsp.analysis.replay import replay
from xsp.analysis.store import MeasurementStore
for name in ("known-layers", "r50-b64-train", "r50-b64-train-cl", "r50-b1-infer", "gpt-lm-train"):
    store = MeasurementStore(f"/tmp/replay/{name}")
    found = replay(store).summary()
    print(name, "replayed", round(found["step_ms"], 3), "M", round(found["measured_step_ms"], 3),
          "error %", round(found["error_pct"], 2), found["calibration"], found["checks"])
    print("  ", critical_path.verdict(store))
PY
tar -C $R -czf "$OUT/replay-stores.tgz" .
ls -la "$OUT"

#!/usr/bin/env bash
# GPU job 16: benchmarks/inprocess.py, every level set against the untraced loop in one process
# per case, in rounds (the host's drift cancels within a round). About 6 minutes.
source "$(dirname "$0")/device_setup.sh"
case_() {  # seconds, name, inprocess.py arguments...
  local limit=$1 name=$2; shift 2
  timeout "$limit" python3 benchmarks/inprocess.py --out "$OUT/inprocess-$name.json" "$@" 2>&1 \
    | grep -v "^\[transformers\]" | tail -14
}
case_ 110 r50-infer-b1 --case torchvision:resnet50/infer/1 --rounds 8 --iters 100 \
  --configs "none,MF,MLG,MFLG,MFLG(no correlation)"
case_ 110 r50-train-b64 --case torchvision:resnet50/train/64 --rounds 6 --iters 50 \
  --configs "none,MF,MFLG"
case_ 90 gpt-lm --case gpt-lm/train/16 --rounds 6 --iters 50 --configs "none,MF,MFLG"
case_ 70 mobilenet-b1 --case torchvision:mobilenet_v2/infer/1 --rounds 6 --iters 100 \
  --configs "none,MF,MFLG"

#!/usr/bin/env bash
# GPU job 11: MFLG with op shapes from the first measured iteration only (the default since job
# 10), against shapes in every iteration and torch.profiler; the GPU tests. About 9 minutes.
source "$(dirname "$0")/device_setup.sh"
gpu_tests 70
run 300 r50-train --rounds 3 --iters 30 --cases torchvision:resnet50/train/64 \
  --configs "none,MF(no shapes),MFLG,MFLG(shapes every iteration),torch.profiler(cpu+cuda)"
run 150 r50-infer-b1 --rounds 3 --iters 30 --cases torchvision:resnet50/infer/1 \
  --configs "none,MFLG,MFLG(no library ranges),torch.profiler(cpu+cuda)"

#!/usr/bin/env bash
# GPU job 7: the GPT LM and compiled ResNet-18 overhead cases (about 20 s per GPT process and
# 60 s per compiled one on the H200: each xsp process compiles afresh, inductor's caches off).
source "$(dirname "$0")/device_setup.sh"
run 250 gpt-lm --rounds 3 --cases gpt-lm/train/16 \
  --configs "none,MF(no shapes),MFLG,torch.profiler(cpu+cuda)"
run 300 compiled --rounds 2 --cases compiled:torchvision:resnet18/train/32 \
  --configs "none,MF(no shapes),MFLG"

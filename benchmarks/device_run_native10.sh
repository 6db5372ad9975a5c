#!/usr/bin/env bash
# GPU job 10: GPU tests after the conversion changes; batch-1 inference and the GPT LM with the
# paired step ratio; what the libraries' NVTX ranges cost ResNet-50 b64 training.
source "$(dirname "$0")/device_setup.sh"
gpu_tests 70
run 150 r50-infer-b1 --rounds 3 --iters 30 --cases torchvision:resnet50/infer/1 \
  --configs "none,MF(no shapes),MFLG,torch.profiler(cpu+cuda)"
run 140 mobilenet-b1 --rounds 3 --iters 30 --cases torchvision:mobilenet_v2/infer/1 \
  --configs "none,MF(no shapes),MFLG,torch.profiler(cpu+cuda)"
run 80 r50-train-libranges --rounds 1 --iters 30 --cases torchvision:resnet50/train/64 \
  --configs "MFLG,MFLG(no library ranges),MFLG(no shapes)"
run 105 gpt-lm --rounds 2 --iters 30 --cases gpt-lm/train/16 \
  --configs "none,MF(no shapes),MFLG,torch.profiler(cpu+cuda)"

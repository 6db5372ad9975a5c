#!/usr/bin/env bash
# GPU job 18: peak RSS of MFLG on ResNet-50 train b64 after the finish stopped giving every empty
# column its own buffer and the parquet writes got one dictionary per column. One round.
source "$(dirname "$0")/device_setup.sh"
run 200 r50-train-rss --rounds 1 --iters 30 --cases torchvision:resnet50/train/64 \
  --configs "none,MFLG"

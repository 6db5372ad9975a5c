#!/usr/bin/env bash
# GPU job: overhead of every level set against the uninstrumented step and torch.profiler, and
# peak host RSS. Level sets that use CUPTI run in their own process (NVTX routing is set there).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=${ROUNDS:-3}; I=${ITERS:-20}
python3 benchmarks/overhead.py --rounds $R --iters $I --configs "none,MLG,MFL,MFLG" \
    --out "$OUT/overhead-mflg.json" 2>&1 | tee "$OUT/overhead-mflg.txt" | grep -v "^WARNING" | tail -20
python3 benchmarks/overhead.py --rounds $R --iters $I \
    --configs "none,M,MF,MF(nvtx),torch.profiler(cpu+cuda)" \
    --out "$OUT/overhead-mf.json" 2>&1 | tee "$OUT/overhead-mf.txt" | tail -20
python3 benchmarks/overhead.py --rss --iters $I --cases torchvision:resnet50/train/64 \
    --configs "none,MFLG,torch.profiler(cpu+cuda)" --out "$OUT/rss.json" 2>&1 | tail -6

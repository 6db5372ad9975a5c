#!/usr/bin/env bash
# The 2-GPU job of the NCCL issue (needs the nvidia-h200-x2 kind): ResNet-50 DDP training, batch
# 64 per GPU, untraced and under xsp run at M, MF and MFLG; its analyses as JSON and HTML.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name --format=csv,noheader
python3 -c "from xsp.tracer.native.build import load; load()" 2>&1 | tail -1
python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/workloads/ddp_resnet50.py --steps 30 \
  2>&1 | grep "median step" | tee "$OUT/ddp-untraced.txt"
python3 -m xsp run --levels M,MF,MFLG --iterations 10 --warmup 5 --device cuda --out /tmp/ddp -- \
  python -m torch.distributed.run --nproc-per-node 2 benchmarks/workloads/ddp_resnet50.py --steps 30 \
  2>&1 | tail -20
python3 -m xsp analyze /tmp/ddp --json > "$OUT/ddp-analyze.json" 2> "$OUT/ddp-analyze.err"
python3 -m xsp analyze /tmp/ddp --rows 8 --report "$OUT/ddp-report.html" 2>&1 | tail -40
tar -C /tmp -czf "$OUT/ddp-r50-b64-nccl.tgz" ddp

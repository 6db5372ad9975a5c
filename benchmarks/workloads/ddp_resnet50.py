"""ResNet-50 data-parallel training, one process per GPU (NCCL), random weights and inputs,
unmodified by xsp: the 2-GPU workload of the NCCL issue.

    torchrun --nproc-per-node 2 benchmarks/workloads/ddp_resnet50.py --steps 30
    xsp run --levels M,MF,MFLG --iterations 10 --warmup 5 --device cuda --out runs/ddp -- \
        torchrun --nproc-per-node 2 benchmarks/workloads/ddp_resnet50.py --steps 30

Each rank prints its own median step (CUDA events around each step, from the sixth on), the
untraced figure that xsp's M run is compared with. NVLink multicast stays off: xsp run forces
NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 into every
process; run without xsp, set them yourself.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
import torch.distributed as dist
import torchvision


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64, help="per GPU")
    args = parser.parse_args()
    for name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        expected = "0" if name == "NCCL_NVLS_ENABLE" else "1"
        if os.environ.get(name) != expected:
            raise SystemExit(f"refusing to run: {name} must be {expected} (NVLink multicast off)")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda()
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(args.batch_size, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (args.batch_size,), device="cuda")
    times = []
    for _ in range(args.steps):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    rank = dist.get_rank()
    print(f"ddp_resnet50 rank {rank}: median step {statistics.median(times[5:] or times):.3f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

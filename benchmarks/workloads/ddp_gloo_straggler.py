"""A two-rank DDP training loop on the CPU (gloo) whose rank 1 computes twice as much: rank 0 waits
for it in every all-reduce. The replay's collective edges are checked on its store
(tests/data/ddp_gloo_2rank_cpu):

    xsp run --levels M,MF --iterations 20 --warmup 5 --device cpu --out runs/ddp -- \\
        python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        benchmarks/workloads/ddp_gloo_straggler.py
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40, help="training steps (warm-up included)")
parser.add_argument("--balanced", action="store_true", help="every rank the same batch: the fix")
args = parser.parse_args()
dist.init_process_group("gloo")
torch.set_num_threads(1)
torch.manual_seed(0)
layers: list[torch.nn.Module] = []
for _ in range(4):
    layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
# 4 x (256 x 256 + 256) floats in buckets of 0.3 MB: two all-reduces a step
model = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=0.3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
# rank 1: twice the work, the straggler (with --balanced, as much as rank 0)
batch = torch.randn(64 * (1 if args.balanced else 1 + dist.get_rank()), 256)
for _ in range(args.steps):
    model(batch).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
dist.barrier()  # gloo's teardown can abort a rank without it (tests/test_ranks.py's DDP_SCRIPT)
dist.destroy_process_group()

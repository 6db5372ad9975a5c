"""Mixed-precision training as people write it (random weights, random tokens), unmodified by
xsp: a small pre-norm transformer under ``torch.autocast`` with a ``GradScaler``, two micro-batches
of gradient accumulation per optimizer step, activation checkpointing of every block
(``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``), gradient clipping after
``scaler.unscale_`` and a warm-up ``LambdaLR`` schedule.

    python benchmarks/workloads/amp_accum_train.py --steps 40
    xsp run --levels M,MF,MFLG --iterations 10 --warmup 8 --device cuda --out runs/amp -- \
        python benchmarks/workloads/amp_accum_train.py --steps 40

On CUDA it autocasts to fp16 with ``torch.amp.GradScaler("cuda")`` at its default initial scale
(65536). The token losses are summed (``--reduction sum``, as fairseq-style criteria do; the
clipping bounds the update), so the first steps' scaled gradients overflow fp16 and the scaler
skips their ``optimizer.step()`` (and halves the scale), and PyTorch warns once that
``lr_scheduler.step()`` came before ``optimizer.step()``. At the CUDA sizes the largest summed
gradient (the LM head's, about 3.9) puts 2 skipped steps, perhaps 3, before the scale settles at
16384 (8192); a CPU run with fp16 autocast and the scaler enabled skips 2 at smaller sizes. With
``--reduction mean`` the gradients stay some 200 times below fp16's overflow and no step is
skipped. Skipped steps leave xsp's optimizer-step boundary nothing to find: until the first
``optimizer.step()`` (after 6 forward passes, 8 if 3 are skipped) xsp sees only forward passes,
so a ``--warmup`` of fewer forward passes takes the iterations as root-module calls (one forward
pass each; MF's run.json ``errors`` says so). On CPU it autocasts to bf16 with a disabled scaler
(no step is skipped). It prints how many optimizer steps the scaler skipped and its own median
step time over the steps after the first 5 (CUDA events around each optimizer step on CUDA,
``time.perf_counter`` on CPU).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        q, k, v = (t.view(batch, tokens, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, tokens, width))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, tokens: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(tokens, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(self.norm(x))


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = device == "cuda"
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--micro-batches", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8 if cuda else 4)
    parser.add_argument("--tokens", type=int, default=512 if cuda else 32)
    parser.add_argument("--layers", type=int, default=8 if cuda else 2)
    parser.add_argument("--width", type=int, default=768 if cuda else 64)
    parser.add_argument("--vocab", type=int, default=16384 if cuda else 512)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--reduction", choices=("sum", "mean"), default="sum")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = TinyLM(args.vocab, args.tokens, args.width, args.layers, heads=8).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / args.warmup_steps)
    )
    scaler = torch.amp.GradScaler(device, enabled=cuda)
    dtype = torch.float16 if cuda else torch.bfloat16
    micro = [
        torch.randint(0, args.vocab, (args.batch_size, args.tokens + 1), device=device)
        for _ in range(args.micro_batches)
    ]
    taken = [0]  # optimizer.step() calls the scaler made, counted without a sync

    def count_step(*_: object) -> None:
        taken[0] += 1

    optimizer.register_step_post_hook(count_step)
    times = []
    for _ in range(args.steps):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        if cuda:
            start.record()
        started = time.perf_counter()
        for ids in micro:
            with torch.autocast(device, dtype=dtype):
                logits = model(ids[:, :-1])
                loss = F.cross_entropy(
                    logits.flatten(0, 1).float(), ids[:, 1:].flatten(), reduction=args.reduction
                )
            scaler.scale(loss / args.micro_batches).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)  # skipped when the unscaled gradients hold an inf or a nan
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        if cuda:
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            times.append((time.perf_counter() - started) * 1e3)
    print(
        f"amp_accum_train: {args.steps - taken[0]} of {args.steps} optimizer steps skipped by the"
        f" GradScaler (final scale {scaler.get_scale():g})"
    )
    print(f"amp_accum_train: median step {statistics.median(times[5:] or times):.3f} ms")


if __name__ == "__main__":
    main()

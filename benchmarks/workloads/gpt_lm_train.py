"""A small GPT language-model training loop (random weights, random tokens, bf16 autocast, AdamW),
unmodified by xsp: the "small GPT training script" of the views and overhead issues.

    python benchmarks/workloads/gpt_lm_train.py --steps 40
    xsp run --levels M,MF,MFLG --iterations 10 --warmup 5 --device cuda --out runs/gpt -- \
        python benchmarks/workloads/gpt_lm_train.py --steps 40

It prints its own median step time (CUDA events around each step) so that the untraced step can
be compared with xsp's M run.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=args.layers, n_embd=args.width, n_head=8, n_positions=args.tokens, vocab_size=8192
    )
    model = GPT2LMHeadModel(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tokens = torch.randint(0, config.vocab_size, (args.batch_size, args.tokens), device=device)
    times = []
    for _ in range(args.steps):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        if device == "cuda":
            start.record()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    if times:
        print(f"gpt_lm_train: median step {statistics.median(times[5:] or times):.3f} ms")


if __name__ == "__main__":
    main()

"""A 1B-parameter Llama training step with gradient accumulation (random weights, random tokens,
bf16 autocast, AdamW), unmodified by xsp: issue 30's step of "well over 100k spans". Each
optimizer step runs ``--micro-batches`` forward and backward passes, so one iteration (xsp's
optimizer-step boundary) holds that many passes' ops, kernels and CUDA calls.

    python benchmarks/workloads/llama_accum_train.py --steps 8
    xsp run --levels M,MF,MFLG --iterations 2 --warmup 2 --device cuda --out runs/llama-accum -- \
        python benchmarks/workloads/llama_accum_train.py --steps 8

The model has the zoo's ``transformers:llama-1b`` shape (TinyLlama's, 1.03B parameters without
its LM head); ``--layers`` and ``--width`` shrink it for a CPU check. It prints its own median
step time (CUDA events around each optimizer step) to compare with xsp's M run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from xsp.tracer.workloads.names import TRANSFORMERS_SIZED


def main() -> None:
    _, shape, tokens_default = TRANSFORMERS_SIZED["llama-1b"]
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=2, help="sequences per micro-batch")
    parser.add_argument("--tokens", type=int, default=tokens_default)
    parser.add_argument("--layers", type=int, default=shape["num_hidden_layers"])
    parser.add_argument("--width", type=int, default=shape["hidden_size"])
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    scale = args.width / shape["hidden_size"]
    config = LlamaConfig(
        **{
            **shape,
            "hidden_size": args.width,
            "intermediate_size": int(shape["intermediate_size"] * scale),
            "num_hidden_layers": args.layers,
        },
        max_position_embeddings=args.tokens,
    )
    model = LlamaForCausalLM(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    micro = [
        torch.randint(0, config.vocab_size, (args.batch_size, args.tokens), device=device)
        for _ in range(args.micro_batches)
    ]
    times = []
    for _ in range(args.steps):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        if device == "cuda":
            start.record()
        for tokens in micro:
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = model(tokens, labels=tokens).loss / args.micro_batches
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    if times:
        print(f"llama_accum_train: median step {statistics.median(times[2:] or times):.3f} ms")


if __name__ == "__main__":
    main()

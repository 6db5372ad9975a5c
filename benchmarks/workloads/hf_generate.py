"""Greedy decoding with Hugging Face transformers' ``generate`` (a randomly initialized GPT-2,
random prompt ids, batch 1), unmodified by xsp: each of ``--steps`` is one ``generate()`` call of
``--max-new-tokens`` decoding steps (``min_new_tokens`` equal to it, so an end-of-text token the
random weights pick does not stop a call early).

    python benchmarks/workloads/hf_generate.py --steps 40
    xsp run --levels M,MF,MFLG --iterations 10 --warmup 5 --device cuda --out runs/gen -- \
        python benchmarks/workloads/hf_generate.py --steps 40
    xsp run --levels M,MF --iterations 10 --warmup 5 --device cuda --out runs/gen-call \
        --iteration-fn transformers.GenerationMixin.generate -- \
        python benchmarks/workloads/hf_generate.py --steps 40

Without ``--iteration-fn`` xsp's iterations are the root module's calls: one decoding step each
(the prompt's prefill is the first of a call's); with it, one whole ``generate()`` call. GPT-2
small's shape (12 layers, width 768, 50257 tokens) and 32 new tokens after a 32-token prompt on
CUDA; 2 layers of width 128, 1024 tokens and 8 new tokens after 8 on CPU. It prints its own
median time per ``generate()`` call over the calls after the first 5 (CUDA events on CUDA,
``time.perf_counter`` on CPU).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = device == "cuda"
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--layers", type=int, default=12 if cuda else 2)
    parser.add_argument("--width", type=int, default=768 if cuda else 128)
    parser.add_argument("--vocab", type=int, default=50257 if cuda else 1024)
    parser.add_argument("--prompt-tokens", type=int, default=32 if cuda else 8)
    parser.add_argument("--max-new-tokens", type=int, default=32 if cuda else 8)
    args = parser.parse_args()
    torch.manual_seed(0)
    eos = args.vocab - 1
    config = GPT2Config(
        n_layer=args.layers,
        n_embd=args.width,
        n_head=12 if args.width % 12 == 0 else 8,
        vocab_size=args.vocab,
        n_positions=max(1024, args.prompt_tokens + args.max_new_tokens),
        bos_token_id=eos,
        eos_token_id=eos,
    )
    model = GPT2LMHeadModel(config).to(device).eval()
    prompt = torch.randint(0, eos, (1, args.prompt_tokens), device=device)
    mask = torch.ones_like(prompt)
    times, new_tokens = [], 0
    with torch.inference_mode():
        for _ in range(args.steps):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            if cuda:
                start.record()
            started = time.perf_counter()
            out = model.generate(
                prompt,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=args.max_new_tokens,
                min_new_tokens=args.max_new_tokens,
                pad_token_id=eos,
            )
            if cuda:
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                times.append((time.perf_counter() - started) * 1e3)
            new_tokens = out.shape[1] - prompt.shape[1]
    print(f"hf_generate: {new_tokens} new tokens a call")
    print(f"hf_generate: median step {statistics.median(times[5:] or times):.3f} ms")


if __name__ == "__main__":
    main()

"""Two CUDA streams joined by an event, with known GPU times: the check of the replay's
cross-stream edge (a stream's wait on an event).

Each iteration, marked with ``xsp.step()``: a side stream keeps the GPU busy for ``SIDE_MS``
while the main stream does for ``MAIN_MS``; the main stream then waits for the side stream
(``wait_stream``: an event recorded on the side stream, ``cudaStreamWaitEvent`` on the main one)
and works ``TAIL_MS`` more. Untraced, a step's GPU work takes about max(SIDE, MAIN) + TAIL =
2.5 ms; a replay that left the edge out would put the tail right after the main stream's work:
max(SIDE, MAIN + TAIL) = 2.0 ms.

    xsp run --levels M,MF,MFLG --iterations 20 --warmup 5 --device cuda --out runs/two -- \
        python benchmarks/workloads/two_streams.py --steps 50
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from known_layers import cycles_per_ms

import xsp

SIDE_MS, MAIN_MS, TAIL_MS = 2.0, 1.0, 0.5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    rate = cycles_per_ms()
    side = torch.cuda.Stream()
    main_stream = torch.cuda.current_stream()
    for _ in range(args.steps):
        xsp.step()
        side.wait_stream(main_stream)  # the side's work follows this step's start
        with torch.cuda.stream(side):
            torch.cuda._sleep(int(SIDE_MS * rate))
        torch.cuda._sleep(int(MAIN_MS * rate))
        main_stream.wait_stream(side)
        torch.cuda._sleep(int(TAIL_MS * rate))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()

"""Where the end of an MFLG run goes on a GPU: the PyTorch profiler's disable, CUPTI's flush,
decoding the records, CUPTI's finalize, conversion and storage.

Runs one zoo workload under an MFLG session in this process (the NVTX and library environment
is set first, as the leveled runner does) with timers around each step, and prints them with
the number of CUPTI records decoded.

    python benchmarks/finish_cost.py [--model torchvision:resnet50] [--batch-size 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="torchvision:resnet50")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--levels", default="MFLG")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()

    from xsp.tracer.capture.levels import LevelContext, level_environment

    for key, value in level_environment(LevelContext(args.device, args.levels)).items():
        os.environ.setdefault(key, value)

    from xsp.tracer.capture.levels import cuda, framework
    from xsp.tracer.capture.session import Session
    from xsp.tracer.workloads import zoo

    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)

    def timed(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        def wrapper(*a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                seconds[label] += time.perf_counter() - start

        setattr(owner, name, wrapper)

    session_cls = cuda._CuptiSession
    original_decode = session_cls._decode

    def decode(self: Any, activities: list[Any]) -> None:
        counts["records"] += len(activities)
        counts["buffers"] += 1
        start = time.perf_counter()
        original_decode(self, activities)
        seconds["decode records"] += time.perf_counter() - start

    session_cls._decode = decode  # type: ignore[method-assign]
    timed(session_cls, "stop", "cupti stop (flush + decode)")
    timed(session_cls, "release", "cupti finalize")
    timed(session_cls, "take_ranges", "take NVTX ranges")
    timed(framework, "_disable_profiler", "torch profiler disable")
    timed(framework, "copy_nvtx_ranges", "NVTX ranges to framework records")
    timed(Session, "_finish", "session finish (all)")

    workload = zoo.build(args.model, args.batch_size, "infer", args.device)
    with tempfile.TemporaryDirectory() as out:
        session = Session(
            args.levels,
            args.iterations,
            2,
            out=Path(out) / args.levels,
            workload=args.model,
            device=args.device,
        ).start()
        while not session.done:
            with session.iteration():
                workload.step()
        meta = session.close() or {}
    result = {
        "model": args.model,
        "batch_size": args.batch_size,
        "levels": args.levels,
        "spans": meta.get("spans"),
        "counts": dict(counts),
        "seconds": {k: round(v, 4) for k, v in seconds.items()},
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

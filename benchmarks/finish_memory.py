"""What the finish (levels off to stored) adds to the traced process's resident memory.

Runs a zoo model under a level set in this process, then samples the process's resident set
every 2 ms while ``Session.close`` switches the levels off, converts and stores, and prints the
resident set before the close, the peak during it, and that peak's growth per span.

    python benchmarks/finish_memory.py [--model torchvision:resnet50] [--mode infer]
        [--batch-size 1] [--device cpu] [--levels MF] [--iterations 150]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="torchvision:resnet50")
    parser.add_argument("--mode", default="infer")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--levels", default="MF")
    parser.add_argument("--iterations", type=int, default=150)
    args = parser.parse_args()
    from xsp.tracer.capture.session import Session
    from xsp.tracer.workloads import zoo

    workload = zoo.build(args.model, args.batch_size, args.mode, args.device)
    for _ in range(3):
        workload.step()
    with tempfile.TemporaryDirectory(prefix="xsp-finish-memory-") as tmp:
        session = Session(
            args.levels,
            iterations=args.iterations,
            warmup=2,
            out=Path(tmp) / "run",
            device=args.device,
        ).start()
        while not session.done:
            with session.iteration():
                workload.step()
        samples: list[float] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                samples.append(resident_mb())
                time.sleep(0.002)

        before = resident_mb()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        began = time.perf_counter()
        meta = session.close() or {}
        took = time.perf_counter() - began
        done.set()
        sampler.join()
    peak = max([*samples, before])
    spans = int(meta.get("spans") or 0)
    result = {
        "levels": args.levels,
        "case": f"{args.model}/{args.mode}/{args.batch_size} on {args.device}",
        "status": meta.get("status"),
        "spans": spans,
        "memory_events": meta.get("memory_events"),
        "close_s": round(took, 3),
        "resident_before_mb": round(before, 1),
        "peak_during_close_mb": round(peak, 1),
        "added_mb": round(peak - before, 1),
        "added_kb_per_span": round(1024 * (peak - before) / max(spans, 1), 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

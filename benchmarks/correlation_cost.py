"""What CUPTI external correlation costs per op, apart from everything else (GPU only).

Level F with L or G pushes a CUPTI external correlation id around every op, so that each API
call names its op. This times, in one process and for each set of CUPTI activity kinds:

- ``push_pop_us``: one push and pop (through ctypes, whose own cost ``ctypes_us`` shows);
- ``add_us``: a tiny CUDA op (``x.add_(1)``), with level F's op callback on and off, and with
  the callback pushing an id (the native core's ``EXTERNAL_CORRELATION`` path) or not.

    python benchmarks/correlation_cost.py [--ops 20000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KIND_SETS = {
    "none": (),
    "EXTERNAL_CORRELATION": ("EXTERNAL_CORRELATION",),
    "RUNTIME+EC": ("RUNTIME", "EXTERNAL_CORRELATION"),
    "RUNTIME+DRIVER+EC": ("RUNTIME", "DRIVER", "EXTERNAL_CORRELATION"),
    "RUNTIME+DRIVER+MARKER+EC": ("RUNTIME", "DRIVER", "MARKER", "EXTERNAL_CORRELATION"),
    "MFLG kinds": (
        "RUNTIME",
        "DRIVER",
        "MARKER",
        "CONCURRENT_KERNEL",
        "MEMCPY",
        "MEMSET",
        "EXTERNAL_CORRELATION",
    ),
    "MFLG kinds, no EC": ("RUNTIME", "DRIVER", "MARKER", "CONCURRENT_KERNEL", "MEMCPY", "MEMSET"),
}


def _per_call_us(fn: Callable[[], None], n: int, sync: Callable[[], None]) -> float:
    rounds = []
    for _ in range(3):
        sync()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        sync()
        rounds.append((time.perf_counter_ns() - t0) / n / 1e3)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch

    from xsp.tracer.capture.cupti import POOL_BUFFERS, QUIET_API_CALLS
    from xsp.tracer.native.build import find_cupti, load

    if not torch.cuda.is_available():
        raise SystemExit("correlation_cost: needs a CUDA GPU")
    native = load()
    found = find_cupti()
    assert found is not None
    cupti = ctypes.CDLL(str(found.library))
    push, pop = (
        cupti.cuptiActivityPushExternalCorrelationId,
        cupti.cuptiActivityPopExternalCorrelationId,
    )
    push.argtypes = [ctypes.c_int, ctypes.c_uint64]
    pop.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]
    last = ctypes.c_uint64()
    custom0 = 1  # CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0
    x = torch.zeros(1, device="cuda")
    sync = torch.cuda.synchronize
    n = args.ops
    for _ in range(2000):
        x.add_(1)

    def push_pop() -> None:
        push(custom0, 7)
        pop(custom0, ctypes.byref(last))

    def two_ctypes_calls() -> None:
        cupti.cuptiGetVersion(ctypes.byref(last))
        cupti.cuptiGetVersion(ctypes.byref(last))

    def add() -> None:
        x.add_(1)

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, kinds in KIND_SETS.items():
            if kinds:
                native.cupti_start(list(kinds), 16 << 20, POOL_BUFFERS, sorted(QUIET_API_CALLS))
            row = {
                "ctypes_us": _per_call_us(two_ctypes_calls, n, lambda: None),
                "push_pop_us": _per_call_us(push_pop, n, lambda: None),
                "add_us": _per_call_us(add, n, sync),
            }
            native.arena_open(str(Path(tmp) / f"arena-{len(results)}"), 512 << 20)
            native.ops_start(False)
            row["add_with_op_callback_us"] = _per_call_us(add, n, sync)
            native.ops_stop()
            native.arena_close()
            if kinds:
                native.cupti_stop()
                native.cupti_decode()  # hand the buffers back
            results[name] = row
            print(f"{name:28s} " + "  ".join(f"{k} {v:7.3f}" for k, v in row.items()), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"ops": n, "torch": torch.__version__, **results}, indent=1))


if __name__ == "__main__":
    main()

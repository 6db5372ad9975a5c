"""Span conversion throughput and on-disk size, on one core of the dev machine.

Takes a real raw capture (tests/data/<scenario>/raw.json: one ResNet-18 training iteration),
replicates it into N iterations (shifting the clock), then times ``build_table`` (raw records ->
span table) and the parquet write, and reports spans/s and bytes per span on disk.

    python benchmarks/conversion.py [--spans 1000000] [--scenario resnet18_train_cpu]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures import from_json, load_json
from xsp.core import store
from xsp.core.records import MODULE_RANGE_PREFIX, STEP_RANGE_PREFIX
from xsp.tracer.convert.spans import build_table


def replicate(data: dict, copies: int) -> dict:
    """The fixture repeated ``copies`` times, each copy shifted past the previous one."""
    steps, fw = data["steps"], data["framework"]
    period = max(steps["end_ns"]) - min(steps["start_ns"]) + 1000
    per_copy = len(steps["iteration"])
    calls = len(fw["call_module"])
    out_steps = {key: [] for key in steps}
    out = {key: [] for key in fw if key not in ("modules", "call_output_shapes")}
    out["modules"], out["call_output_shapes"] = fw["modules"], {}
    for k in range(copies):
        shift = k * period
        out_steps["iteration"] += [k * per_copy + i for i in steps["iteration"]]
        out_steps["start_ns"] += [t + shift for t in steps["start_ns"]]
        out_steps["end_ns"] += [t + shift for t in steps["end_ns"]]
        for name in fw["name"]:
            if name.startswith(STEP_RANGE_PREFIX):
                name = f"{STEP_RANGE_PREFIX}{k * per_copy + int(name[len(STEP_RANGE_PREFIX) :])}"
            elif name.startswith(MODULE_RANGE_PREFIX):
                name = f"{MODULE_RANGE_PREFIX}{int(name[len(MODULE_RANGE_PREFIX) :]) + k * calls}"
            out["name"].append(name)
        out["start_ns"] += [t + shift for t in fw["start_ns"]]
        out["end_ns"] += [t + shift for t in fw["end_ns"]]
        for key in (
            "thread",
            "fwd_thread",
            "seq_nr",
            "input_shapes",
            "input_dtypes",
            "call_module",
            "call_input_shapes",
        ):
            out[key] += fw[key]
        for c, v in fw["call_output_shapes"].items():
            out["call_output_shapes"][str(int(c) + k * calls)] = v
    return {"meta": data["meta"], "steps": out_steps, "framework": out}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--scenario", default="resnet18_train_cpu")
    args = parser.parse_args()
    data = load_json(args.scenario)
    copies = max(1, args.spans // len(data["framework"]["name"]))
    records = from_json(replicate(data, copies))
    steps, fw, meta = records["M"], records["F"], data["meta"]
    t0 = time.perf_counter()
    table, _report = build_table("bench", "MF", {"M": steps, "F": fw})
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = store.write_span_part(Path(tmp), table)
        t2 = time.perf_counter()
        size = os.path.getsize(path)
    n = table.num_rows
    print(
        f"scenario {args.scenario} ({meta['model']} {meta['mode']} b{meta['batch_size']}), "
        f"{copies} iterations, {n} spans"
    )
    print(f"convert:          {t1 - t0:7.3f} s  {n / (t1 - t0) / 1e6:6.2f} M spans/s")
    print(f"parquet write:    {t2 - t1:7.3f} s  {n / (t2 - t1) / 1e6:6.2f} M spans/s")
    print(f"convert + write:  {t2 - t0:7.3f} s  {n / (t2 - t0) / 1e6:6.2f} M spans/s")
    print(f"on disk:          {size / n:7.2f} bytes/span ({size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()

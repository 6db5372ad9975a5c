"""Span conversion throughput and on-disk size, on one core of the dev machine.

Takes a real raw capture (tests/data/<scenario>/raw.json: one ResNet-18 training iteration),
replicates it into N iterations (shifting the clock), then times ``build_table`` (raw records ->
span table) and the parquet write, and reports spans/s and bytes per span on disk.

    python benchmarks/conversion.py [--spans 1000000] [--scenario resnet18_train_cpu]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures import load_raw
from tracer import store
from tracer.convert import build_table
from tracer.levels.framework import STEP_RANGE_PREFIX, FrameworkRecords
from tracer.levels.model import StepRecords


def replicate(
    steps: StepRecords, fw: FrameworkRecords, copies: int
) -> tuple[StepRecords, FrameworkRecords]:
    period = max(steps.end_ns) - min(steps.start_ns) + 1000
    out_steps, out = StepRecords(), copy.deepcopy(fw)
    base_calls = len(fw.call_module)
    for k in range(copies):
        shift = k * period
        for i, (s, e) in enumerate(zip(steps.start_ns, steps.end_ns, strict=False)):
            out_steps.iteration.append(k * len(steps.iteration) + i)
            out_steps.start_ns.append(s + shift)
            out_steps.end_ns.append(e + shift)
        if k == 0:
            continue
        for j, name in enumerate(fw.name):
            if name.startswith(STEP_RANGE_PREFIX):
                name = f"{STEP_RANGE_PREFIX}{k * len(steps.iteration) + int(name[len(STEP_RANGE_PREFIX) :])}"
            elif name.startswith("xsp::module::"):
                name = f"xsp::module::{int(name[13:]) + k * base_calls}"
            out.name.append(name)
            out.start_ns.append(fw.start_ns[j] + shift)
            out.end_ns.append(fw.end_ns[j] + shift)
            out.thread.append(fw.thread[j])
            out.fwd_thread.append(fw.fwd_thread[j])
            out.seq_nr.append(fw.seq_nr[j])
            out.input_shapes.append(fw.input_shapes[j])
            out.input_dtypes.append(fw.input_dtypes[j])
        out.call_module.extend(fw.call_module)
        out.call_input_shapes.extend(fw.call_input_shapes)
        for c, v in fw.call_output_shapes.items():
            out.call_output_shapes[c + k * base_calls] = v
    return out_steps, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--scenario", default="resnet18_train_cpu")
    args = parser.parse_args()
    steps, fw, meta = load_raw(args.scenario)
    copies = max(1, args.spans // len(fw.name))
    steps, fw = replicate(steps, fw, copies)
    t0 = time.perf_counter()
    table, _report = build_table("bench", "MF", steps, fw)
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

"""A step of more than 100k spans, as a 1B-parameter model's MFLG iteration has, built from the
committed ResNet-50 MFLG measurement: one iteration tiled ``--copies`` times (20: 102,501 spans)
one after the other under one step. Prints what its viewers get: the Chrome/Perfetto export's size
(bytes per span; Perfetto's UI runs out of browser memory past about 2 GB) and the trace Jaeger
gets (``xsp push``'s folding: spans sent, summaries, the time it takes).

    python benchmarks/large_trace.py [--copies 20] [--max-spans-per-trace 8192]
    python benchmarks/large_trace.py --store STORE --copies 1   # a recorded store's deepest run

With ``--store`` the iteration is the first measured one of that measurement's deepest run (the
1B-parameter model's MFLG run on the H200: ``device.sh llama-1b``), and the whole measurement's
Chrome export (``xsp export --format chrome``) is sized too.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parents[1]
R50 = ROOT / "benchmarks/data/r50-b64-train"
MFLG_RUN = 3  # run_index of MFLG in the store (M, MF, MFL, MFLG)
_GOLDEN = 0x9E3779B97F4A7C15  # spreads the copies' span ids over the 64-bit space
_GAP_NS = 1_000_000  # between copies, so no copy's GPU work overlaps the next one's


def first_iteration(root: Path = R50, run: int = MFLG_RUN) -> tuple[dict[str, Any], pa.Table]:
    """The resource and the spans of one run's first measured iteration (by default the
    committed ResNet-50 measurement's MFLG run; ``run`` -1: the deepest)."""
    from xsp.analysis.measurement.store import MeasurementStore

    store = MeasurementStore(root)
    run = run % len(store.runs)
    table = store.run_spans(run)
    first = pc.min(table.column("iteration")).as_py()
    return dict(store.runs[run].resource), table.filter(pc.equal(table.column("iteration"), first))


def tiled_iteration(iteration: pa.Table, copies: int) -> pa.Table:
    """``iteration`` (one step's spans) ``copies`` times, each after the one before, under the
    first copy's step: new span and correlation ids per copy, the step lasting to the end."""
    kinds = iteration.column("kind").cast(pa.string()).to_pylist()
    parents = iteration.column("parent_span_id").to_numpy()
    (root,) = [i for i, k in enumerate(kinds) if k == "step" and not parents[i]]
    root_id = int(iteration.column("span_id")[root].as_py())
    starts = iteration.column("start_ns").to_numpy()
    ends = starts + iteration.column("dur_ns").to_numpy()
    period = int(ends.max() - starts.min()) + _GAP_NS
    correlation = iteration.column("correlation_id")
    stride = int(pc.max(correlation).as_py() or 0) + 1
    rest = np.ones(iteration.num_rows, dtype=bool)
    rest[root] = False
    pieces = []
    for k in range(copies):
        piece = iteration if k == 0 else iteration.filter(pa.array(rest))
        shift = np.uint64((k * _GOLDEN) % 2**64)
        ids = piece.column("span_id").to_numpy() + shift
        parent = piece.column("parent_span_id").to_numpy()
        parent = np.where(parent == root_id, np.uint64(root_id), parent + shift)
        parent = np.where(piece.column("parent_span_id").to_numpy() == 0, np.uint64(0), parent)
        columns = {
            "span_id": pa.array(ids, pa.uint64()),
            "parent_span_id": pa.array(parent, pa.uint64()),
            "start_ns": pc.add(piece.column("start_ns"), k * period),
            "correlation_id": pc.add(piece.column("correlation_id"), k * stride),
        }
        for name, values in columns.items():
            piece = piece.set_column(piece.schema.get_field_index(name), name, values)
        pieces.append(piece)
    table = pa.concat_tables(pieces)
    span_ids = table.column("span_id")
    assert pc.count_distinct(span_ids).as_py() == table.num_rows, "span ids collide"
    end = pc.max(pc.add(table.column("start_ns"), table.column("dur_ns"))).as_py()
    durs = table.column("dur_ns").to_numpy().copy()
    durs[root] = end - table.column("start_ns")[root].as_py()
    return table.set_column(
        table.schema.get_field_index("dur_ns"), "dur_ns", pa.array(durs, pa.int64())
    )


def whole_measurement_export(root: Path) -> None:
    """The size of ``xsp export --format chrome`` of the whole measurement (every run)."""
    import subprocess
    import sys

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        began = time.perf_counter()
        command = [sys.executable, "-m", "xsp", "export", str(root), "--format", "chrome"]
        subprocess.run([*command, "-o", str(path)], check=True)
        took = time.perf_counter() - began
        print(
            f"xsp export --format chrome of the whole measurement: {path.stat().st_size:,} bytes, {took:.1f} s"
        )


def main() -> None:
    from xsp.tracer.export.chrome import write_chrome_trace
    from xsp.tracer.export.view import ADDED_COLUMN, DEFAULT_MAX_SPANS_PER_TRACE, for_viewer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=20)
    parser.add_argument("--max-spans-per-trace", type=int, default=DEFAULT_MAX_SPANS_PER_TRACE)
    parser.add_argument("--store", type=Path, help="a measurement: its deepest run's iteration")
    args = parser.parse_args()
    if args.store:
        resource, iteration = first_iteration(args.store, -1)
        whole_measurement_export(args.store)
    else:
        resource, iteration = first_iteration()
    table = tiled_iteration(iteration, args.copies)
    print(f"one iteration of {table.num_rows} spans ({args.copies} x {iteration.num_rows - 1} + 1)")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("trace.json", "trace.json.gz"):
            path = Path(tmp) / name
            began = time.perf_counter()
            events = write_chrome_trace(path, [(resource, table)])
            took = time.perf_counter() - began
            size = path.stat().st_size
            print(
                f"chrome export {name}: {size:,} bytes, {size / events:.1f} bytes per span "
                f"({events} spans), {took:.2f} s; 2 GB holds {2e9 / (size / events):,.0f} spans"
            )
    began = time.perf_counter()
    laid_out = for_viewer(table, args.max_spans_per_trace)
    took = time.perf_counter() - began
    added = int(pc.sum(pc.fill_null(laid_out.column(ADDED_COLUMN), False).cast(pa.int64())).as_py())
    folded = "view_folded_spans" in laid_out.column_names  # absent: within the budget, unfolded
    summaries = laid_out.num_rows - laid_out.column("view_folded_spans").null_count if folded else 0
    print(
        f"jaeger trace (budget {args.max_spans_per_trace}): {laid_out.num_rows} spans, "
        f"{laid_out.num_rows - added} stored, {added - summaries} backward layer spans, "
        f"{summaries} summaries of {table.num_rows - (laid_out.num_rows - added)} folded spans; "
        f"laid out in {took:.2f} s"
    )


if __name__ == "__main__":
    main()

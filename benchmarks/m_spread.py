"""Each M process of a measurement beside where it ran: its median step, the core it ended on,
that core's clock, the load average and its involuntary context switches (``run.json``'s
``host``), one JSON line each, then M's interval (``xsp.analysis.replay.m_interval``).

    python benchmarks/m_spread.py RUN_DIR [--label pinned]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.replay.m_interval import m_interval, steady_steps_ms
from xsp.core.store import open_run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    dirs = [args.run_dir / "M", *sorted((args.run_dir / "m-processes").glob("*/M"))]
    for number, path in enumerate(dirs, start=1):
        run = open_run(path)
        steps = steady_steps_ms(run.spans())
        host = run.document.host or {}
        print(
            json.dumps(
                {
                    "label": args.label,
                    "process": number,
                    "median_ms": round(float(np.median(steps)), 4) if len(steps) else None,
                    "started_ns": run.document.started_ns,
                    **{f"{when}_{k}": v for when, state in host.items() for k, v in state.items()},
                }
            )
        )
    found = m_interval(MeasurementStore(args.run_dir))
    print(json.dumps({"label": args.label, **(found.as_dict() if found else {})}))


if __name__ == "__main__":
    main()

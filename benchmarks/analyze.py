"""Time and peak memory of ``xsp analyze`` (reconstruction included) on a leveled measurement,
by default the committed ResNet-50 b64 training measurement from the H200 (M, MF, MFL, MFLG,
20 iterations each, 102k spans in its MFLG run). Each repeat is a fresh process, as a user runs
it; the figure to beat is Holistic Trace Analysis: 9.5 s and 346 MB for a 20-step ResNet-50
trace and four analyses on the same 2-core machine.

    python benchmarks/analyze.py [--store DIR] [--repeats 5] [--report]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_STORE = ROOT / "benchmarks" / "data" / "r50-b64-train"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", type=Path, default=DEFAULT_STORE)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--report", action="store_true", help="also write the HTML report")
    args = parser.parse_args()
    times, peaks = [], []
    for _ in range(args.repeats):
        command = [sys.executable, "-m", "xsp", "analyze", str(args.store)]
        with tempfile.TemporaryDirectory() as tmp:
            if args.report:
                command += ["--report", str(Path(tmp) / "report.html")]
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
            times.append(time.perf_counter() - start)
            peaks.append(max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before))
    print(f"xsp analyze {args.store.name}{' --report' if args.report else ''}: ")
    print(
        f"  wall median {statistics.median(times):.2f} s (min {min(times):.2f}, "
        f"max {max(times):.2f}) over {args.repeats} fresh processes; "
        f"peak RSS {max(peaks) / 1024:.0f} MB"
    )


if __name__ == "__main__":
    main()

"""What a user waits for before the ``xsp`` command line answers: ``--help``, a rejected
argument of several kinds (an unknown zoo model among them), and the store-only commands
``xsp summary`` and ``xsp analyze`` on the committed ResNet-50 b64 training measurement.

Each figure is the median of fresh processes (``python -m xsp ...``), as a user runs the
command: wall time, and CPU time (user + system), which other work on a shared machine sways
less. Give ``--tree`` twice to compare two checkouts in the same run: their processes
alternate, so a busy machine slows both alike and the ratio holds. Issue 31's goals: a
rejected argument in 0.5 s or less, ``xsp summary`` warm in 1 s or less.

    python benchmarks/cli_latency.py [--repeats 5] [--tree /work/main --tree .] [--only summary]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "benchmarks" / "data" / "r50-b64-train"
#: xsp's exit status for bad input.
BAD_INPUT = 2


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]
    exit_code: int = 0

    @property
    def rejected(self) -> bool:
        return self.exit_code == BAD_INPUT


def cases(out: Path) -> list[Case]:
    """The commands timed; ``out`` is a run directory that a rejected ``xsp run`` never makes."""
    run = ("run", "--out", str(out))
    return [
        Case("--help", ("--help",)),
        Case("run: unknown model", (*run, "--model", "torchvision:nosuch"), BAD_INPUT),
        Case("run: unknown source", (*run, "--model", "nosuch:model"), BAD_INPUT),
        Case(
            "run: bad --iterations",
            (*run, "--model", "timm:resnet50", "--iterations", "0"),
            BAD_INPUT,
        ),
        Case("run: bad --levels", (*run, "--model", "timm:resnet50", "--levels", "MX"), BAD_INPUT),
        Case("run: not a python command", (*run, "--", "ls", "-l"), BAD_INPUT),
        Case("run: unknown option", ("run", "--bogus"), BAD_INPUT),
        Case("summary: no such store", ("summary", str(out)), BAD_INPUT),
        Case("summary", ("summary", str(STORE))),
        Case("analyze", ("analyze", str(STORE))),
    ]


def time_once(tree: Path, case: Case) -> tuple[float, float]:
    """One fresh ``python -m xsp`` process of ``case`` with ``tree`` first on the path; its
    wall time and CPU time (user + system) in seconds. A case that exits otherwise than
    expected stops the benchmark."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "xsp", *case.args], env=env, cwd=tree, capture_output=True
    )  # in the tree: `python -m` puts the working directory first on the path
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != case.exit_code:
        raise SystemExit(
            f"{tree}: xsp {' '.join(case.args)} exited {done.returncode}, expected "
            f"{case.exit_code}: {done.stderr.decode(errors='replace')[-400:]}"
        )
    if case.rejected and not done.stderr.decode().lstrip().startswith(("xsp: error:", "Usage:")):
        raise SystemExit(f"{tree}: xsp {' '.join(case.args)} said no clear error: {done.stderr!r}")
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per figure")
    parser.add_argument(
        "--tree",
        type=Path,
        action="append",
        help="a checkout to time (repeatable; default: this one)",
    )
    parser.add_argument("--only", help="only the cases whose name contains this")
    args = parser.parse_args()
    trees = [t.resolve() for t in args.tree or [ROOT]]
    with tempfile.TemporaryDirectory() as tmp:
        chosen = [c for c in cases(Path(tmp) / "never") if not args.only or args.only in c.name]
        times: dict[tuple[str, Path], list[tuple[float, float]]] = {}
        for case in chosen:
            for tree in trees:  # one untimed process first: bytecode compiled, files cached
                time_once(tree, case)
            for _ in range(args.repeats):
                for tree in trees:  # alternating: the machine's load falls on every tree alike
                    times.setdefault((case.name, tree), []).append(time_once(tree, case))
    print(
        f"xsp CLI latency: median of {args.repeats} fresh processes, wall s (min-max) and "
        "CPU s (user + system: less swayed by other work on the machine)"
    )
    width = 26
    header = f"{'case':26}" + "".join(f"{str(t)[-width + 2 :]:>{width}}" for t in trees)
    print(header + ("  wall ratio  CPU ratio" if len(trees) == 2 else ""))
    print(f"{'':26}" + f"{'wall (min-max) CPU':>{width}}" * len(trees))
    for case in chosen:
        cells, walls, cpus = "", [], []
        for tree in trees:
            wall = [w for w, _ in times[case.name, tree]]
            cpu = statistics.median(c for _, c in times[case.name, tree])
            walls.append(statistics.median(wall))
            cpus.append(cpu)
            cell = f"{walls[-1]:.2f} ({min(wall):.2f}-{max(wall):.2f}) {cpu:.2f}"
            cells += f"{cell:>{width}}"
        ratio = f"{walls[1] / walls[0]:>12.2f}{cpus[1] / cpus[0]:>11.2f}" if len(trees) == 2 else ""
        print(f"{case.name:26}{cells}{ratio}")


if __name__ == "__main__":
    main()

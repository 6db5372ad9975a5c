"""A fix's gain measured inside one process: the zoo workload without and with the fix, timed in
alternating blocks (``xsp verify --in-process``).

A host-bound step moves by up to ±25% between processes with nothing changed (BERT b1 inference on
the H100: 4.5 and 6.3 ms), so paired processes cannot resolve a gain of a few percent. Inside one
process the two sides share that drift. Algorithm notes:

1. Both sides are built before either is timed. A root fix (channels_last, bf16, compile) applies
   to a second copy of the model, built from the same seed, so its weights and inputs are the
   first's. A switch (tf32, cudnn_benchmark: ``Fix.switches_only``) applies to the one model:
   each block of the fixed side runs inside ``fixes.switched``, which sets torch's switches and
   puts them back after. Fixes the measurement applied already apply to both sides alike.
2. Each side runs its warm-up steps, then ``blocks`` pairs of blocks of ``iterations`` steps
   each. The side that goes first alternates (base then fixed, then fixed then base): a drift
   that runs one way through the process weighs on both sides alike.
3. A step is timed as level M times it: a device synchronize, the clock, the step, a device
   synchronize, the clock.
4. Before the warm-up each side's first forward pass is summarized on the same inputs
   (``xsp.tracer.workloads.numerics``), each drawing its random numbers (dropout) from the
   seed, so the fix's change to the numbers is measured too.

Run as ``python -m xsp.tracer.workloads.alternating --model M --fix F ...``: it prints one JSON
object (``Alternated.record``) as the last line of its standard output.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import TypedDict

from xsp.core.errors import ConfigError
from xsp.tracer.workloads.fixes import FIXES, AppliedFixes, FixContext, switched
from xsp.tracer.workloads.numerics import Comparison

__all__ = ["DEFAULT_BLOCKS", "Alternated", "Side", "alternate", "measure_zoo", "refusal"]

#: Pairs of blocks a process times: even, so each side goes first as often.
DEFAULT_BLOCKS = 6
BASE, FIXED = "base", "fixed"


@dataclass(frozen=True)
class Side:
    """One side: its step, and what each of its blocks runs inside (torch's switches)."""

    step: Callable[[], None]
    running: Callable[[], AbstractContextManager[object]] = nullcontext


class AlternatedRecord(TypedDict):
    """``Alternated.record``: what the process prints, and ``alternated.json``."""

    steps_ms: dict[str, list[float]]
    block_order: list[str]
    numerics: Comparison | None


@dataclass
class Alternated:
    """Both sides' step times (ms) in the order they ran, the order of the blocks, and the
    first forward pass's change (``numerics.compare``) where it was summarized."""

    steps_ms: dict[str, list[float]] = field(default_factory=lambda: {BASE: [], FIXED: []})
    block_order: list[str] = field(default_factory=list)
    numerics: Comparison | None = None

    def record(self) -> AlternatedRecord:
        return AlternatedRecord(
            steps_ms=self.steps_ms, block_order=self.block_order, numerics=self.numerics
        )


def alternate(
    sides: dict[str, Side],
    blocks: int,
    iterations: int,
    warmup: int,
    sync: Callable[[], None] | None = None,
) -> Alternated:
    """Time the two sides (``BASE``, ``FIXED``) in ``blocks`` pairs of alternating blocks of
    ``iterations`` steps, after ``warmup`` steps each (module note 2)."""
    _check_blocks(blocks, iterations)
    done = Alternated()
    for name in (BASE, FIXED):
        with sides[name].running():
            for _ in range(warmup):
                sides[name].step()
    for block in range(blocks):
        order = (BASE, FIXED) if block % 2 == 0 else (FIXED, BASE)
        for name in order:
            side = sides[name]
            done.block_order.append(name)
            with side.running():
                done.steps_ms[name] += [_timed_ms(side.step, sync) for _ in range(iterations)]
    return done


def _check_blocks(blocks: int, iterations: int) -> None:
    if blocks < 1 or iterations < 1:
        raise ConfigError(f"bad blocks {blocks} or iterations {iterations}: each at least 1")


def _timed_ms(step: Callable[[], None], sync: Callable[[], None] | None) -> float:
    if sync is not None:
        sync()
    begin = time.perf_counter_ns()
    step()
    if sync is not None:
        sync()
    return (time.perf_counter_ns() - begin) / 1e6


def refusal(fix: str) -> str | None:
    """Why one process cannot run the workload with and without ``fix``, or None when it can."""
    if FIXES[fix].in_one_process:
        return None
    return f"the {fix} fix changes the process before it starts, so it cannot be switched off"


def measure_zoo(
    model: str,
    batch_size: int,
    mode: str,
    device: str,
    fix: str,
    applied: Sequence[str] = (),
    channels_last: bool = False,
    blocks: int = DEFAULT_BLOCKS,
    iterations: int = 10,
    warmup: int = 2,
) -> Alternated:
    """The zoo workload with the fixes ``applied`` on both sides, and ``fix`` on one, timed in
    alternating blocks (module notes); ConfigError where ``fix`` cannot switch in one process
    or a fix could not apply. ``channels_last`` builds the model NHWC (``xsp run
    --channels-last``)."""
    import torch

    from xsp.tracer.workloads import numerics, zoo

    why = refusal(fix)
    if why is not None:
        raise ConfigError(why)
    _check_blocks(blocks, iterations)
    shared = [name for name in applied if name != fix]
    _applied_or_raise(AppliedFixes(shared, device).apply())  # process-wide: both sides

    def copy(names: list[str]) -> zoo.Workload:
        workload = zoo.build(model, batch_size, mode, device, channels_last)
        fixes = AppliedFixes(names, device)
        fixes.attach(workload.model)  # the root parts
        _applied_or_raise(fixes)
        return workload

    base = copy(shared)
    workloads = {BASE: base, FIXED: copy([*shared, fix]) if FIXES[fix].root else base}
    sides = {
        BASE: Side(base.step),
        FIXED: Side(workloads[FIXED].step, partial(switched, fix, FixContext(device))),
    }
    outputs = {}
    on_cuda = torch.device(device).type == "cuda"
    for name, side in sides.items():
        # each probe draws from the seed, as a paired process's first forward pass does: dropout
        # masks drawn one after the other would differ between the sides by themselves
        with torch.random.fork_rng(devices=[device] if on_cuda else []), side.running():
            torch.manual_seed(0)
            with torch.no_grad():
                output = workloads[name].forward()
            outputs[name] = numerics.summarize(workloads[name].inputs, output)
    sync = partial(torch.cuda.synchronize, device) if on_cuda else None
    done = alternate(sides, blocks, iterations, warmup, sync)
    done.numerics = numerics.compare(outputs[BASE], outputs[FIXED])
    return done


def _applied_or_raise(fixes: AppliedFixes) -> None:
    """A fix that could not apply makes the comparison meaningless: its message, raised."""
    if fixes.errors:
        raise ConfigError(fixes.errors[0])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m xsp.tracer.workloads.alternating")
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--mode", default="infer")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--fix", required=True)
    parser.add_argument("--applied", action="append", default=[])
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--blocks", type=int, default=DEFAULT_BLOCKS)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    from xsp.core.errors import XspError

    try:
        done = measure_zoo(
            args.model,
            args.batch_size,
            args.mode,
            args.device,
            args.fix,
            args.applied,
            args.channels_last,
            args.blocks,
            args.iterations,
            args.warmup,
        )
    except XspError as exc:
        sys.exit(f"xsp: {exc}")
    # the workload's own prints went before: the record is the last line
    print(json.dumps(done.record()), flush=True)


if __name__ == "__main__":
    main()

"""Two measurements of one workload compared row by row: ``xsp diff BEFORE AFTER``.

Each section pairs the rows of the two measurements by structure (the step; layers by module
path; GPU activities by name; ops by their layer and name; memory by layer; critical-path causes
by cause) and gives each row ``before``, ``after``, ``change``, ``change_pct`` and a verdict.

Algorithm notes:

0. **Sections.** What is compared is the catalog's ``COMPARISONS`` (``xsp.analysis.catalog``),
   in its order: each names its rows, its unit and how to read one side's samples.
1. **Samples.** A row's figure is the median of its per-iteration values
   (``xsp.analysis.samples``): the untraced step from every complete iteration of the M run;
   everything from the G run (layers, activities, ops, causes) from the replay's steady
   iterations (``xsp.analysis.replay``), a row absent from an iteration counting 0 there; memory
   from the F run's allocator events, per iteration.
2. **Verdict.** A bootstrap of the difference of medians (``after - before``): each side's
   samples are resampled with replacement (``RESAMPLES`` times, seed ``SEED``); where the 95%
   interval of the differences excludes 0 the row is faster or slower (less or more for bytes),
   else noise. Never from two medians alone: a row needs ``MIN_SAMPLES`` iterations on each
   side, else its verdict is "untested" (a counter run counts one pass of one iteration).
3. **One side only.** A row that one measurement has and the other lacks (a transpose kernel
   that disappears, another cuDNN algorithm) says so in ``match``; its figure on the other side
   is 0 and its verdict is tested all the same.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import pyarrow as pa

from xsp.analysis.catalog import COMPARISONS, Comparison
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.samples import Samples
from xsp.core import schema
from xsp.core.errors import StoreError

__all__ = [
    "CONFIDENCE",
    "MIN_SAMPLES",
    "NOISE",
    "RESAMPLES",
    "SEED",
    "TEST",
    "UNTESTED",
    "Diff",
    "DiffJson",
    "DiffSection",
    "SectionJson",
    "bootstrap_interval",
    "compare",
    "configuration_changes",
    "diff",
    "pair_warnings",
    "require_model_run",
    "rows_json",
    "verdict",
]

#: Bootstrap resamples per row, their seed, and the interval's confidence.
RESAMPLES = 1000
SEED = 0
CONFIDENCE = 0.95
#: Fewest per-iteration samples on each side for a verdict.
MIN_SAMPLES = 2
#: The test, in the words the output gives it.
TEST = (
    f"bootstrap {CONFIDENCE:.0%} interval of the difference of medians over per-iteration "
    f"samples ({RESAMPLES:,} resamples, seed {SEED}); noise where it holds 0"
)
#: Verdict words (lower, higher) per unit.
VERDICT_WORDS = {"ms": ("faster", "slower"), "bytes": ("less", "more"), "": ("lower", "higher")}
NOISE = "noise"
UNTESTED = "untested"
BOTH, ONLY_BEFORE, ONLY_AFTER = "both", "only before", "only after"


@dataclass(frozen=True)
class DiffSection:
    """One compared section: its ``table`` has a ``label`` column named after what its rows are
    (``layer``, ``kernel``), then ``before_<unit>``, ``after_<unit>``, ``change_<unit>``,
    ``change_pct``, the interval ``ci_low_<unit>``/``ci_high_<unit>``, ``verdict`` and
    ``match``; ``absent`` says why a section has no rows."""

    key: str
    title: str
    label: str
    unit: str
    table: pa.Table
    note: str = ""
    absent: str = ""


@dataclass(frozen=True)
class Diff:
    """The comparison of two measurements: sections in the order the output lists them,
    warnings on the pair (different workloads), and what the configurations differ in."""

    before: str
    after: str
    sections: list[DiffSection]
    warnings: list[str]
    changes: list[str]
    test: str = TEST

    def section(self, key: str) -> DiffSection:
        return next(s for s in self.sections if s.key == key)


# -- the statistics --------------------------------------------------------------------------


@functools.cache
def _resample_indices(n: int, salt: int) -> np.ndarray:
    """``RESAMPLES`` x ``n`` indices drawn with replacement, the same for every row of a side
    (a fixed seed: the verdicts do not change between invocations)."""
    rng = np.random.default_rng([SEED, n, salt])
    return rng.integers(0, n, size=(RESAMPLES, n))


def bootstrap_interval(before: np.ndarray, after: np.ndarray) -> tuple[float, float] | None:
    """The ``CONFIDENCE`` interval of median(after) - median(before) by bootstrap; None with
    fewer than ``MIN_SAMPLES`` on a side."""
    if len(before) < MIN_SAMPLES or len(after) < MIN_SAMPLES:
        return None
    medians_before = np.median(before[_resample_indices(len(before), 0)], axis=1)
    medians_after = np.median(after[_resample_indices(len(after), 1)], axis=1)
    tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
    low, high = np.percentile(medians_after - medians_before, [tail, 100.0 - tail])
    return float(low), float(high)


def verdict(interval: tuple[float, float] | None, unit: str) -> str:
    """faster/slower (less/more for bytes) where the interval excludes 0, else noise."""
    if interval is None:
        return UNTESTED
    lower, higher = VERDICT_WORDS[unit]
    if interval[1] < 0:
        return lower
    if interval[0] > 0:
        return higher
    return NOISE


def compare(before: Samples, after: Samples, label: str, unit: str, scale: float) -> pa.Table:
    """One row per row of either side, largest absolute change first (see the module notes);
    values are divided by ``scale`` (ns to ms)."""
    suffix = f"_{unit}" if unit else ""
    with_calls = bool(before.calls or after.calls)
    ranked: list[tuple[tuple[float, str], dict[str, object]]] = []
    for name in sorted(set(before.values) | set(after.values)):
        b = before.values.get(name, np.zeros(before.iterations)) / scale
        a = after.values.get(name, np.zeros(after.iterations)) / scale
        b_median = float(np.median(b)) if len(b) else 0.0
        a_median = float(np.median(a)) if len(a) else 0.0
        interval = bootstrap_interval(b, a)
        change = a_median - b_median
        # the columns are named after the section's label and unit: an open record
        row: dict[str, object] = {
            label: name,
            f"before{suffix}": b_median,
            f"after{suffix}": a_median,
            f"change{suffix}": change,
            "change_pct": 100.0 * change / b_median if b_median else None,
            f"ci_low{suffix}": interval[0] if interval else None,
            f"ci_high{suffix}": interval[1] if interval else None,
            "verdict": verdict(interval, unit),
            "match": _match(name, before, after),
        }
        if with_calls:
            row["before_calls_per_iteration"] = before.calls.get(name, 0.0)
            row["after_calls_per_iteration"] = after.calls.get(name, 0.0)
        ranked.append(((-abs(change), name), row))
    rows = [row for _, row in sorted(ranked, key=lambda item: item[0])]
    return pa.Table.from_pylist(rows) if rows else pa.table({label: pa.array([], pa.string())})


def _match(name: str, before: Samples, after: Samples) -> str:
    if name not in after.values:
        return ONLY_BEFORE
    if name not in before.values:
        return ONLY_AFTER
    return BOTH


# -- the comparison --------------------------------------------------------------------------


def require_model_run(store: MeasurementStore) -> None:
    """Raise StoreError unless the measurement has an M run (the untraced step)."""
    if not any(run.levels == "M" for run in store.runs):
        found = ", ".join(run.levels for run in store.runs) or "none"
        raise StoreError(
            f"{store.root}: no M level set (the untraced step), found {found}; "
            "a diff compares untraced steps: run with --levels M,..."
        )


def has_gpu(store: MeasurementStore) -> bool:
    """True when a run of the measurement recorded GPU activities (level G)."""
    return any(run.level_set.gpu for run in store.runs)


NS_PER_MS = 1e6


def diff(before: MeasurementStore, after: MeasurementStore) -> Diff:
    """Compare two measurements of one workload (see the module notes). Raises StoreError when
    either lacks an M run; a pair of different workloads is compared with a warning."""
    for store in (before, after):
        require_model_run(store)
        store.require_spans()
    unreplayed = _why_no_replay(before) or _why_no_replay(after)
    sections = []
    for spec in COMPARISONS:
        if spec.needs_replay and unreplayed:
            sections.append(_absent(spec, unreplayed))
            continue
        b, a = spec.samples(before), spec.samples(after)
        if b is None or a is None:
            where = (
                "either measurement"
                if b is None and a is None
                else ("the before measurement" if b is None else "the after measurement")
            )
            sections.append(_absent(spec, f"none recorded in {where}"))
            continue
        scale = NS_PER_MS if spec.unit == "ms" else 1.0
        table = compare(b, a, spec.label, spec.unit, scale)
        sections.append(DiffSection(spec.key, spec.title, spec.label, spec.unit, table, spec.note))
    return Diff(
        str(before.root),
        str(after.root),
        sections,
        pair_warnings(before, after),
        configuration_changes(before, after),
    )


def _why_no_replay(store: MeasurementStore) -> str | None:
    """Why the sections from the G run and the replay cannot be filled, or None."""
    from xsp.analysis.reconstruction.distributed import is_multi_rank

    if not has_gpu(store):
        return "needs level G in both measurements"
    if is_multi_rank(store):
        return "a multi-rank measurement: the replay and its rows are single-rank"
    return None


def _absent(spec: Comparison, why: str) -> DiffSection:
    empty = pa.table({spec.label: pa.array([], pa.string())})
    return DiffSection(spec.key, spec.title, spec.label, spec.unit, empty, spec.note, why)


#: Resource attributes that describe a measurement's configuration, as the output names them.
CONFIGURATION = {
    schema.RES_WORKLOAD: "workload",
    schema.RES_MODE: "mode",
    schema.RES_BATCH_SIZE: "batch size",
    schema.RES_MEMORY_FORMAT: "memory format",
    schema.RES_DEVICE_NAME: "device",
    schema.RES_TORCH_VERSION: "torch",
    schema.RES_CUDA_VERSION: "CUDA",
}


def _configuration(store: MeasurementStore) -> dict[str, object]:
    """The measurement's configuration by the names of ``CONFIGURATION`` (None where absent)."""
    resource = (store.runs[0].meta.get("resource") or {}) if store.runs else {}
    return {name: resource.get(key) for key, name in CONFIGURATION.items()}


def configuration_changes(before: MeasurementStore, after: MeasurementStore) -> list[str]:
    """What differs between the two configurations ("memory format: contiguous ->
    channels_last")."""
    b, a = _configuration(before), _configuration(after)
    return [f"{name}: {b[name]} -> {a[name]}" for name in b if b[name] != a[name]]


def pair_warnings(before: MeasurementStore, after: MeasurementStore) -> list[str]:
    """A warning where the measurements are of different workloads (compared all the same:
    layers and ops of different models match where their names agree)."""
    b, a = _configuration(before), _configuration(after)
    if b["workload"] != a["workload"]:
        return [
            f"different workloads: {b['workload']} against {a['workload']}; rows match by "
            "name only where both have them"
        ]
    return []


class SectionJson(TypedDict):
    """One section of ``xsp diff --json``: its rows' columns are those of ``compare``."""

    title: str
    unit: str
    note: str
    absent: str | None
    rows: list[dict[str, object]]


class DiffJson(TypedDict):
    """``xsp diff --json``'s document."""

    before: str
    after: str
    test: str
    changes: list[str]
    warnings: list[str]
    sections: dict[str, SectionJson]


def _finite(value: object) -> object:
    """JSON has no NaN or infinity: None in their place."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def rows_json(result: Diff) -> DiffJson:
    """``xsp diff --json``'s document: the pair, the test, and each section's rows."""
    return {
        "before": result.before,
        "after": result.after,
        "test": result.test,
        "changes": result.changes,
        "warnings": result.warnings,
        "sections": {
            s.key: {
                "title": s.title,
                "unit": s.unit,
                "note": s.note,
                "absent": s.absent or None,
                "rows": [{k: _finite(v) for k, v in r.items()} for r in s.table.to_pylist()],
            }
            for s in result.sections
        },
    }

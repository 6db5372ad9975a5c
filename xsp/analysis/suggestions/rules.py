"""Suggestions: rules that point at evidence in a measurement and state the expected gain.

Each rule is a ``Rule`` (``rule``): a function from the store to zero or one ``Suggestion``,
with the fix that answers it and its estimate's note; ``suggest`` runs them all and returns a
table (rule, advice, evidence, gain_ms_per_iteration, share_pct, estimate). A gain is an
estimate, never a measurement (``xsp verify`` is to measure it), and ``estimate`` says its
model:

1. where a fix changes kernels (channels_last, TF32) and ``xsp estimate RUN`` timed the ops it
   changes in isolation on the measurement's device, the step replayed with those ops' times
   (``xsp.analysis.estimates``): its ``estimate`` starts "measured in isolation";
2. where a fix is an edit of the replay's graph (``xsp.analysis.replay.WhatIf``: drop the layout
   transposes, launch the whole step as one CUDA graph, take data loading off the host) and the
   replay's host times are untraced (a calibrated F run), the replayed step less the edited
   graph's replayed step;
3. otherwise the time the evidence covers on the replayed timeline, overlaps counted once: the
   most that removing it could save.

The kernel-changing rules' estimates without isolated timings start "modelled". No gain exceeds
the step; an isolated timing can find a fix slower (a negative gain).
"""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.analysis.measurement.derived import Derived
from xsp.analysis.measurement.store import (
    MeasurementStore,
    text_codes,
    text_equals,
    text_in,
    text_matches,
    texts,
)
from xsp.analysis.replay import WhatIf, replay, what_if
from xsp.analysis.replay.host_timeline import step_ranks
from xsp.analysis.suggestions.rule import Rule, Suggestion
from xsp.core.columns import numbers
from xsp.core.intervals import depths, find_rows, inherit

#: Kernels shorter than this are launch-bound candidates (launch overhead is a few µs).
SHORT_KERNEL_US = 10.0
#: Below this GPU busy share, a step with mostly short kernels waits on launches.
LAUNCH_BOUND_BUSY_PCT = 50.0
#: Waiting for batches takes at least this share of the untraced step: the input pipeline bounds it.
INPUT_BOUND_SHARE_PCT = 5.0
SYNC_CALLS = ("cudaStreamSynchronize", "cudaMemcpy", "cudaEventSynchronize")
#: Ops that do convolution and GEMM math, and of them the GEMMs.
GEMM_OPS = ("aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm")
MATMUL_OPS = ("aten::convolution", "aten::convolution_backward", *GEMM_OPS)
#: Kernel names (any case) of fp32 math on CUDA cores (cuBLAS's and cuDNN's SIMT sgemm, xmma's
#: ffma GEMMs); tensor-core kernels name theirs instead (tf32f32, bf16, f16, tensorop).
FP32_CUDA_CORE_KERNELS = "sgemm|f32f32_f32f32|ffma|simt"
#: Below this share of the untraced step, fp32 math is not worth a suggestion.
FP32_MIN_SHARE_PCT = 1.0
FP32_MODEL = (
    "modelled: the time its evidence covers on the replayed step, as if TF32 made it free "
    "(xsp estimate RUN times the ops with TF32)"
)
#: A rank is the straggler when it arrives last at this share of the collectives seen on two
#: ranks or more, and the others wait at least ``STRAGGLER_WAIT_PCT`` of the step for it.
STRAGGLER_SHARE_PCT = 60.0
STRAGGLER_WAIT_PCT = 5.0


#: Fixes the replay can try (``_replayed``): the edit, in words, is each estimate's model.
CHANNELS_LAST = WhatIf(
    "modelled: replay without the nchwToNhwc/nhwcToNchw kernels, the convolutions and batch "
    "norms unchanged (xsp estimate RUN times their NHWC kernels)",
    drop_activities=lambda spans: text_matches(
        spans.column("name"),
        lambda names: pc.match_substring_regex(names, "nchwToNhwc|nhwcToNchw", ignore_case=True),
    ),
)
CUDA_GRAPH = WhatIf(
    "replay as one CUDA graph: every activity launched at the step's start, no host work",
    drop_host=lambda spans: np.ones(spans.num_rows, dtype=bool),
    launch_at_step_start=True,
)
LOADER_WORKERS = WhatIf(
    "replay with the DataLoader's batches ready (no data loading on the host)",
    drop_host=lambda spans: text_equals(spans.column("kind"), "data_loading"),
)


def _replayed(store: MeasurementStore, found: Suggestion, edit: WhatIf) -> Suggestion:
    """``found`` with its gain from the replay of ``edit``, where the replay's host is the
    untraced one (a calibrated F run: else the tracer's own host time would hide GPU gains) and
    the job's collectives are checked on a recording (one rank, or ranks on the CPU: NCCL's
    kernels are checked on a hand-worked store only); otherwise ``found`` as it is."""
    from xsp.analysis.reconstruction import distributed
    from xsp.analysis.replay import critical_path

    if distributed.is_multi_rank(store) and critical_path.has_gpu(store):
        return found
    replayed = replay(store)
    if replayed.calibration.op_ns is None:
        return found
    step_ms = replayed.result().step_ms
    edited = what_if(store, edit)
    if step_ms is None or edited is None:
        return found
    gain = min(max(step_ms - edited, 0.0), step_ms)
    return replace(
        found,
        gain_ms_per_iteration=gain,
        share_pct=min(100.0 * gain / step_ms, 100.0),
        estimate=edit.model,
    )


def _isolated(store: MeasurementStore, found: Suggestion, fix: str) -> Suggestion | None:
    """``found`` with its gain from the fix's ops timed in isolation (``xsp estimate``), where
    they were; None otherwise."""
    from xsp.analysis.estimates import isolation_estimate

    estimate = isolation_estimate(store, fix)
    if estimate is None or not estimate.step_ms:
        return None
    gain = min(estimate.gain_ms, estimate.step_ms)
    missing = f", {estimate.missing} without a timing" if estimate.missing else ""
    return replace(
        found,
        gain_ms_per_iteration=gain,
        share_pct=100.0 * gain / estimate.step_ms,
        estimate=f"{estimate.model} ({estimate.ops_per_iteration:.0f} ops a step, "
        f"{estimate.cases} shapes{missing})",
    )


def _rebuilt(store: MeasurementStore) -> pa.Table:
    """The reconstruction, computed once per store and registered as the SQL table ``rebuilt``."""
    return _REBUILT.of(store)


def _reconstructed_spans(store: MeasurementStore) -> pa.Table:
    from xsp.analysis.reconstruction.reconstruct import reconstruct

    return reconstruct(store)[0]


def _itself(table: pa.Table) -> pa.Table:
    return table


_REBUILT = Derived("rebuilt", _reconstructed_spans, needs=("reconstruction",), view=_itself)


def _steps(store: MeasurementStore) -> tuple[int, float]:
    """(iterations, mean untraced step ms) of the reconstruction."""
    rebuilt = _rebuilt(store)  # its columns, not the table filtered (0.25 s on 1M spans)
    steps = text_equals(rebuilt.column("kind"), "step")
    total = float(numbers(rebuilt.column("dur_ns")).astype(np.int64, copy=False)[steps].sum())
    count = int(np.count_nonzero(steps))
    return max(count, 1), total / max(count, 1) / 1e6


def _covered(store: MeasurementStore, where: str) -> tuple[int, float]:
    """(reconstructed spans matching ``where``, ms per iteration they cover). Overlapping spans
    (nested ops, kernels on two streams) count once: the time covered never exceeds the step."""
    _rebuilt(store)
    found = store.sql(
        f"SELECT iteration, start_ns, start_ns + dur_ns AS end_ns FROM rebuilt WHERE ({where})"
    )
    iteration = numbers(found.column("iteration"), null=-1).astype(np.int64, copy=False)
    starts = numbers(found.column("start_ns")).astype(np.int64, copy=False)
    ends = numbers(found.column("end_ns")).astype(np.int64, copy=False)
    return _coverage(store, iteration, starts, ends)


def _coverage(
    store: MeasurementStore, iteration: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[int, float]:
    """(spans, ms per iteration they cover, overlaps once) of the spans given by their
    iteration, start and end."""
    from xsp.analysis.tables.kernels import union_length

    # one pass over the rows grouped by iteration (a mask per iteration grew with their number)
    order = np.argsort(iteration, kind="stable")
    cuts = np.flatnonzero(np.diff(iteration[order])) + 1
    covered = sum(
        union_length(s, e)
        for s, e in zip(np.split(starts[order], cuts), np.split(ends[order], cuts), strict=True)
        if len(s)
    )
    return len(iteration), covered / _steps(store)[0] / 1e6


def _costly(
    store: MeasurementStore, where: str | np.ndarray, rule: str, advice: str, what: str
) -> Suggestion | None:
    """The shared shape of most rules: reconstructed spans matching ``where`` (SQL over the
    table ``rebuilt``, or a mask of its rows) are the evidence, and the untraced step time they
    cover is the gain."""
    if isinstance(where, str):
        count, gain_ms = _covered(store, where)
    else:
        rebuilt = _rebuilt(store)
        iteration = numbers(rebuilt.column("iteration"), null=-1).astype(np.int64, copy=False)
        starts = numbers(rebuilt.column("start_ns")).astype(np.int64, copy=False)
        ends = starts + numbers(rebuilt.column("dur_ns")).astype(np.int64, copy=False)
        count, gain_ms = _coverage(store, iteration[where], starts[where], ends[where])
    if not count:
        return None
    iterations, step_ms = _steps(store)
    return Suggestion(
        rule,
        advice,
        f"{count / iterations:.0f} {what} per iteration",
        gain_ms,
        100.0 * gain_ms / step_ms if step_ms else None,
    )


def layout_transposes(store: MeasurementStore) -> Suggestion | None:
    """cuDNN converting NCHW to NHWC and back around convolutions: channels_last avoids it."""
    found = _costly(
        store,
        "kind = 'kernel' AND (name ILIKE '%nchwToNhwc%' OR name ILIKE '%nhwcToNchw%')",
        "layout-transposes",
        "use channels_last: model.to(memory_format=torch.channels_last) and the same for inputs",
        "nchwToNhwc/nhwcToNchw kernels",
    )
    if found is None:
        return None
    return _isolated(store, found, "channels_last") or _replayed(store, found, CHANNELS_LAST)


def fp32_matmuls_on_gpu(store: MeasurementStore) -> Suggestion | None:
    """fp32 convolutions and GEMMs on a GPU's CUDA cores: TF32 or AMP puts them on the tensor
    cores. The ops are those with fp32 inputs that do the math themselves: autocast's outer op,
    which has a bf16 op of its own name below it, does not. With level G, the evidence is their
    kernels that run fp32 on CUDA cores, by name (cuDNN's convolutions run TF32 by default, and
    a kernel says its math: ``tf32``, ``bf16``, ``ffma``, ``sgemm``), and the gain their GPU time.
    Without G, it is their GEMMs' host time, by PyTorch's defaults (cuDNN TF32 on, matmul off)."""
    if not any(str(r.resource.get("xsp.device", "")).startswith("cuda") for r in store.runs):
        return None
    gpu = _has(store, "gpu")
    rebuilt = _rebuilt(store)  # dtypes come from F's capture; the reconstruction fills them in
    ops = text_equals(rebuilt.column("kind"), "op")
    ops &= text_in(rebuilt.column("op_name"), MATMUL_OPS if gpu else GEMM_OPS)
    ops &= text_matches(rebuilt.column("input_dtypes"), lambda t: pc.starts_with(t, "float,"))
    # autocast's outer op runs one of its own name below it in a lower precision: not its math
    parent = _parents(rebuilt)
    op_name, _ = text_codes(rebuilt.column("op_name"))
    child = np.nonzero((parent >= 0) & (op_name >= 0))[0]
    ops[parent[child[op_name[child] == op_name[parent[child]]]]] = False
    if gpu:  # the ops and everything below them, down to their kernels
        inside = inherit(np.where(ops, 1, -1), parent, depths(parent)) > 0
        where = inside & text_equals(rebuilt.column("kind"), "kernel")
        where &= text_matches(
            rebuilt.column("name"),
            lambda t: pc.match_substring_regex(t, FP32_CUDA_CORE_KERNELS, ignore_case=True),
        )
        what = "fp32 CUDA-core kernels of convolutions and GEMMs"
    else:
        where = ops
        what = "fp32 GEMM ops"
    found = _costly(
        store,
        where,
        "fp32-on-tensor-cores",
        "enable TF32 (torch.backends.cuda.matmul.allow_tf32 / torch.backends.cudnn.allow_tf32) "
        "or autocast to bf16/fp16",
        what,
    )
    if found is None or (found.share_pct or 0.0) < FP32_MIN_SHARE_PCT:
        return None
    return _isolated(store, found, "tf32") or replace(found, estimate=FP32_MODEL)


def launch_bound(store: MeasurementStore) -> Suggestion | None:
    """Many short kernels and an idle GPU: launches, not the GPU, bound the step. Busy time is
    the union of GPU activities on the reconstructed timeline (G's durations in M's step)."""
    rebuilt = _rebuilt(store)
    kernels = numbers(rebuilt.column("dur_ns"))[text_equals(rebuilt.column("kind"), "kernel")]
    if not len(kernels):
        return None
    median_us = float(np.median(kernels)) / 1e3
    if median_us >= SHORT_KERNEL_US:
        return None
    iterations, step_ms = _steps(store)
    _, busy_ms = _covered(store, "level = 'gpu'")
    busy_pct = 100.0 * busy_ms / step_ms if step_ms else 100.0
    if busy_pct >= LAUNCH_BOUND_BUSY_PCT:
        return None
    found = Suggestion(
        "launch-bound",
        "capture the step in a CUDA graph (torch.cuda.graphs) or compile it (torch.compile)",
        f"{len(kernels) / iterations:.0f} kernels per iteration, median {median_us:.1f} µs; "
        f"the GPU is busy {busy_pct:.0f}% of the untraced step",
        max(step_ms - busy_ms, 0.0),
        100.0 - busy_pct,
        "the step's GPU idle time",
    )
    return _replayed(store, found, CUDA_GRAPH)


def host_syncs(store: MeasurementStore) -> Suggestion | None:
    """Synchronizing calls inside the step (.item(), blocking copies) stall the launch queue."""
    advice = (
        "keep values on the GPU inside the step: avoid .item(), .cpu(), printing tensors and "
        "blocking copies; read metrics every N steps"
    )
    library = _has(store, "library")
    if library:
        names = ", ".join(f"'{n}'" for n in SYNC_CALLS)
        where = f"level = 'library' AND name IN ({names})"
    else:
        where = "kind = 'op' AND op_name = 'aten::_local_scalar_dense'"
    found = _costly(store, where, "host-syncs", advice, "synchronizing calls")
    lines = _sync_lines(store, library)
    if found is None or not lines:
        return found
    shown = ", ".join(lines[:SYNC_LINES_SHOWN]) + (", ..." if len(lines) > SYNC_LINES_SHOWN else "")
    return replace(found, evidence=f"{found.evidence}, at {shown}")


#: How many of the host syncs' program lines the suggestion names.
SYNC_LINES_SHOWN = 3


def _sync_lines(store: MeasurementStore, library: bool) -> list[str]:
    """The program lines (``file:line function``) of the step's synchronizing calls, most
    frequent first, where level F recorded them (``xsp.analysis.tables.sources``)."""
    from xsp.analysis.tables.sources import line_of

    result = replay(store)
    spans = result.spans
    if library:
        level = texts(spans.column("level"))
        names = texts(spans.column("name"))
        rows = np.nonzero((level == "library") & np.isin(names, list(SYNC_CALLS)))[0]
    else:
        ops = texts(spans.column("op_name"))
        rows = np.nonzero(ops == "aten::_local_scalar_dense")[0]
    return line_of(store, rows)


def input_bound(store: MeasurementStore) -> Suggestion | None:
    """The step waits for the DataLoader's next batch: the input pipeline, not the model, sets
    the pace (PyTorch's DataLoader wraps each batch in a profiler range)."""
    found = _costly(
        store,
        "kind = 'data_loading'",
        "input-bound",
        "load batches in parallel and ahead: DataLoader(num_workers=N, pin_memory=True, "
        "persistent_workers=True, prefetch_factor=2); cache or pre-decode costly samples",
        "DataLoader batches",
    )
    if found is None or (found.share_pct or 0.0) < INPUT_BOUND_SHARE_PCT:
        return None
    return _replayed(store, found, LOADER_WORKERS)


def straggler(store: MeasurementStore) -> Suggestion | None:
    """One rank arrives last at most collectives and the others wait for it: the job runs at its
    pace. Balanced, it would run at the fastest rank's own pace (a step less its waits): the
    estimate replays the straggler's compute (its steps' outermost ops, modules, autograd nodes
    and optimizer calls) shortened by the difference between the two ranks' own times. Measured
    on the H200's host (two gloo ranks, rank 1 with twice the batch), balancing gained 1.28 ms
    a step (0.78-1.60 in 4 pairs) against 0.91 ms replayed, and 0.65 ms when the estimate only
    made rank 1's compute as fast as rank 0's."""
    from xsp.analysis.reconstruction import distributed

    if not distributed.is_multi_rank(store):
        return None
    skew = distributed.collective_skew(store)
    if not skew.num_rows:
        return None
    last = numbers(skew.column("straggler_rank"), null=-1).astype(np.int64, copy=False)
    ranks, counts = np.unique(last[last >= 0], return_counts=True)
    if not len(ranks) or 100.0 * counts.max() / skew.num_rows < STRAGGLER_SHARE_PCT:
        return None
    slow = int(ranks[np.argmax(counts)])
    summary = {row["rank"]: row for row in distributed.rank_summary(store).to_pylist()}
    others = [row for rank, row in summary.items() if rank != slow]
    wait_ms = float(np.mean([row["wait_ms_per_iteration"] or 0.0 for row in others]))
    _, step_ms = _steps(store)
    if not step_ms or 100.0 * wait_ms / step_ms < STRAGGLER_WAIT_PCT:
        return None
    result = replay(store)
    spans = result.spans
    outer = _outer_compute(spans)
    compute = _rank_compute_ms(spans, outer)
    own = result.own_steps_ms()
    if slow not in compute or slow not in own:
        return None  # no framework spans: nothing to say what it computes
    fastest = min(own, key=lambda rank: own[rank])
    found = Suggestion(
        "straggler",
        f"balance the ranks: rank {slow} sets the pace; give it a smaller share of the batch or "
        "the data, or move its other host work (logging, checkpoints, evaluation) off it",
        f"rank {slow} arrives last at {int(counts.max())} of {skew.num_rows} collectives; the "
        f"other ranks wait {wait_ms:.3f} ms a step for it; its compute (as traced) takes "
        f"{compute[slow]:.3f} ms a step against rank {fastest}'s {compute.get(fastest, 0.0):.3f}",
        min(wait_ms, step_ms),
        min(100.0 * wait_ms / step_ms, 100.0),
        "the other ranks' wait for it",
    )
    # balanced, the job runs at the fastest rank's own pace: the straggler's own time (its
    # step less its waits) goes down to that rank's, out of its compute
    replayed_compute = _rank_compute_ms(spans, outer, result.dur_ns).get(slow, 0.0)
    cut = own[slow] - own[fastest]
    if cut <= 0 or replayed_compute <= 0:
        return found
    share = max(1.0 - cut / replayed_compute, 0.0)
    edit = WhatIf(
        f"rank {slow}'s own time a step ({own[slow]:.3f} ms, its replayed step less its waits) "
        f"cut to rank {fastest}'s ({own[fastest]:.3f} ms) out of its compute ({share:.2f} of "
        "it kept)",
        keep_host=lambda spans: np.where(outer & (step_ranks(spans) == slow), share, 1.0),
    )
    return _replayed(store, found, edit)


def _outer_compute(spans: pa.Table) -> np.ndarray:
    """The framework spans right under a rank's step that compute (ops, modules, autograd
    nodes, optimizer calls): the rank's compute, each nanosecond once."""
    from xsp.analysis.reconstruction.distributed import COMPUTE_KINDS

    parent = _parents(spans)
    kind = texts(spans.column("kind"))
    under_step = (parent >= 0) & (kind[np.maximum(parent, 0)] == "step")
    return under_step & np.isin(kind, COMPUTE_KINDS)


def _rank_compute_ms(
    spans: pa.Table, outer: np.ndarray, dur: np.ndarray | None = None
) -> dict[int, float]:
    """Each rank's median compute a step (ms; ``outer``: its compute spans), from the deep
    run's own durations, or from ``dur`` (the replay's)."""
    ranks = step_ranks(spans)
    iteration = numbers(spans.column("iteration"), null=-1).astype(np.int64, copy=False)
    if dur is None:
        dur = numbers(spans.column("dur_ns")).astype(np.int64, copy=False)
    out = {}
    for rank in sorted(set(ranks[ranks >= 0].tolist())):
        rows = np.nonzero(outer & (ranks == rank))[0]
        if not len(rows):
            continue
        per_step = np.bincount(iteration[rows] - iteration[rows].min(), weights=dur[rows])
        out[rank] = float(np.median(per_step[per_step > 0])) / 1e6
    return out


def index_select(store: MeasurementStore) -> Suggestion | None:
    """aten::index with one 1-D index tensor does what the cheaper aten::index_select does."""
    return _costly(
        store,
        "kind = 'op' AND op_name = 'aten::index'",
        "index-select",
        "index one dimension with tensor.index_select(dim, idx) instead of tensor[idx]",
        "aten::index calls",
    )


def _parents(spans: pa.Table) -> np.ndarray:
    """Each row's parent row in the reconstruction (-1: a root): its span ids are structural
    keys, one per span of the measurement, so a parent's id names one row."""
    ids = numbers(spans.column("span_id")).astype(np.uint64, copy=False)
    up = numbers(spans.column("parent_span_id"), null=0).astype(np.uint64, copy=False)
    return np.where(up != 0, find_rows(ids, up), -1)


def _has(store: MeasurementStore, level: str) -> bool:
    rows = store.sql(f"SELECT count(*) AS n FROM spans WHERE level = '{level}'")
    return bool(rows.column("n")[0].as_py())


#: Every rule, in the order they are asked; the fixes are ``xsp.tracer.workloads.fixes``'.
RULES = (
    Rule(
        "layout-transposes",
        layout_transposes,
        fix="channels_last",
        estimate_note="the estimate drops the transpose kernels only; channels_last also "
        "changes the convolution and batch-norm kernels (NHWC ones), which the replay keeps "
        "(xsp estimate RUN times them)",
    ),
    Rule(
        "fp32-on-tensor-cores",
        fp32_matmuls_on_gpu,
        fix="tf32",
        estimate_note="the estimate is the fp32 kernels' whole time; TF32 makes them "
        "faster, not free",
    ),
    Rule(
        "launch-bound",
        launch_bound,
        fix="cuda_graphs",
        estimate_note="the estimate replays the whole step as one CUDA graph with no host work; "
        "reduce-overhead graphs the compiled model only (the optimizer, the loss and the loop's "
        "own host work stay), and falls back to launching each kernel where a graph cannot be "
        "captured",
    ),
    Rule("host-syncs", host_syncs),
    Rule(
        "input-bound",
        input_bound,
        fix="dataloader",
        estimate_note="the estimate takes all loading off the step; W workers take off about "
        "(1 - 1/W) of it while loading outweighs the step's own work",
    ),
    Rule("index-select", index_select),
    Rule("straggler", straggler),
)
#: The rules by name.
RULES_BY_NAME = {rule.name: rule for rule in RULES}

_SCHEMA = pa.schema(
    [
        ("rule", pa.string()),
        ("advice", pa.string()),
        ("evidence", pa.string()),
        ("gain_ms_per_iteration", pa.float64()),
        ("share_pct", pa.float64()),
        ("estimate", pa.string()),
    ]
)


def suggest(store: MeasurementStore) -> pa.Table:
    """Every rule that fires, largest expected gain first."""
    found = [s for rule in RULES if (s := rule.evaluate(store)) is not None]
    found.sort(key=lambda s: -(s.gain_ms_per_iteration or 0.0))
    return pa.Table.from_pylist([asdict(s) for s in found], schema=_SCHEMA)


__all__ = [
    "CHANNELS_LAST",
    "CUDA_GRAPH",
    "GEMM_OPS",
    "INPUT_BOUND_SHARE_PCT",
    "LAUNCH_BOUND_BUSY_PCT",
    "LOADER_WORKERS",
    "MATMUL_OPS",
    "RULES",
    "RULES_BY_NAME",
    "SHORT_KERNEL_US",
    "STRAGGLER_SHARE_PCT",
    "STRAGGLER_WAIT_PCT",
    "SYNC_CALLS",
    "SYNC_LINES_SHOWN",
    "Rule",
    "Suggestion",
    "fp32_matmuls_on_gpu",
    "host_syncs",
    "index_select",
    "input_bound",
    "launch_bound",
    "layout_transposes",
    "straggler",
    "suggest",
]

"""Suggestions: rules that point at evidence in a measurement and state the expected gain.

Each rule is a function from the store to zero or one ``Suggestion``; ``suggest`` runs them all
and returns a table (rule, advice, evidence, gain_ms_per_iteration, share_pct). A gain is what
the evidence costs today per iteration, the most that removing it can save.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import pyarrow as pa

from analysis.store import MeasurementStore

#: Kernels shorter than this are launch-bound candidates (launch overhead is a few µs).
SHORT_KERNEL_US = 10.0
#: Below this GPU busy share, a step with mostly short kernels waits on launches.
LAUNCH_BOUND_BUSY_PCT = 50.0
SYNC_CALLS = ("cudaStreamSynchronize", "cudaMemcpy", "cudaEventSynchronize")


@dataclass(frozen=True)
class Suggestion:
    rule: str
    advice: str
    evidence: str
    gain_ms_per_iteration: float | None
    share_pct: float | None


def _steps(store: MeasurementStore, run: str) -> tuple[int, float]:
    """(iterations, total step ms) of a run, asked once per store."""
    key = ("steps", run)
    if key not in store.memo:
        row = store.sql(
            f"SELECT count(*) AS n, sum(dur_ns) / 1e6 AS ms FROM spans "
            f"WHERE run_index = {run} AND kind = 'step'"
        ).to_pylist()[0]
        store.memo[key] = (max(int(row["n"] or 0), 1), float(row["ms"] or 0.0))
    return store.memo[key]


def _iterations(store: MeasurementStore, run: str) -> int:
    return _steps(store, run)[0]


def _step_ms(store: MeasurementStore, run: str) -> float:
    return _steps(store, run)[1]


_GPU_RUN = "(SELECT max(run_index) FROM spans WHERE level = 'gpu')"
_FW_RUN = "(SELECT max(run_index) FROM spans WHERE level = 'framework')"
_LIB_RUN = "(SELECT max(run_index) FROM spans WHERE level = 'library')"


def _costly(
    store: MeasurementStore, run: str, where: str, rule: str, advice: str, what: str
) -> Suggestion | None:
    """The shared shape of most rules: spans of ``run`` matching ``where`` are the evidence, and
    their time per iteration is the gain."""
    found = store.sql(
        f"SELECT count(*) AS n, coalesce(sum(dur_ns), 0) / 1e6 AS ms FROM spans "
        f"WHERE run_index = {run} AND ({where})"
    ).to_pylist()[0]
    if not found["n"]:
        return None
    iterations, step_ms = _iterations(store, run), _step_ms(store, run)
    return Suggestion(
        rule,
        advice,
        f"{found['n'] / iterations:.0f} {what} per iteration",
        found["ms"] / iterations,
        100.0 * found["ms"] / step_ms if step_ms else None,
    )


def layout_transposes(store: MeasurementStore) -> Suggestion | None:
    """cuDNN converting NCHW to NHWC and back around convolutions: channels_last avoids it."""
    return _costly(
        store,
        _GPU_RUN,
        "kind = 'kernel' AND (name ILIKE '%nchwToNhwc%' OR name ILIKE '%nhwcToNchw%')",
        "layout-transposes",
        "use channels_last: model.to(memory_format=torch.channels_last) and the same for inputs",
        "nchwToNhwc/nhwcToNchw kernels",
    )


def fp32_matmuls_on_gpu(store: MeasurementStore) -> Suggestion | None:
    """fp32 convolutions and GEMMs on a GPU: TF32 or AMP puts them on the tensor cores."""
    if not any(str(r.resource.get("xsp.device", "")).startswith("cuda") for r in store.runs):
        return None
    # dtypes come from Kineto's capture (MF); NVTX-captured framework runs (MFLG) carry none
    typed_run = (
        "(SELECT min(run_index) FROM spans WHERE level = 'framework' AND input_dtypes IS NOT NULL)"
    )
    return _costly(
        store,
        typed_run,
        "kind = 'op' AND op_name IN ('aten::convolution', 'aten::addmm', 'aten::mm', 'aten::bmm') "
        "AND input_dtypes LIKE 'float,%'",
        "fp32-on-tensor-cores",
        "enable TF32 (torch.backends.cuda.matmul.allow_tf32 / torch.backends.cudnn.allow_tf32) "
        "or autocast to bf16/fp16",
        "fp32 convolution/GEMM ops",
    )


def launch_bound(store: MeasurementStore) -> Suggestion | None:
    """Many short kernels and an idle GPU: launches, not the GPU, bound the step."""
    from analysis.kernels import temporal_breakdown

    stats = store.sql(
        f"""SELECT count(*) AS n, median(dur_ns) / 1e3 AS median_us FROM spans
            WHERE run_index = {_GPU_RUN} AND kind = 'kernel'"""
    ).to_pylist()[0]
    if not stats["n"] or stats["median_us"] is None or stats["median_us"] >= SHORT_KERNEL_US:
        return None
    breakdown = temporal_breakdown(store).to_pylist()
    busy = sum(r["busy_pct"] for r in breakdown) / max(len(breakdown), 1)
    if busy >= LAUNCH_BOUND_BUSY_PCT:
        return None
    idle_ms = sum(r["gpu_idle_ms"] for r in breakdown) / max(len(breakdown), 1)
    iterations = _iterations(store, _GPU_RUN)
    return Suggestion(
        "launch-bound",
        "capture the step in a CUDA graph (torch.cuda.graphs) or compile it (torch.compile)",
        f"{stats['n'] / iterations:.0f} kernels per iteration, median {stats['median_us']:.1f} µs; "
        f"the GPU is busy {busy:.0f}% of the step",
        idle_ms,
        100.0 - busy,
    )


def host_syncs(store: MeasurementStore) -> Suggestion | None:
    """Synchronizing calls inside the step (.item(), blocking copies) stall the launch queue."""
    advice = (
        "keep values on the GPU inside the step: avoid .item(), .cpu(), printing tensors and "
        "blocking copies; read metrics every N steps"
    )
    if _has(store, "library"):
        names = ", ".join(f"'{n}'" for n in SYNC_CALLS)
        where = f"level = 'library' AND name IN ({names})"
        return _costly(store, _LIB_RUN, where, "host-syncs", advice, "synchronizing calls")
    where = "kind = 'op' AND op_name = 'aten::_local_scalar_dense'"
    return _costly(store, _FW_RUN, where, "host-syncs", advice, "synchronizing calls")


def index_select(store: MeasurementStore) -> Suggestion | None:
    """aten::index with one 1-D index tensor does what the cheaper aten::index_select does."""
    return _costly(
        store,
        _FW_RUN,
        "kind = 'op' AND op_name = 'aten::index'",
        "index-select",
        "index one dimension with tensor.index_select(dim, idx) instead of tensor[idx]",
        "aten::index calls",
    )


def _has(store: MeasurementStore, level: str) -> bool:
    rows = store.sql(f"SELECT count(*) AS n FROM spans WHERE level = '{level}'")
    return bool(rows.column("n")[0].as_py())


RULES: tuple[Callable[[MeasurementStore], Suggestion | None], ...] = (
    layout_transposes,
    fp32_matmuls_on_gpu,
    launch_bound,
    host_syncs,
    index_select,
)

_SCHEMA = pa.schema(
    [
        ("rule", pa.string()),
        ("advice", pa.string()),
        ("evidence", pa.string()),
        ("gain_ms_per_iteration", pa.float64()),
        ("share_pct", pa.float64()),
    ]
)


def suggest(store: MeasurementStore) -> pa.Table:
    """Every rule that fires, largest expected gain first."""
    found = [s for rule in RULES if (s := rule(store)) is not None]
    found.sort(key=lambda s: -(s.gain_ms_per_iteration or 0.0))
    return pa.Table.from_pylist([asdict(s) for s in found], schema=_SCHEMA)

"""The replay across ranks (issue 25, "collectives, where ranks exist"): a collective on a rank
completes once every rank has arrived, plus its own transfer (``xsp.analysis.replay.collectives``).
Worked out by hand on a two-rank gloo store."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.test_ranks import framework_ranks, write_two_ranks
from xsp.core import schema

# Rank 0: mm, then the all-reduce call at 3,000 ns; gloo's work starts at 3,050 and waits for
# rank 1 (arrives 5,000 ns): a 1,950 ns wait, then a 1,000 ns transfer ending at 6,000; the add
# that reads the result runs 6,000-6,500; the step ends 100 ns later. Rank 1: mm 1,600-5,000,
# call at 5,000, gloo 5,050-6,050 (no wait: a 1,000 ns transfer), add 6,050-6,550, end 6,650.
EVENTS = {
    0: [
        ("xsp::step::0", 1000, 6600, 1, "[]", ""),
        ("aten::mm", 1100, 3000, 1, "[[4,4],[4,4]]", "float,float"),
        ("c10d::allreduce_", 3000, 3050, 1, "[[],[],[]]", "TensorList,,"),
        ("gloo:all_reduce", 3050, 6000, 2, "[[1000]]", "float"),
        ("aten::add", 6000, 6500, 1, "[[4],[4]]", "float,float"),
    ],
    1: [
        ("xsp::step::0", 1500, 6650, 1, "[]", ""),
        ("aten::mm", 1600, 5000, 1, "[[4,4],[4,4]]", "float,float"),
        ("c10d::allreduce_", 5000, 5050, 1, "[[],[],[]]", "TensorList,,"),
        ("gloo:all_reduce", 5050, 6050, 2, "[[1000]]", "float"),
        ("aten::add", 6050, 6550, 1, "[[4],[4]]", "float,float"),
    ],
}
#: M measured what MF did: rank 0 5,600 ns, rank 1 5,150 ns.
M_STEPS = {0: (10_000, 15_600), 1: (10_200, 15_350)}


def _on_rank(spans: pa.Table, rank: int, value: str, column: str = "name") -> np.ndarray:
    """The rows of ``spans`` on ``rank`` whose ``column`` holds ``value``."""
    held = np.asarray(spans.column(column).to_pylist(), dtype=object) == value
    return held & (np.asarray(spans.column("rank").fill_null(-1).to_pylist()) == rank)


#: The spans of rank 1's mm (1,600-5,000 ns), for the what-ifs.
rank_1_mm = partial(_on_rank, rank=1, value="aten::mm")


def _measurement(root: Path) -> Path:
    return write_two_ranks(root, M_STEPS, "MF", framework_ranks(EVENTS))


def test_rank_0_waits_for_rank_1_in_the_all_reduce(tmp_path: Path) -> None:
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.replay import replay

    summary = replay(MeasurementStore(_measurement(tmp_path))).summary()
    # completion = last arrival 5,000 + 1,000 (rank 0) / rank 1's own start 5,050 + 1,000
    assert [r["replayed_ms"] for r in summary["iterations"]] == pytest.approx([0.0056, 0.00515])
    assert summary["collective_waits"] == [
        {"iteration": 0, "rank": 0, "wait_ns": 1950},
        {"iteration": 0, "rank": 1, "wait_ns": 0},
    ]


def test_dropping_rank_1s_slow_op_shortens_rank_0s_step(tmp_path: Path) -> None:
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.replay import WhatIf, replay_with

    measurement = MeasurementStore(_measurement(tmp_path))

    edited = replay_with(measurement, WhatIf("rank 1's mm takes no time", drop_host=rank_1_mm))
    # rank 1 arrives at 1,600 (its gloo at 1,650); rank 0 arrives last, at 3,000: rank 0
    # completes at max(3,000, 3,050) + 1,000 = 4,050, its add ends 4,550, its step 4,650 - 1,000;
    # rank 1 completes at max(3,000, 1,650) + 1,000 = 4,000, add to 4,500, step 4,600 - 1,500
    assert edited.steps.column("replayed_ms").to_pylist() == pytest.approx([0.00365, 0.0031])


def test_a_span_that_keeps_half_its_time_moves_what_follows_by_the_other_half(
    tmp_path: Path,
) -> None:
    """Rank 1's mm (1,600-5,000) keeping half its time: rank 1 calls at 3,300 and arrives last;
    rank 0 completes at 3,300 + 1,000, its add ends 4,800 and its step 3,900 ns; rank 1's gloo
    starts at 3,350 and completes 4,350, its step 3,450 ns."""
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.replay import WhatIf, replay_with

    edit = WhatIf(
        "rank 1's mm twice as fast", keep_host=lambda spans: np.where(rank_1_mm(spans), 0.5, 1.0)
    )
    edited = replay_with(MeasurementStore(_measurement(tmp_path)), edit)
    assert edited.steps.column("replayed_ms").to_pylist() == pytest.approx([0.0039, 0.00345])


def test_a_negative_cut_grows_a_zero_length_span_and_delays_what_follows(
    tmp_path: Path,
) -> None:
    """A fix that makes the host slower cuts a negative time (``cut_host_ns``): a span of no
    length grows by it too (as a share of its time it could not). Rank 1's zero-length op at
    1,550 ns growing 2,000 ns: it ends at 3,550, its mm runs 3,600-7,000 and it calls at 7,000,
    arriving last; rank 0's all-reduce completes at 8,000, its add ends 8,500 and its step
    7,600 ns; rank 1's gloo 7,050-8,050, its add to 8,550, its step 7,150 ns."""
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.replay import WhatIf, replay_with

    events = {
        0: EVENTS[0],
        1: [*EVENTS[1][:1], ("aten::empty", 1550, 1550, 1, "[]", ""), *EVENTS[1][1:]],
    }
    measurement = MeasurementStore(
        write_two_ranks(tmp_path, M_STEPS, "MF", framework_ranks(events))
    )
    empty_1 = partial(_on_rank, rank=1, value="aten::empty")
    plain = replay_with(measurement)
    assert plain.steps.column("replayed_ms").to_pylist() == pytest.approx([0.0056, 0.00515])
    edit = WhatIf(
        "rank 1's empty 2 µs slower", cut_host_ns=lambda s: np.where(empty_1(s), -2000.0, 0.0)
    )
    edited = replay_with(measurement, edit)
    assert edited.steps.column("replayed_ms").to_pylist() == pytest.approx([0.0076, 0.00715])
    (row,) = np.nonzero(empty_1(edited.spans))[0]
    assert (edited.start_ns[row], edited.dur_ns[row]) == (1550, 2000)


def test_a_what_if_on_one_rank_leaves_the_other_ranks_own_times(tmp_path: Path) -> None:
    """The ranks of an iteration share one clock: cutting rank 1's mm (1,600-5,000 ns) takes
    3,400 ns off rank 1's host timeline and none off rank 0's, whose mm (1,100-3,000) ran over
    the same time (cut from every step, it lost 1,400 ns of its 1,900). Rank 1's add then
    starts 2,050 ns earlier, not 3,400: its all-reduce now waits for rank 0, which arrives at
    3,000, and ends 1,000 ns later, at 4,000 (was 6,050)."""
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.replay import WhatIf, replay_with

    measurement = MeasurementStore(_measurement(tmp_path))

    plain = replay_with(measurement)
    edited = replay_with(measurement, WhatIf("rank 1's mm takes no time", drop_host=rank_1_mm))
    (mm_0,) = np.nonzero(_on_rank(plain.spans, 0, "aten::mm"))[0]
    (add_1,) = np.nonzero(_on_rank(plain.spans, 1, "aten::add"))[0]
    assert (edited.start_ns[mm_0], edited.dur_ns[mm_0]) == (plain.start_ns[mm_0], 1900)
    assert (plain.start_ns[add_1], edited.start_ns[add_1]) == (6050, 4000)


def test_each_rank_takes_only_its_own_records_cost_off_its_times(tmp_path: Path) -> None:
    """Each rank's process paid for its own F records: at 100 ns a record (half at its start,
    half at its end), rank 1's add ends at 6,200 ns, 350 ns earlier (its mm, its call, its gloo
    range and its own start before it), not at 5,800 (with rank 0's four records too, which ran
    over the same time on the shared clock)."""
    from xsp.analysis.measurement.matching import keyed
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.replay.host_timeline import Calibration, host_timeline

    measurement = MeasurementStore(_measurement(tmp_path))
    deep_index, _, end, _ = host_timeline(measurement, Calibration(100.0, 100.0, "a test"))
    deep, _, _ = keyed(measurement, deep_index)
    (add_0,) = np.nonzero(_on_rank(deep, 0, "aten::add"))[0]
    (add_1,) = np.nonzero(_on_rank(deep, 1, "aten::add"))[0]
    assert (int(end[add_0]), int(end[add_1])) == (6150, 6200)


def test_each_ranks_step_is_set_against_its_own_m_step(tmp_path: Path) -> None:
    """M measured 5,600 ns on rank 0 and 5,150 on rank 1 in iteration 0: each rank's replayed
    step is set against its own, and M's median is over both (5,375 ns). Keyed by iteration
    alone, rank 1's step had overwritten rank 0's (both read 5,150 ns)."""
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.replay import replay

    summary = replay(MeasurementStore(_measurement(tmp_path))).summary()
    rows = summary["iterations"]
    assert [r["measured_ms"] for r in rows] == pytest.approx([0.0056, 0.00515])
    assert summary["measured_step_ms"] == pytest.approx(0.005375)


#: A real two-rank gloo DDP job on the dev machine's CPU (benchmarks/workloads/ddp_gloo_straggler.py,
#: M,MF, 20 iterations): rank 1 computes twice as much, so rank 0 waits in both all-reduces.
GLOO = Path(__file__).parent / "data" / "ddp_gloo_2rank_cpu"


def test_a_real_gloo_job_replayed_without_the_tracers_cost_is_its_own_measurement() -> None:
    """With no cost taken off the host, the replay of each rank's 20 steps is MF's own, to the
    nanosecond, its collectives linked: 2 all-reduces a step, each seen on both ranks, and 64
    host waits for them. (Before the steps ended at their markers, each replayed step was
    30-460 µs long by what the optimizer's range, and in one step a gloo range, outlasted it.)"""
    from dataclasses import replace

    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.replay import STEPS_ONLY, fitted_graph, replay_with
    from xsp.analysis.replay.host_timeline import Calibration, host_timeline

    measurement = MeasurementStore(GLOO)
    graph = fitted_graph(measurement)
    found = graph.collectives
    assert (len(found.work), len(set(found.group.tolist())), int((found.group < 0).sum())) == (
        80,
        40,
        0,
    )
    assert sum(len(waits) for waits in found.waits.values()) == 64
    _, start, end, _ = host_timeline(measurement, Calibration(0.0, 0.0, "no cost"))
    steps = replay_with(
        measurement, STEPS_ONLY, replace(graph, warped_start=start, warped_end=end)
    ).steps
    assert steps.num_rows == 40
    assert steps.column("replayed_ms").to_pylist() == steps.column("deep_ms").to_pylist()


def test_a_real_gloo_jobs_replayed_iterations_lie_end_to_end_its_ranks_as_measured() -> None:
    """The replayed iterations follow one another as the untraced job runs them: each starts
    where the one before it ended (its last rank's step), so a timeline tool counts no time
    between them; within an iteration the ranks keep the offsets they started at in the deep
    run (rank 0 618,440 ns after rank 1 in iteration 0, 384,542 ns before it in iteration 1),
    as the whole iteration moves, and the reconstruction's iteration spans cover their ranks'
    steps."""
    from xsp.analysis.measurement.store import MeasurementStore, texts
    from xsp.analysis.reconstruction.reconstruct import reconstruct
    from xsp.analysis.replay import replay
    from xsp.analysis.replay.host_timeline import step_ranks

    measurement = MeasurementStore(GLOO)
    found = replay(measurement)
    steps = np.nonzero(texts(found.spans.column("kind")) == "step")[0]
    iteration = np.asarray(found.spans.column("iteration").to_pylist())[steps]
    rank = step_ranks(found.spans)[steps]
    deep_start = np.asarray(found.spans.column("start_ns").to_pylist())[steps]
    start, end = found.start_ns[steps], found.start_ns[steps] + found.dur_ns[steps]
    begins, ends = [], []
    for it in range(20):
        mine = iteration == it
        assert sorted(rank[mine].tolist()) == [0, 1]
        offsets = start[mine] - start[mine].min()
        assert offsets.tolist() == (deep_start[mine] - deep_start[mine].min()).tolist()
        begins.append(int(start[mine].min()))
        ends.append(int(end[mine].max()))
    assert begins[1:] == ends[:-1]
    assert begins[0] == int(deep_start[iteration == 0].min())  # the first stays where it ran
    assert (start[(iteration == 0) & (rank == 0)] - begins[0]).tolist() == [618_440]
    assert (start[(iteration == 1) & (rank == 1)] - begins[1]).tolist() == [384_542]

    spans = reconstruct(measurement)[0]
    roots = spans.filter(pc.equal(spans.column("kind"), "iteration")).sort_by("iteration")
    assert roots.column("start_ns").to_pylist() == begins
    assert pc.add(roots.column("start_ns"), roots.column("dur_ns")).to_pylist() == ends


def test_in_a_real_gloo_job_the_straggler_holds_up_the_other_rank() -> None:
    """Rank 0 waits for rank 1 a median 1.483 ms a step, rank 1 for nobody. Were rank 1's backward
    free, rank 0's median step would fall from 5.891 to 5.346 ms (it waits less) and rank 1's
    only from 5.710 to 4.830 ms (it now waits for rank 0): each rank replayed alone, rank 1's
    fell to 4.261 ms."""
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.replay import WhatIf, replay, replay_with

    measurement = MeasurementStore(GLOO)
    plain = replay(measurement)
    # to a nanosecond or two: the tracer's cost taken off the host's times is a float
    waits = plain.summary()["median_collective_wait_ms"]
    assert waits == pytest.approx({0: 1.483037, 1: 0.0}, abs=2e-6)

    rank_1_backward = partial(_on_rank, rank=1, value="backward", column="kind")
    edited = replay_with(
        measurement, WhatIf("rank 1's backward takes no time", drop_host=rank_1_backward)
    )
    step_rank = np.asarray(plain.spans.column("rank").fill_null(-1).to_pylist())[
        np.nonzero(np.asarray(plain.spans.column("kind").to_pylist(), dtype=object) == "step")[0]
    ]

    def median(result, rank):  # type: ignore[no-untyped-def]
        return float(np.median(np.asarray(result.steps.column("replayed_ms"))[step_rank == rank]))

    assert (median(plain, 0), median(edited, 0)) == pytest.approx((5.891, 5.346), abs=1e-3)
    assert (median(plain, 1), median(edited, 1)) == pytest.approx((5.710, 4.830), abs=1e-3)


def test_a_gloo_jobs_critical_path_charges_communication_where_a_thread_waited() -> None:
    """Gloo's work range covers the backward it runs beside on its own thread; only where a
    thread waited for it (DDP's reducer after backward, for the straggler and the transfer) is
    its time communication: 61% of the dev machine's critical path, the rest the host's (with
    the ranges covering every piece they spanned, 69%); 32-79% in one iteration or another. It
    was recorded before interleaving, with M in one process: unchecked."""
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.replay import critical_path

    assert critical_path.verdict(MeasurementStore(GLOO)) == (
        "unchecked: communication-bound: 61% communication (32-79% across 20 iterations), 39% "
        "host work of the step's critical path"
    )


# Two ranks of a G run with NCCL, worked out by hand (no machine with two GPUs was lent to record
# one). On each rank an op launches a GEMM on stream 7, then c10d's all-reduce launches NCCL's
# kernel behind it, and a device sync closes the step. Rank 0's GEMM ends at 2,400 and its NCCL
# kernel spins from 2,400 until rank 1's starts at 4,400 (a 2,000 ns wait), then transfers for
# 1,000 ns; rank 1's GEMM runs 1,900-4,400. Each sync returns 50 ns after the GPU is done and
# each step ends 50 ns later: rank 0's step 1,000-5,500, rank 1's 1,500-5,500.
NCCL_RANKS = {
    0: {
        "step": (1000, 5500),
        "mm": (1100, 2000),
        "gemm_launch": (1200, 1300),
        "gemm": (1400, 2400),
        "call": (2000, 2200),
        "nccl_launch": (2050, 2150),
        "nccl": (2400, 5400),
        "sync": (2300, 5450),
    },
    1: {
        "step": (1500, 5500),
        "mm": (1600, 3800),
        "gemm_launch": (1700, 1800),
        "gemm": (1900, 4400),
        "call": (3800, 4000),
        "nccl_launch": (3850, 3950),
        "nccl": (4400, 5400),
        "sync": (4000, 5450),
    },
}


def _span(
    rows: list[dict[str, Any]],
    rank: int,
    offset: int,
    parent: int,
    name: str,
    level: str,
    kind: str,
    when: tuple[int, int],
    **more: Any,
) -> None:
    rows.append(
        {
            "span_id": ((rank + 1) << 40) + offset,
            "parent_span_id": parent,
            "name": name,
            "level": level,
            "kind": kind,
            "start_ns": when[0],
            "dur_ns": when[1] - when[0],
            "rank": rank,
            "thread_id": 1 if level != "gpu" else None,
            **more,
        }
    )


def _nccl_measurement(root: Path) -> Path:
    rows = [
        {"span_id": 1, "parent_span_id": 0, "name": "iteration", "kind": "iteration",
         "level": "model", "start_ns": 1000, "dur_ns": 4500},
    ]  # fmt: skip
    for rank, t in NCCL_RANKS.items():
        base = (rank + 1) << 40
        span = partial(_span, rows, rank)
        step = base + 1
        span(1, 1, f"rank {rank}", "model", "step", t["step"])
        span(2, step, "aten::mm", "framework", "op", t["mm"])
        span(3, base + 2, "cudaLaunchKernel", "library", "runtime", t["gemm_launch"],
             correlation_id=1)  # fmt: skip
        span(4, base + 3, "sm90_gemm", "gpu", "kernel", t["gemm"], correlation_id=1,
             gpu_device=0, gpu_stream=7)  # fmt: skip
        span(5, step, "c10d::allreduce_", "framework", "collective", t["call"],
             collective="allreduce")  # fmt: skip
        span(6, base + 5, "cudaLaunchKernel", "library", "runtime", t["nccl_launch"],
             correlation_id=2)  # fmt: skip
        span(7, base + 6, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "gpu", "kernel", t["nccl"],
             correlation_id=2, gpu_device=0, gpu_stream=7)  # fmt: skip
        span(8, step, "cudaDeviceSynchronize", "library", "runtime", t["sync"])
    for row in rows:
        row.update(trace_id=b"\x01" * 16, iteration=0, world_size=2)
    table = pa.Table.from_pylist(rows, schema=schema.SPAN_SCHEMA)
    steps = {rank: times["step"] for rank, times in NCCL_RANKS.items()}
    return write_two_ranks(root, steps, "MFLG", table)


def test_an_nccl_kernel_ends_once_the_last_ranks_kernel_has_started(tmp_path: Path) -> None:
    """The replay keeps both steps as measured (4,500 and 4,000 ns), rank 0's NCCL kernel
    drawn from 2,400, where it began to spin, and its 2,000 ns wait counted; NCCL's kernels are
    communication on the critical path. With rank 1's GEMM
    free, rank 1's NCCL kernel starts at its launch's end plus the 100 ns latency the others
    measured (4,050) and both kernels end at 5,050: each sync returns 350 ns sooner, rank 0's
    step takes 4,150 ns and rank 1's 3,650. Each rank replayed alone, rank 0's kept its
    measured 3,000 ns kernel and its 4,500 ns step."""
    from dataclasses import replace

    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.replay import WhatIf, fitted_graph, replay, replay_with
    from xsp.analysis.replay.collectives import no_collectives

    measurement = MeasurementStore(_nccl_measurement(tmp_path))
    plain = replay(measurement)
    summary = plain.summary()
    assert [r["replayed_ms"] for r in summary["iterations"]] == pytest.approx([0.0045, 0.004])
    assert summary["collective_waits"] == [
        {"iteration": 0, "rank": 0, "wait_ns": 2000},
        {"iteration": 0, "rank": 1, "wait_ns": 0},
    ]
    assert summary["checks"] == {
        "activities_before_launch": 0,
        "activities_overlapping_on_a_stream": 0,
        "spans_outside_their_step": 0,
    }
    (nccl_0,) = np.nonzero(_on_rank(plain.spans, 0, "ncclDevKernel_AllReduce_Sum_f32_RING_LL"))[0]
    assert (plain.start_ns[nccl_0], plain.dur_ns[nccl_0]) == (2400, 3000)
    # NCCL's kernels are communication: rank 0's 3,000 ns and rank 1's 1,000, a mean 2,000 ns of
    # the 4,250 a step
    from xsp.analysis.replay import critical_path

    assert critical_path.verdict(measurement).startswith(
        "unchecked: communication-bound: 47% communication, 41% gpu compute"
    )

    rank_1_gemm = partial(_on_rank, rank=1, value="sm90_gemm")
    edit = WhatIf("rank 1's GEMM takes no time", drop_activities=rank_1_gemm)
    edited = replay_with(measurement, edit)
    assert edited.steps.column("replayed_ms").to_pylist() == pytest.approx([0.00415, 0.00365])
    assert edited.start_ns[nccl_0] + edited.dur_ns[nccl_0] == 5050
    alone = replay_with(
        measurement, edit, replace(fitted_graph(measurement), collectives=no_collectives())
    )
    assert alone.steps.column("replayed_ms").to_pylist() == pytest.approx([0.0045, 0.00365])


def test_the_straggler_is_named_and_its_fix_replayed() -> None:
    """Rank 1 arrives last at 35 of 40 all-reduces and rank 0 waits 2.256 ms a step for it;
    its compute (the steps' outermost ops, modules, autograd nodes and optimizer calls, as
    traced) takes 2.993 ms a step against rank 0's 2.494. Balanced, the job would run at rank
    0's own pace: rank 0's replayed step less its waits is 3.794 ms, rank 1's 5.393 ms, and the
    1.599 ms between them come out of rank 1's replayed compute (0.27 of it kept): the step is
    0.824 ms shorter."""
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.replay import replay
    from xsp.analysis.suggestions.rules import suggest

    store = MeasurementStore(GLOO)
    assert replay(store).own_steps_ms() == pytest.approx({0: 3.794, 1: 5.393}, abs=5e-4)
    rows = [r for r in suggest(store).to_pylist() if r["rule"] == "straggler"]
    assert len(rows) == 1
    found = rows[0]
    assert found["evidence"] == (
        "rank 1 arrives last at 35 of 40 collectives; the other ranks wait 2.256 ms a step for "
        "it; its compute (as traced) takes 2.993 ms a step against rank 0's 2.494"
    )
    assert found["estimate"] == (
        "rank 1's own time a step (5.393 ms, its replayed step less its waits) cut to rank 0's "
        "(3.794 ms) out of its compute (0.27 of it kept)"
    )
    assert found["gain_ms_per_iteration"] == pytest.approx(0.8241, abs=1e-4)


def test_the_flame_of_a_gloo_job_is_one_ranks_step_without_the_ranges_beside_it() -> None:
    """The flame shows the median step, rank 1's in iteration 4, as wide as its 6,014,915 ns:
    the other rank's step ran beside it (the timeline shows both), and so did gloo's two
    all-reduce ranges, on their own threads beside backward's autograd nodes; drawn as siblings
    the ranks made the iteration box 20.8 ms wide."""
    from xsp.analysis.figures.views import step_view
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.reconstruction.reconstruct import reconstruct

    spans, _ = reconstruct(MeasurementStore(GLOO))
    view = step_view(spans)
    assert view is not None
    root = view.flame_boxes[0]
    assert (view.iteration, view.rank, view.durs_ns[root], view.step_ns) == (
        4,
        1,
        6_014_915,
        6_014_915,
    )
    in_flame = [view.names[i] for i in view.flame_boxes]
    assert view.beside == 2 and not [n for n in in_flame if n.startswith("gloo:")]
    # the timeline keeps them, and the other rank's step with its own two
    assert sum(n.startswith("gloo:") for n in view.names) == 4
    assert {lane[0].split(" · ")[0] for lane in view.lanes} == {"rank 0", "rank 1", "iteration"}

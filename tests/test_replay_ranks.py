"""The replay across ranks (issue 25, "collectives, where ranks exist"): a collective on a rank
completes once every rank has arrived, plus its own transfer. Specified here, worked out by hand;
the replay does not link ranks yet, so the first two are expected failures until it does (strict:
they fail once it does, to be turned into plain tests). The third holds today: a what-if on one
rank leaves the other rank's own times."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.test_ranks import _framework, _resource, _steps
from xsp.tracer import schema, store
from xsp.tracer.convert.ranks import join_ranks
from xsp.tracer.convert.spans import build_table

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


def _measurement(root: Path) -> Path:
    mf = [
        build_table(
            "run-mf",
            "MF",
            {"M": _steps(events[0][1], events[0][2]), "F": _framework(events)},
            rank=rank,
            world_size=2,
        )[0]
        for rank, events in EVENTS.items()
    ]
    m = [
        build_table("run-m", "M", {"M": _steps(*M_STEPS[r])}, rank=r, world_size=2)[0]
        for r in (0, 1)
    ]
    store.write_run(root / "M", join_ranks(m, 2), "M", _resource("M"), world_size=2)
    store.write_run(root / "MF", join_ranks(mf, 2), "MF", _resource("MF"), world_size=2)
    store.write_json_atomic(
        root / store.MANIFEST,
        {
            "format": schema.STORE_FORMAT,
            "runs": [{"levels": "M", "status": "ok"}, {"levels": "MF", "status": "ok"}],
            "status": "ok",
        },
    )
    return root


@pytest.mark.xfail(strict=True, reason="issue 25: collectives are not edges of the replay yet")
def test_rank_0_waits_for_rank_1_in_the_all_reduce(tmp_path: Path) -> None:
    from xsp.analysis.replay import replay
    from xsp.analysis.store import MeasurementStore

    summary = replay(MeasurementStore(_measurement(tmp_path))).summary()
    # completion = last arrival 5,000 + 1,000 (rank 0) / rank 1's own start 5,050 + 1,000
    assert [r["replayed_ms"] for r in summary["iterations"]] == pytest.approx([0.0056, 0.00515])
    assert summary["collective_waits"] == [
        {"iteration": 0, "rank": 0, "wait_ns": 1950},
        {"iteration": 0, "rank": 1, "wait_ns": 0},
    ]


@pytest.mark.xfail(strict=True, reason="issue 25: collectives are not edges of the replay yet")
def test_dropping_rank_1s_slow_op_shortens_rank_0s_step(tmp_path: Path) -> None:
    from xsp.analysis.replay import WhatIf, _replay
    from xsp.analysis.store import MeasurementStore

    measurement = MeasurementStore(_measurement(tmp_path))

    def rank_1_mm(spans):  # type: ignore[no-untyped-def]
        names = np.asarray(spans.column("name").to_pylist(), dtype=object)
        ranks = np.asarray(spans.column("rank").fill_null(-1).to_pylist())
        return (names == "aten::mm") & (ranks == 1)

    edited = _replay(measurement, WhatIf("rank 1's mm takes no time", drop_host=rank_1_mm))
    # rank 1 arrives at 1,600 (its gloo at 1,650); rank 0 arrives last, at 3,000: rank 0
    # completes at max(3,000, 3,050) + 1,000 = 4,050, its add ends 4,550, its step 4,650 - 1,000;
    # rank 1 completes at max(3,000, 1,650) + 1,000 = 4,000, add to 4,500, step 4,600 - 1,500
    assert edited.steps.column("replayed_ms").to_pylist() == pytest.approx([0.00365, 0.0031])


def test_a_what_if_on_one_rank_leaves_the_other_ranks_own_times(tmp_path: Path) -> None:
    """The ranks of an iteration share one clock: cutting rank 1's mm (1,600-5,000 ns) takes
    3,400 ns off rank 1's host timeline and none off rank 0's, whose mm (1,100-3,000) ran over
    the same time (cut from every step, it lost 1,400 ns of its 1,900). Rank 1's add then
    starts 3,400 ns earlier."""
    from xsp.analysis.replay import WhatIf, _replay
    from xsp.analysis.store import MeasurementStore

    measurement = MeasurementStore(_measurement(tmp_path))

    def rank_1_mm(spans):  # type: ignore[no-untyped-def]
        names = np.asarray(spans.column("name").to_pylist(), dtype=object)
        ranks = np.asarray(spans.column("rank").fill_null(-1).to_pylist())
        return (names == "aten::mm") & (ranks == 1)

    plain = _replay(measurement)
    edited = _replay(measurement, WhatIf("rank 1's mm takes no time", drop_host=rank_1_mm))
    names = np.asarray(plain.spans.column("name").to_pylist(), dtype=object)
    ranks = np.asarray(plain.spans.column("rank").fill_null(-1).to_pylist())
    (mm_0,) = np.nonzero((names == "aten::mm") & (ranks == 0))[0]
    (add_1,) = np.nonzero((names == "aten::add") & (ranks == 1))[0]
    assert (edited.start_ns[mm_0], edited.dur_ns[mm_0]) == (plain.start_ns[mm_0], 1900)
    assert plain.start_ns[add_1] - edited.start_ns[add_1] == 3400


def test_each_ranks_step_is_set_against_its_own_m_step(tmp_path: Path) -> None:
    """M measured 5,600 ns on rank 0 and 5,150 on rank 1 in iteration 0: each rank's replayed
    step is set against its own, and M's median is over both (5,375 ns). Keyed by iteration
    alone, rank 1's step had overwritten rank 0's (both read 5,150 ns)."""
    from xsp.analysis.replay import replay
    from xsp.analysis.store import MeasurementStore

    summary = replay(MeasurementStore(_measurement(tmp_path))).summary()
    rows = summary["iterations"]
    assert [r["measured_ms"] for r in rows] == pytest.approx([0.0056, 0.00515])
    assert summary["measured_step_ms"] == pytest.approx(0.005375)

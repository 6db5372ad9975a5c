"""Levels L and G in a continuous session, without a GPU: the order in which they drive CUPTI.

What a service relies on: an unsampled request pays nothing for CUPTI, and a sampled one does
not pay CUPTI's start and finalize (about 11 ms). So CUPTI runs only from a sampled iteration to
the next unsampled one and is paused in between: its kinds disabled and the API callbacks'
domains switched off (the API calls are recorded from callbacks, since CUPTI's RUNTIME and
DRIVER kinds, once enabled, cost every CUDA call until CUPTI is finalized:
``benchmarks/cupti_attach_cost.py``, ``benchmarks/cupti_sampling_cost.py``). The first CUPTI
run, started before the session knew it was continuous, records them as activity and is
finalized; so is every run with ``XSP_CUPTI_SAMPLING=finalize``. Each run's records are
collected as it stops, with its own clock offset and, when CUPTI was finalized, with
correlation ids that the next run's will not meet; a batch boundary hands the batch over,
flushing CUPTI only if it runs. CUPTI itself is stood in for by a recorder of the native core's
calls (on the GPU, ``tests/test_gpu.py``'s sampled service test runs them on CUPTI).
"""

from __future__ import annotations

from typing import Any

import pytest

from xsp.core.arena import ArenaContents
from xsp.tracer.capture.hooks import cupti
from xsp.tracer.capture.levels.cuda import GpuLevel, LibraryLevel

#: Unix-epoch ns minus the recorder's CUPTI clock
OFFSET = 1_000_000


class NativeCalls:
    """The native core's CUPTI calls, recorded (``cupti_timestamp`` left out of the log)."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.kernels: list[int] = []  # a kernel's correlation id, per kernel since the decode

    def cupti_timestamp(self) -> int:
        import time

        return time.time_ns() - OFFSET

    def cupti_start(self, kinds: list[str], *_: Any, api_callbacks: bool = False) -> int:
        self.log.append(("start", "CONCURRENT_KERNEL" in kinds, api_callbacks))
        self.kinds = list(kinds)
        return 0

    def cupti_pause(self, captures: bool = True, flush: bool = True) -> int:
        self.log.append(("pause", flush))
        return 0

    def cupti_resume(self) -> None:
        self.log.append(("resume",))

    def cupti_measuring(self, on: bool) -> None:
        pass

    def cupti_stop(self) -> int:
        self.log.append(("stop",))
        return 0

    def cupti_flush(self) -> int:
        self.log.append(("flush",))
        return 0

    def cupti_collect(self, offset_ns: int, run_ended: bool) -> int:
        self.log.append(("collect", round(offset_ns / OFFSET), run_ended))
        return 0

    def cupti_decode(self, offset_ns: int = 0) -> dict[str, Any]:
        self.log.append(("decode", round(offset_ns / OFFSET)))
        return _empty_columns()

    def cupti_finalize(self) -> None:
        self.log.append(("finalize",))


def _empty_columns() -> dict[str, Any]:
    gpu = dict.fromkeys(
        ["kind", "name", "start_ns", "end_ns", "correlation", "device", "stream", "grid"], b""
    )
    gpu |= dict.fromkeys(
        ["block", "registers", "shared_memory", "bytes", "copy_kind", "graph_node"], b""
    )
    api = dict.fromkeys(["kind", "name", "start_ns", "end_ns", "correlation", "thread"], b"")
    markers = dict.fromkeys(["domain", "name", "start_ns", "end_ns", "thread"], b"")
    return {
        "gpu": gpu | {"names": []},
        "api": api | {"names": []},
        "markers": markers | {"domains": [], "names": []},
        "external": {"correlation": b"", "external": b""},
        "named": dict.fromkeys(["correlation", "type", "stream", "event"], b""),
        "counts": {"records": 0, "unknown_records": 0},
    }


@pytest.fixture
def native(monkeypatch: pytest.MonkeyPatch) -> NativeCalls:
    monkeypatch.delenv("XSP_CUPTI_SAMPLING", raising=False)
    calls = NativeCalls()
    session = cupti._CuptiSession()
    session._native = calls
    monkeypatch.setattr(cupti, "_session", session)
    return calls


def _levels() -> list[Any]:
    return [LibraryLevel(with_ops=True), GpuLevel(with_ops=True)]


def _sample(levels: list[Any], on: bool) -> None:
    for level in levels:  # stack order, as the session switches them
        level.sample(on)


def _hand_over(levels: list[Any]) -> list[Any]:
    drains = [level.handover() for level in reversed(levels)]  # deepest first
    for level in levels:
        level.enable()
    return [drain(ArenaContents.empty()) for drain in drains]


def test_cupti_pauses_between_the_sampled_iterations_and_is_finalized_at_the_end(
    native: NativeCalls,
) -> None:
    levels = _levels()
    for level in levels:
        level.enable()  # the session's levels come on: iteration 0 is sampled
    # not yet known to be continuous: API calls as CUPTI's activity records
    assert native.log == [("start", False, False), ("start", True, False)]
    native.log.clear()
    _sample(levels, False)  # iteration 1: that run (RUNTIME and DRIVER kinds) is finalized
    assert native.log == [("stop",), ("collect", 1, True), ("finalize",)]
    native.log.clear()
    _sample(levels, True)  # iteration 2: started once more, its API calls from callbacks
    assert native.log == [("start", False, True), ("start", True, True)]
    # without the kinds that cost every CUDA call once enabled, disabled or not
    assert not {"SYNCHRONIZATION", "CUDA_EVENT"} & set(native.kinds)
    native.log.clear()
    _sample(levels, False)  # iteration 3: paused, its records left in CUPTI's buffer
    assert native.log == [("pause", False)]
    native.log.clear()
    _sample(levels, False)  # iteration 4: nothing more to do
    assert native.log == []
    _sample(levels, True)  # iteration 5: resumed, not started
    assert native.log == [("resume",), ("start", False, True), ("start", True, True)]
    native.log.clear()
    _sample(levels, False)
    native.log.clear()
    _hand_over(levels)  # the boundary: paused CUPTI's records flushed, decoded on the offset now
    assert native.log == [("flush",), ("decode", 1)]
    native.log.clear()
    for level in reversed(levels):
        level.disable()  # the end: CUPTI paused is stopped and finalized
    assert native.log == [("stop",), ("finalize",)]


def test_a_batch_boundary_flushes_a_paused_cupti_only_while_it_runs(native: NativeCalls) -> None:
    levels = _levels()
    for level in levels:
        level.enable()
    _sample(levels, False)
    _sample(levels, True)
    native.log.clear()
    _hand_over(levels)  # CUPTI runs: flushed, decoded on the offset now; it goes on
    assert native.log == [("flush",), ("decode", 1)]
    native.log.clear()
    _sample(levels, False)
    assert native.log == [("pause", False)]
    native.log.clear()
    _hand_over(levels)  # paused: flushed too
    assert native.log == [("flush",), ("decode", 1)]
    native.log.clear()
    _hand_over(levels)  # paused with nothing recorded since: flushed again, cheaply
    native.log.clear()
    for level in levels:  # a sampled iteration right after a boundary resumes CUPTI
        level.begin_iteration(6)
    assert native.log == [("resume",), ("start", False, True), ("start", True, True)]
    native.log.clear()
    for level in reversed(levels):
        level.disable()  # stopped while it runs: paused, then stopped and finalized
    assert native.log == [("pause", False), ("stop",), ("finalize",)]


def test_a_sample_in_runs_finalizes_cupti_between_runs_and_keeps_it_on_within_one(
    native: NativeCalls,
) -> None:
    levels = [LibraryLevel(with_ops=True, pause=False), GpuLevel(with_ops=True, pause=False)]
    for level in levels:
        level.enable()  # iterations 0-2 are a run: one start for all three
    _sample(levels, False)  # iteration 3: the run's records collected, CUPTI finalized
    native.log.clear()
    _sample(levels, False)  # the unsampled iterations: nothing of CUPTI's runs or is paused
    assert native.log == []
    _sample(levels, True)  # the next run: started once more, API calls as activity records
    assert native.log == [("start", False, False), ("start", True, False)]
    native.log.clear()
    _sample(levels, False)  # its end: collected and finalized, never paused
    assert native.log == [("stop",), ("collect", 1, True), ("finalize",)]


def test_a_run_of_fixed_iterations_never_pauses_cupti(native: NativeCalls) -> None:
    levels = _levels()
    for level in levels:
        level.enable()
    for level in reversed(levels):
        level.disable()
    assert native.log == [("start", False, False), ("start", True, False), ("stop",)]


def test_cupti_runs_for_the_sampled_iterations_only_and_is_finalized_between(
    native: NativeCalls, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XSP_CUPTI_SAMPLING", "finalize")
    levels = _levels()
    for level in levels:
        level.enable()  # the session's levels come on: iteration 0 is sampled
    assert native.log == [("start", False, False), ("start", True, False)]
    native.log.clear()
    _sample(levels, False)  # iteration 1: the last level to stop collects, then finalizes
    assert native.log == [("stop",), ("collect", 1, True), ("finalize",)]
    native.log.clear()
    _sample(levels, False)  # iteration 2: nothing more to do
    assert native.log == []
    _sample(levels, True)  # iteration 3: started again
    assert native.log == [("start", False, False), ("start", True, False)]


def test_a_batch_boundary_flushes_cupti_only_while_it_runs(
    native: NativeCalls, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XSP_CUPTI_SAMPLING", "finalize")
    levels = _levels()
    for level in levels:
        level.enable()
    _sample(levels, False)
    _sample(levels, True)
    native.log.clear()
    # the boundary after a sampled iteration: flushed, decoded on the offset now; CUPTI goes on
    records = _hand_over(levels)
    assert native.log == [("flush",), ("decode", 1)]
    assert [counts["cupti"]["dropped_records"] for _, counts in records] == [0, 0]
    native.log.clear()
    _sample(levels, False)
    assert native.log == [("stop",), ("collect", 1, True), ("finalize",)]
    native.log.clear()
    # the next boundary, CUPTI finalized: its runs were collected already, nothing to flush
    _hand_over(levels)
    assert native.log == [("decode", 0)]
    native.log.clear()
    # a sampled iteration right after a boundary: CUPTI starts as it begins, before its markers
    for level in levels:
        level.begin_iteration(6)
    assert native.log == [("start", False, False), ("start", True, False)]
    native.log.clear()
    for level in reversed(levels):
        level.disable()
    assert native.log == [("stop",), ("finalize",)]


def test_a_cupti_that_will_not_start_costs_the_iteration_its_records_not_the_request(
    native: NativeCalls, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xsp.tracer.export.finish import capture_losses

    levels = _levels()
    for level in levels:
        level.enable()
    _sample(levels, False)
    _hand_over(levels)  # a boundary: the next sampled iteration starts CUPTI as it begins

    def refuse(*_: Any) -> int:
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    monkeypatch.setattr(native, "cupti_start", refuse)
    for level in levels:
        level.begin_iteration(3)  # no exception reaches the program
    records = _hand_over(levels)
    counts = records[-1][1]
    assert counts["cupti"]["start_failures"] == 1
    assert capture_losses(counts) == ["CUPTI would not start for 1 sampled iterations"]

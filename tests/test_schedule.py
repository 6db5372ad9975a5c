"""The schedule of a session (``xsp.tracer.capture.schedule``), driven by hand: each expected
sequence below is worked out from the rules in its docstring, not read off the code."""

from __future__ import annotations

from xsp.tracer.capture.schedule import Boundary, Phase, Schedule

W, U, M, D = Phase.WARMUP, Phase.UNTRACED, Phase.MEASURE, Phase.DONE
NOTHING, ON, FINISH, CONTINUE = (
    Boundary.NOTHING,
    Boundary.LEVELS_ON,
    Boundary.FINISH,
    Boundary.CONTINUE,
)


def _run(schedule: Schedule, steps: int) -> list[tuple[Phase, Boundary | None]]:
    """Begin and end ``steps`` iterations; the levels come on when the schedule says so."""
    if schedule.levels_on_at_start:
        schedule.levels_on = True
    seen: list[tuple[Phase, Boundary | None]] = []
    for _ in range(steps):
        phase = schedule.begin()
        if phase is Phase.DONE:
            seen.append((phase, None))
            continue
        boundary = schedule.end()
        if boundary is Boundary.LEVELS_ON:
            schedule.levels_on = True
        seen.append((phase, boundary))
    return seen


def test_warmup_then_measured_then_done() -> None:
    schedule = Schedule(warmup=2, iterations=3)
    assert not schedule.levels_on_at_start
    assert _run(schedule, 6) == [
        (W, ON),  # the levels come on one warm-up iteration early
        (W, NOTHING),
        (M, NOTHING),
        (M, NOTHING),
        (M, FINISH),
        (D, None),
    ]
    assert schedule.done and schedule.finish_due and schedule.measured_ended() == 3


def test_a_short_warmup_switches_the_levels_on_at_the_start() -> None:
    assert _run(Schedule(warmup=1, iterations=2), 4) == [
        (W, NOTHING),
        (M, NOTHING),
        (M, FINISH),
        (D, None),
    ]
    assert _run(Schedule(warmup=0, iterations=1), 2) == [(M, FINISH), (D, None)]


def test_interleaved_untraced_iterations_precede_each_traced_one() -> None:
    schedule = Schedule(warmup=2, iterations=2, interleave=True)
    assert _run(schedule, 8) == [
        (W, ON),
        (W, NOTHING),
        (U, NOTHING),  # not counted: the index stays
        (M, NOTHING),
        (U, NOTHING),
        (M, FINISH),  # no untraced one after the last traced one
        (D, None),
        (D, None),
    ]
    assert schedule.index == 4 and not schedule.untraced_due


def test_settling_extends_the_warmup_one_step_at_a_time() -> None:
    schedule = Schedule(warmup=2, iterations=1)
    assert schedule.begin() is W and schedule.end() is ON
    schedule.extend_warmup()  # not settled: warm up one step more, the levels still off
    assert schedule.begin() is W and schedule.end() is ON
    schedule.levels_on = True
    assert schedule.begin() is W and schedule.end() is NOTHING
    assert schedule.begin() is M and schedule.end() is FINISH
    assert schedule.warmup == 3 and schedule.index == 4


def test_a_continuous_schedule_continues_until_stopped() -> None:
    schedule = Schedule(warmup=1, iterations=0, continuous=True)
    assert _run(schedule, 4) == [(W, NOTHING), (M, CONTINUE), (M, CONTINUE), (M, CONTINUE)]
    assert schedule.limit is None and not schedule.done and schedule.unbounded
    schedule.stop_measuring()  # the duration is over
    assert schedule.done and schedule.finish_due and not schedule.unbounded
    assert schedule.begin() is D and schedule.measured_ended() == 3


def test_a_lease_counts_the_iterations_it_recorded() -> None:
    schedule = Schedule(warmup=0, iterations=0, continuous=True, levels_on=True)
    assert schedule.begin() is M and schedule.end() is CONTINUE  # a batch may be due
    schedule.skip(5)  # recorded on a lease, without the markers
    assert schedule.open is None and schedule.index == 6 and schedule.measured == 6


def test_nothing_measured_when_the_program_stops_in_the_warmup() -> None:
    schedule = Schedule(warmup=3, iterations=2)
    _run(schedule, 2)
    assert not schedule.measuring
    assert schedule.measured_ended() == -1  # one warm-up step short: the session counts 0
    assert schedule.next_phase() is W

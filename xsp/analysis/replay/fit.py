"""F's cost per record fitted to the F process's own untraced steps (``xsp.analysis.replay``,
step 2's last part): the graph every replay of a store runs on, and the held-out replays the
in-process check compares with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from xsp.analysis.measurement.derived import Derived
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.measurement.untraced import untraced_steps
from xsp.analysis.replay import fit_cache
from xsp.analysis.replay.edits import STEPS_ONLY
from xsp.analysis.replay.engine import replay_graph
from xsp.analysis.replay.graph import Graph, build_graph, with_cost
from xsp.analysis.replay.host_timeline import largest_cost_factor
from xsp.analysis.replay.result import IterationResult, median_steady_ms

__all__ = [
    "FIT_MAX_FACTOR",
    "FIT_ROUNDS",
    "FIT_TOLERANCE_PCT",
    "base_graph",
    "fitted_graph",
    "held_out_steps",
]

#: The replay of the F run's steps may exceed that process's own untraced steps by this share
#: before F's cost per record is fitted to them (``_fitted_graph``).
FIT_TOLERANCE_PCT = 1.0
#: Bisection rounds of the fit (the factor to 1/256 of its range).
FIT_ROUNDS = 8
#: The most the fit raises the probe's cost by. A workload's records cost up to a few times the
#: probe's (3.2x for ResNet-50 b64 channels_last training on the H200); a fit past this explains
#: with F's cost what the process's own drift did (on a loaded dev machine, an MF process's
#: untraced steps took 94 ms and its traced ones 864 ms, which a 1,292x cost "fitted" by
#: replaying a host that took no time at all).
FIT_MAX_FACTOR = 8.0


def fitted_graph(store: MeasurementStore) -> Graph:
    """The replay's graph, once per store: the replay and every what-if read the same one."""
    return FITTED_GRAPH.of(store)


def _fitted_graph(store: MeasurementStore) -> Graph:
    """The graph, with F's cost per record fitted to the F process's own untraced steps
    (``xsp.analysis.measurement.untraced``: the iterations interleaved with its traced ones, else its
    warm-up's) where the probe's figure replays them off by more than ``FIT_TOLERANCE_PCT``
    (step 2).

    The probe is a small network's step; a large workload's records can cost more each (on the
    H200, ResNet-50 b64 channels_last training replayed 12% above the MF process's untraced
    warm-up steps with the probe's 2.6 µs a record, its forward ops 35% slower in two of three
    traced steps), or less (the GPT LM's, 0.7 of the probe's). Where the replay of the F run's
    steps exceeds that process's own untraced steps, the cost is raised, by bisection, to the
    least at which it does so no more, up to ``FIT_MAX_FACTOR`` times the probe's; where it
    falls short of them, lowered to the most at which it reaches them (``_lowered``). It is left
    as the probe measured it where even a host that takes no time replays too slowly, or one
    that keeps all of F's cost too fast (the GPU side is then off), or where only more than
    ``FIT_MAX_FACTOR`` would do (the process drifted): the in-process check says so. M is not
    read, so the check against M stays free of it. The outcome is kept in the store for the
    next reader (``xsp.analysis.fit_cache``)."""
    graph = base_graph(store)
    fit = _kept_fit(store, graph, None)
    if fit is None or fit.factor is None:
        return graph
    return replace(
        with_cost(store, graph, fit.factor),
        calibration=graph.calibration.scaled(fit.factor, fit.why or ""),
    )


def base_graph(store: MeasurementStore) -> Graph:
    """The graph with the probe's cost (as checked), once per store: the fits start from it."""
    return BASE_GRAPH.of(store)


def _kept_fit(
    store: MeasurementStore, graph: Graph, iterations: frozenset[int] | None
) -> fit_cache.Fit | None:
    """The fit of F's cost to the F process's own untraced steps before ``iterations`` (None:
    every one), read from the store's cache or fitted and kept; None where there is nothing to
    fit to (no untraced steps, no probe)."""
    own = untraced_steps(store)
    probe = graph.calibration
    if own is None or not probe.op_ns:
        return None
    untraced = own.ms(iterations)
    if untraced is None:
        return None
    # what the fit starts from besides the runs: its settings and the probe's cost as checked
    settings = (FIT_TOLERANCE_PCT, FIT_ROUNDS, FIT_MAX_FACTOR, probe, sorted(iterations or ()))
    kept_as = fit_cache.key(store, settings)
    fit = fit_cache.read(store, kept_as)
    if fit is None:
        fit = _fit(store, graph, untraced, iterations)
        fit_cache.write(store, kept_as, fit)
    return fit


def held_out_steps(store: MeasurementStore) -> dict[int, float] | None:
    """Each paired iteration's replayed step (ms, steady ones only) with F's cost fitted to the
    pairs of the other fold (``Untraced.folds``): what the in-process check compares with the
    untraced steps. None with fewer than two pairs."""
    own = untraced_steps(store)
    folds = own.folds() if own is not None else None
    if folds is None:
        return None
    graph = base_graph(store)
    found: dict[int, float] = {}
    for fit_on, check_on in (folds, folds[::-1]):
        fit = _kept_fit(store, graph, fit_on)
        factor = fit.factor if fit is not None and fit.factor is not None else 1.0
        steps = _replayed_steps(store, with_cost(store, graph, factor))
        found.update(
            (i.iteration, i.replayed_ms) for i in steps if i.steady and i.iteration in check_on
        )
    return found


def _fit(
    store: MeasurementStore, graph: Graph, untraced: float, iterations: frozenset[int] | None
) -> fit_cache.Fit:
    """The factor on the probe's cost at which the replay of the F run's steps (those of
    ``iterations``; None: all) comes within ``FIT_TOLERANCE_PCT`` of ``untraced``, by bisection
    (``_fitted_graph``): raised where the probe's cost replays them too slowly, lowered where
    it replays them too fast (its records cost less than the workload's: the replayed step
    grows as less is taken off the host)."""

    def replayed(factor: float) -> float:
        steps = _replayed_steps(store, with_cost(store, graph, factor))
        mine = tuple(i for i in steps if iterations is None or i.iteration in iterations)
        return median_steady_ms(mine) or 0.0

    target = untraced * (1 + FIT_TOLERANCE_PCT / 100)
    floor = untraced * (1 - FIT_TOLERANCE_PCT / 100)
    with_probe = replayed(1.0)
    if with_probe < floor:
        return _lowered(replayed, floor, untraced, with_probe)
    if with_probe <= target:
        return fit_cache.Fit(None)
    low = 1.0
    high = largest = largest_cost_factor(store, graph.calibration)
    for _ in range(FIT_ROUNDS):
        if low >= FIT_MAX_FACTOR:
            break  # the least is past it already
        middle = (low + high) / 2
        if replayed(middle) > target:
            low = middle
        else:
            high = middle
    # past FIT_MAX_FACTOR it is not F's cost but the process's drift, which the in-process
    # check reports; and a bracket that never came down from the largest is checked there
    # last, not first (one replay fewer where it holds): a host that takes no time at all may
    # still be too slow
    if high > FIT_MAX_FACTOR or (high == largest and replayed(high) > target):
        return fit_cache.Fit(None)
    return fit_cache.Fit(high, _fitted_why(untraced, with_probe))


def _lowered(
    replayed: Callable[[float], float], floor: float, untraced: float, with_probe: float
) -> fit_cache.Fit:
    """The greatest factor below 1 at which the replay reaches ``floor``; none where even a
    host that keeps all of F's cost replays faster (the GPU side is then off)."""
    if replayed(0.0) < floor:
        return fit_cache.Fit(None)
    low, high = 0.0, 1.0  # replayed(low) >= floor > replayed(high)
    for _ in range(FIT_ROUNDS):
        middle = (low + high) / 2
        if replayed(middle) >= floor:
            low = middle
        else:
            high = middle
    # never quite 0: a cost of 0 reads as "no calibration" downstream
    return fit_cache.Fit(max(low, 0.5**FIT_ROUNDS), _fitted_why(untraced, with_probe))


def _fitted_why(untraced: float, with_probe: float) -> str:
    return (
        f"fitted to within {FIT_TOLERANCE_PCT:g}% of the {untraced:.3f} ms of the F process's own "
        f"untraced steps, which the probe's cost replayed to {with_probe:.3f} ms"
    )


def _replayed_steps(store: MeasurementStore, graph: Graph) -> tuple[IterationResult, ...]:
    """The steps alone of ``graph`` replayed (no critical path, no checks)."""
    return replay_graph(store, graph, STEPS_ONLY).iterations()


#: The replay's graph as the probe costs it (``base_graph``).
BASE_GRAPH = Derived("replay_base_graph", build_graph, needs=("structural_keys",))
#: The replay's graph with F's cost fitted (``fitted_graph``).
FITTED_GRAPH = Derived("replay_graph", _fitted_graph, needs=("replay_base_graph", "untraced"))

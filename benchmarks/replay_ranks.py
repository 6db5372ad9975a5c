"""The replay of multi-rank stores, with and without their collectives as edges.

    python -m benchmarks.replay_ranks STORE [STORE ...]

Per store: M's median step, the MF process's own untraced warm-up steps, the replayed step and
its error against both, the replay with each rank replayed alone (no collective edges), the
replay with none of F's cost taken off the host (MF's own steps, to the nanosecond where the
model holds), F's cost per record and each rank's median wait for the last rank to arrive.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.replay import STEPS_ONLY, fitted_graph, replay, replay_with
from xsp.analysis.replay.collectives import no_collectives
from xsp.analysis.replay.host_timeline import Calibration, host_timeline


def figures(path: str) -> str:
    store = MeasurementStore(path)
    found = replay(store).summary()
    graph = fitted_graph(store)
    alone = replay_with(store, STEPS_ONLY, replace(graph, collectives=no_collectives())).summary()
    _, start, end, _ = host_timeline(store, Calibration(0.0, 0.0, "no cost"))
    free = replay_with(
        store, STEPS_ONLY, replace(graph, warped_start=start, warped_end=end)
    ).summary()
    own = found["in_process"] or {}
    calib = found["calibration"]
    return (
        f"{path}: M {found['measured_step_ms']:.3f} ms, MF's own untraced "
        f"{own.get('untraced_ms') or float('nan'):.3f} ms ("
        f"{'checked' if found['checked'] else 'unchecked'}); replayed {found['step_ms']:.3f} ms "
        f"({found['error_pct']:+.1f}% vs M, {own.get('error_pct') or 0:+.1f}% vs "
        f"untraced); ranks alone {alone['step_ms']:.3f} ms; F's cost left on {free['step_ms']:.3f} ms; "
        f"F {calib['framework_ns_per_record']} ns a record (x{calib['scaled_to_own_steps']}); "
        "median wait a step: "
        + ", ".join(
            f"rank {rank} {ms:.3f} ms" for rank, ms in found["median_collective_wait_ms"].items()
        )
    )


if __name__ == "__main__":
    for each in sys.argv[1:]:
        print(figures(each))

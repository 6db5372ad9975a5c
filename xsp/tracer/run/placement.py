"""Which process runs which level set, and what each level set's run records there.

A level set runs in a process of its own, or in the process of the one before it
(``shares_process``); processes start in turn, or side by side (``warms_up_side_by_side``); M
is timed again in further processes (``further_m_processes``). Of the level sets with F, the
shallowest times F's own cost (``calibrates``) and the deepest records op shapes
(``records_shapes``). ``child_spec`` puts it together for one process.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence

from xsp.core.levelset import LevelSet
from xsp.tracer.run import m_processes
from xsp.tracer.run.plan import LeveledSpec, script_command
from xsp.tracer.run.protocol import ChildSpec
from xsp.tracer.spec import RunSpec

#: For each level set, the level sets its process runs, its own first; empty for one that
#: runs in the process of the level set before it.
Hosts = list[tuple[LevelSet, ...]]


def shares_process(spec: LeveledSpec, before: LevelSet, levels: LevelSet) -> bool:
    """Whether the level set ``levels`` runs in the process of the one ``before`` it, once that
    one has stored its run (``LeveledSpec.share_process``): a zoo model's level sets of M and F
    alone, each adding levels to the one before (M, then MF). The shallower one leaves nothing
    that the deeper one could measure but a longer warm-up: M installs no hook, and neither
    starts CUPTI. L and G need their environment before the process starts, a script runs only
    once, and fixes and the numerics probe change the model once."""
    profile = spec.profile
    return (
        spec.share_process
        and bool(profile.model)
        and not (profile.fixes or profile.numerics_probe or profile.continuous)
        and set(before) < set(levels)
        and not levels.starts_its_process
    )


def process_hosts(spec: LeveledSpec, level_sets: Sequence[LevelSet]) -> Hosts:
    """For each level set, the level sets that the process started for it runs, in order (its
    own first); empty for one that runs in the process of the level set before it."""
    hosts: Hosts = []
    first = 0
    for i, levels in enumerate(level_sets):
        if i and shares_process(spec, level_sets[i - 1], levels):
            hosts[first] += (levels,)
            hosts.append(())
        else:
            first = i
            hosts.append((levels,))
    return hosts


def warms_up_side_by_side(spec: LeveledSpec, hosts: Hosts) -> list[int]:
    """The level sets whose processes start with the first one, ahead of their turn
    (``LeveledSpec.overlap``, a zoo model on a GPU): every process of the measurement but one
    run under Nsight Compute (no gate to wait at). They start up and warm up side by side; each
    measures only once the one before has exited and every one after it waits at its gate, so
    no measurement overlaps another process's work, and no process's start-up and first
    iteration wait for the measurement before it. A script's processes start one at a time (it
    may compile what the next loads from the inductor cache, or touch files)."""
    from xsp.core.devices import resolve_device

    if not (spec.overlap and spec.profile.model):
        return []
    if not resolve_device(spec.profile.device).startswith("cuda"):
        return []  # on the CPU the warm-ups would share the cores the workload runs on
    if hosts[0][0].counters:
        return []
    return [j for j, group in enumerate(hosts) if j and group and not group[0].counters]


def further_m_processes(spec: LeveledSpec, level_sets: Sequence[LevelSet]) -> list[LeveledSpec]:
    """The specs of the processes that time M again after the level sets
    (``xsp.tracer.run.m_processes``): ``spec.m_processes`` - 1 of them where M is measured and
    the measurement is not a service's, each into ``OUT/m-processes/<n>``, measuring at most
    ``m_processes.ITERATIONS`` iterations. A reused ``--out``'s earlier ones are removed."""
    if spec.m_processes <= 1 or m_processes.MODEL_ONLY not in level_sets:
        return []
    if spec.profile.continuous:
        return []
    again = []
    for n in range(2, spec.m_processes + 1):
        out = spec.out / m_processes.DIRECTORY / str(n)
        shutil.rmtree(out, ignore_errors=True)  # never an earlier measurement's steps
        profile = dataclasses.replace(
            spec.profile, iterations=min(spec.profile.iterations, m_processes.ITERATIONS)
        )
        again.append(dataclasses.replace(spec, out=out, profile=profile))
    return again


def records_shapes(spec: LeveledSpec, levels: LevelSet) -> bool:
    """Whether the level set ``levels`` records aten ops' input shapes and dtypes: only the
    deepest one with level F does. Shapes do not change with the levels, so the reconstruction
    and the layer table take them from there, and the shallower level sets measure op and layer
    latency without their cost (the inputs RecordFunction boxes for the callback: 9% of a
    ResNet-50 b64 training step and 18% of a batch-1 inference step on the H200). Every rank of
    a multi-rank job records them: collective sizes come from them."""
    if not levels.framework:
        return False
    if spec.profile.command:
        from xsp.tracer.run import launcher

        if launcher.is_launcher(script_command(spec.profile.command)):
            return True
    return levels == max(_with_framework(spec), key=len, default=levels)


def calibrates(spec: LeveledSpec, levels: LevelSet) -> bool:
    """Whether the level set ``levels`` times level F's own cost per record: only the
    shallowest one with F does, since the replay reads its host times from that run alone
    (``xsp.analysis.measurement.matching.level_sources``). The calibration takes 0.5-1.3 s of a process's
    switch-on on the H200, which the deeper level sets no longer pay."""
    return levels.framework and levels == min(_with_framework(spec), key=len, default=levels)


def interleaves(spec: LeveledSpec, levels: LevelSet) -> bool:
    """Whether the level set ``levels`` runs an untraced iteration before each traced one
    (``xsp.tracer.capture.interleave``): the one that calibrates, in a leveled measurement of two
    level sets or more, whose replay joins runs. A single level set (a service's traces, the
    serving demo's 30 requests) keeps every iteration traced."""
    return (
        spec.interleave
        and len(spec.level_sets) > 1
        and spec.profile.calibrate
        and calibrates(spec, levels)
    )


def _with_framework(spec: LeveledSpec) -> list[LevelSet]:
    return [s for s in spec.level_sets if s.framework]


def child_spec(
    spec: LeveledSpec, levels: LevelSet, measurement_id: str, then: Sequence[LevelSet] = ()
) -> ChildSpec:
    """What the level-set process of ``levels`` runs (its pipes are added where it starts),
    and after it the level sets ``then`` in the same process (``shares_process``)."""
    return ChildSpec(
        _run_spec(spec, levels, measurement_id),
        then=tuple(_run_spec(spec, later, measurement_id) for later in then),
    )


def _run_spec(spec: LeveledSpec, levels: LevelSet, measurement_id: str) -> RunSpec:
    """The run of ``levels``: the measurement's profile, with the iterations the counter level
    set measures, op shapes and the calibration where this level set records them, and a
    command as the process runs it."""
    profile = spec.profile
    iterations = profile.iterations
    if levels.counters:
        iterations = min(iterations, profile.counter_iterations)
    command = tuple(script_command(profile.command)) if profile.command else ()
    return RunSpec(
        levels,
        dataclasses.replace(
            profile,
            iterations=iterations,
            op_shapes=profile.op_shapes and records_shapes(spec, levels),
            calibrate=profile.calibrate and calibrates(spec, levels),
            interleave=interleaves(spec, levels),
            command=command,
        ),
        out=str(spec.out / levels),
        measurement_id=measurement_id,
    )


__all__ = [
    "Hosts",
    "calibrates",
    "child_spec",
    "further_m_processes",
    "interleaves",
    "process_hosts",
    "records_shapes",
    "shares_process",
    "warms_up_side_by_side",
]

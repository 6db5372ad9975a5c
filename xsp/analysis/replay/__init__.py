"""Replay reconstruction: a causal model of the untraced step, checked against what M measured.

Fitting the traced runs' spans into M's step by shrinking gaps cannot be true for asynchronous GPU
work (a host timeline with MF's op durations put ResNet-50's backward launches 6 ms after the
kernels they launch). So the step is replayed, as trace-replay simulators do (Daydream, dPRO,
Lumos), from the deepest run's dependency graph with each node's time taken from the shallowest
run that measures it:

1. **Nodes and edges.** Host spans (F ops, modules, autograd nodes; L library and CUDA calls) in
   program order; launch -> activity by CUDA correlation id (an activity's parent is its launch
   call); stream order per (device, stream); a stream's wait on an event (``cudaStreamWaitEvent``)
   holds that stream's later work until the work queued on the event's stream before the event's
   record has ended; a synchronizing call waits for the work it names (a stream sync: that
   stream's; an event sync: the work before the event's record; device syncs and blocking copies:
   every activity launched before it); a collective ends once the last rank has arrived, plus its
   own transfer, joining the ranks of an iteration (``xsp.analysis.replay.collectives``: gloo's
   range on the host, where a thread that waited for it waits for its replayed end; NCCL's kernel
   on the GPU). Host threads run in turn: the step's thread hands its work to autograd's thread
   during backward and waits for it, so the threads' spans form one program order (two threads
   working at once would be serialized).
2. **Host times without the tracer's cost** (``xsp.analysis.replay.host_timeline``). The host's timeline
   is the shallowest F run's, each time moved back by the calibrated cost of its own rank's F
   records that started and ended before it in its step (the level-set process timed a small
   training step in rounds of F off and on: ``run.json``'s ``calibration``); the deep run's
   spans take those times by structural key, and its L calls are placed between them by
   interpolation; children stay inside their parents. A sync keeps only what it took after the
   work it awaited ended.
3. **Replay.** The host issues in that order; a launch enqueues its activity at the launch
   call's end; a stream runs its activities in order, each once it is launched and the one before
   it has ended, with its G-run duration; a sync blocks the host until the awaited work has ended,
   and everything after it moves by that wait. The step ends at its marker's replayed time or
   when the GPU is done, whichever is later (M's step is bounded by a device sync). The ranks of
   an iteration replay together, again with the replayed arrivals until they hold. By
   construction no activity starts before its launch, none overlaps another of its stream, and
   all lie inside their step. The iterations are then laid end to end, each whole (its ranks
   together) where the one before it ended, as the untraced program runs them.
4. **Critical path.** Walked back from the step's end: an activity that waited for the one before
   it on its stream hands the path to it; one that waited for its launch hands it to the host at
   that launch; a sync that waited hands it to the activity it waited for; a thread's wait for its
   collectives is communication. Every nanosecond of the step gets one cause: GPU compute, host
   work, launch overhead (launch calls), sync (a sync's return after the GPU finished), data
   loading or communication.
5. **What-if** (``WhatIf``, ``what_if``). A fix is an edit of the graph, replayed: activities
   that take no time, host spans whose time leaves their own step's host clock (another rank's
   step, on the same clock, keeps its times), or every activity launched at the step's start;
   the suggestions' gains are the replayed step less the edited one.

The modules, one step each: ``graph`` (steps 1 and 2's graph), ``fit`` (F's cost fitted to the
F process's own untraced steps), ``iteration`` (one step's replay and critical path),
``engine`` (every step, the ranks joined), ``edits`` (what-ifs), ``causes``, ``checks`` and
``result`` (the outcome, typed).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from xsp.analysis.measurement.derived import Derived, DerivedPer
from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.replay.causes import (
    CAUSE_COMMUNICATION,
    CAUSE_DATA,
    CAUSE_GPU,
    CAUSE_HOST,
    CAUSE_LAUNCH,
    CAUSE_SYNC,
    CAUSES,
    VERDICTS,
    Cause,
    Verdict,
)
from xsp.analysis.replay.checks import ReplayChecks, check_replay
from xsp.analysis.replay.edits import STEPS_ONLY, WhatIf
from xsp.analysis.replay.engine import Replay, replay_graph
from xsp.analysis.replay.fit import fitted_graph, held_out_steps
from xsp.analysis.replay.graph import Graph
from xsp.analysis.replay.result import ReplayResult
from xsp.core.columns import numbers

__all__ = [
    "CAUSES",
    "CAUSE_COMMUNICATION",
    "CAUSE_DATA",
    "CAUSE_GPU",
    "CAUSE_HOST",
    "CAUSE_LAUNCH",
    "CAUSE_SYNC",
    "STEPS_ONLY",
    "VERDICTS",
    "Cause",
    "Replay",
    "ReplayChecks",
    "ReplayResult",
    "Verdict",
    "WhatIf",
    "fitted_graph",
    "held_out_steps",
    "replay",
    "replay_with",
    "what_if",
]


def replay(store: MeasurementStore) -> Replay:
    """Replay every iteration of the measurement (see the module's algorithm); once per store."""
    return REPLAY.of(store)


def replay_with(
    store: MeasurementStore, edit: WhatIf | None = None, graph: Graph | None = None
) -> Replay:
    """A replay of ``graph`` (None: the store's, ``fitted_graph``) with ``edit`` applied; with
    no edit, checked against the F process's held-out untraced steps and M's interval."""
    found = replay_graph(store, graph or fitted_graph(store), edit)
    if edit is not None:
        return found
    replayed = found.result().step_ms
    return replace(
        found, verified=check_replay(store, replayed, found.interval, held_out_steps(store))
    )


def what_if(store: MeasurementStore, edit: WhatIf) -> float | None:
    """The replayed step (median of the steady iterations, ms) with ``edit`` applied; once per
    store and edit. The gain of a fix is ``replay(store).result().step_ms`` minus this."""
    return WHAT_IF.of(store, edit)


def _what_if(store: MeasurementStore, edit: WhatIf) -> float | None:
    steps = replay_with(store, edit).steps
    kept = numbers(steps.column("steady")).astype(bool, copy=False)
    replayed = numbers(steps.column("replayed_ms"), null=np.nan).astype(np.float64, copy=False)[
        kept
    ]
    return float(np.median(replayed)) if len(replayed) else None


#: The replay of the store's fitted graph, checked (``replay``).
REPLAY = Derived("replay", replay_with, needs=("replay_graph",))
#: The replayed step with an edit applied (``what_if``).
WHAT_IF = DerivedPer("what_if", _what_if, needs=("replay_graph",))

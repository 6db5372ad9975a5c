"""M timed in several processes: the untraced step is a distribution, not one draw.

On the lent H100 and H200 hosts a host-bound step moved by up to ±25% between processes with
nothing changed (ResNet-50 b1 inference 3.2-5.3 ms, a transformer LM 10.5-16.6 ms), in
stretches of tens of seconds, while 8 consecutive processes agreed within ±6%. So a leveled
measurement times M in ``LeveledSpec.m_processes`` processes: the first is its own M level set;
the others measure once its last level set has ended, each into ``OUT/m-processes/<n>/M/``.
They are the runner's last slots (``xsp.tracer.run.runner.run_leveled``), started as its level
sets are: a zoo model's on a GPU with the others, warming up side by side and measuring in turn
(so that one costs little more than its measured iterations), the others each once the one
before has measured. They measure last rather than between the level sets because a level set
after M may already be warming up there, and M must measure alone. The manifest lists them
under ``m_processes``, each entry as a level set's with its number and path;
``xsp.analysis.replay.m_interval`` reads every process's steps into a median with a 95% interval.
"""

from __future__ import annotations

from collections.abc import Callable

from xsp.core.levelset import LevelSet

__all__ = [
    "DIRECTORY",
    "ITERATIONS",
    "MANIFEST_KEY",
    "MODEL_ONLY",
    "ProgressFn",
    "label",
    "labelled",
]

#: (level set, phase, done, total) -> None: the runner's progress callback.
ProgressFn = Callable[[str, str, int, int], None]

#: Where the further M processes go, under the measurement's directory.
DIRECTORY = "m-processes"
#: The manifest's list of them.
MANIFEST_KEY = "m_processes"
MODEL_ONLY = LevelSet("M")
#: The further processes measure at most this many iterations: M's interval is set by how the
#: processes differ more than by each one's iterations, and each costs its iterations at least
#: (1.5-1.9 s a process started after the others, ResNet-50 b64 training on the H100).
ITERATIONS = 10


def label(n: int) -> str:
    """The progress label of M's ``n``-th process."""
    return f"M#{n}"


def labelled(progress: ProgressFn | None, label: str) -> ProgressFn | None:
    """Progress of a further M process under its own label (``M#2``): the first M's bar stays."""
    if progress is None:
        return None

    def report(levels: str, phase: str, done: int, total: int) -> None:
        progress(label, phase, done, total)

    return report

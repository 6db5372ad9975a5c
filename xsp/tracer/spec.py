"""What xsp profiles and how: the one spec that flows from the CLI to the session.

Two frozen values, built once and read everywhere rather than copied field by field::

    ProfileSpec   what to run and how, the same for every level set of a measurement: the
                  workload (a zoo model or a Python command), iterations, warm-up, device,
                  which optional records to take (op shapes), where to send spans (OTLP)
    RunSpec       one level-set run: a ProfileSpec at one level set, written to one directory,
                  with its ids (and, in a multi-rank job, its rank)

``xsp run`` builds a ProfileSpec into the leveled runner's ``LeveledSpec``
(``xsp.tracer.run.runner``); the runner makes one RunSpec per level set and hands it to the
level-set process (``xsp.tracer.run.protocol.ChildSpec``: JSON in its arguments, or pickled by
the fork server, or in the environment of a multi-rank job's ranks); the process starts its
``Session`` from it (``Session.from_spec``). ``xsp.session(...)``'s keyword arguments build the
same RunSpec.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from xsp.core.levelset import LevelSet

__all__ = [
    "DEFAULT_EXPORT_EVERY_S",
    "DEFAULT_ITERATIONS",
    "DEFAULT_WARMUP",
    "ProfileSpec",
    "RunSpec",
]

DEFAULT_ITERATIONS = 10
DEFAULT_WARMUP = 2
#: How often a continuous session stores the iterations finished since its last batch.
DEFAULT_EXPORT_EVERY_S = 5.0


@dataclass(frozen=True)
class ProfileSpec:
    """What to run and how: a zoo model (``model``, ``batch_size``, ``mode``,
    ``channels_last``) or a Python command (``command``), and how each level set measures it.

    ``command`` is the program as the user gave it (``python train.py``) in a measurement's
    spec, and as a level-set process runs it (``train.py``, in xsp's own interpreter) in a
    run's. ``op_shapes``: record aten ops' input shapes and dtypes (level F; the runner leaves
    them to the deepest level set with F). ``calibrate``: time level F's own cost per record as
    the levels come on (``xsp.tracer.capture.calibrate``; the runner leaves it to the shallowest
    level set with F, whose host times the replay reads). ``counter_iterations``: the hardware-counter level
    set (MH) measures at most this many iterations (Nsight Compute replays each kernel once
    per pass: minutes for a ResNet-50 training step). ``fixes``: names from the fix registry
    (``xsp.tracer.workloads.fixes``) applied in each level-set process before the workload
    starts (``xsp run --fix``, ``xsp verify``); an unknown name raises ConfigError.
    ``numerics_probe``: record the root module's first forward pass (its inputs' checksum, its
    output's first values) for ``xsp verify`` to compare runs without and with a fix
    (``xsp.tracer.workloads.numerics``). ``interleave``: time an untraced iteration before each
    traced one, its levels switched off between them (``xsp.tracer.capture.interleave``; the
    runner leaves it to the level set that calibrates, where the level set allows it), so
    that the replay is checked against untraced steps of its own process. ``iteration_fn``: ``MODULE.QUALNAME`` of a function
    each call of which is one iteration of a command (``xsp.tracer.capture.iterations``);
    without it, optimizer steps or the root module's calls are.

    A service (``docs/serving.md``): ``iterations`` 0 measures until the program ends or is
    stopped, ``duration_s`` (with any ``iterations``) stops measuring after that many seconds
    of measurement; either makes the session continuous: finished iterations are stored (and
    sent) in batches while it runs, one every ``export_every_s`` seconds. ``sample_every`` N
    and ``sample_rate`` R (iterations per second, at most) pick the iterations that the levels
    below M record, in runs of ``sample_run`` consecutive iterations; level M records every one
    (``xsp.tracer.capture.sampling``)."""

    iterations: int = DEFAULT_ITERATIONS
    warmup: int = DEFAULT_WARMUP
    device: str | None = None
    model: str | None = None
    batch_size: int = 1
    mode: str = "infer"
    channels_last: bool = False
    command: tuple[str, ...] = field(default_factory=tuple)
    otlp_endpoint: str | None = None
    op_shapes: bool = True
    calibrate: bool = True
    interleave: bool = False
    counter_iterations: int = 1
    fixes: tuple[str, ...] = field(default_factory=tuple)
    numerics_probe: bool = False
    iteration_fn: str | None = None
    duration_s: float | None = None
    sample_every: int = 1
    sample_rate: float | None = None
    sample_run: int = 1
    export_every_s: float = DEFAULT_EXPORT_EVERY_S

    def __post_init__(self) -> None:
        from xsp.tracer.workloads import fixes

        object.__setattr__(self, "command", tuple(self.command))  # a list given: hashable
        object.__setattr__(self, "fixes", fixes.check(self.fixes))
        _check_service(self)

    @property
    def continuous(self) -> bool:
        """Measured until stopped or for a time: stored in batches while it runs."""
        return self.iterations == 0 or self.duration_s is not None

    @property
    def workload(self) -> str:
        """What runs, in words: the model's name or the command."""
        return self.model or " ".join(self.command)


def _check_service(profile: ProfileSpec) -> None:
    """ConfigError, one line, for a measurement length or sampling policy that cannot be."""
    from xsp.core.errors import ConfigError

    if profile.iterations < 0:
        raise ConfigError(
            f"bad iterations {profile.iterations}: give 1 or more, or 0 to measure until stopped"
        )
    if profile.duration_s is not None and not profile.duration_s > 0:
        raise ConfigError(f"bad duration {profile.duration_s}: give seconds above 0")
    if profile.sample_every < 1:
        raise ConfigError(f"bad sample-every {profile.sample_every}: must be at least 1")
    if profile.sample_run < 1:
        raise ConfigError(f"bad sample-run {profile.sample_run}: must be at least 1")
    if profile.sample_rate is not None and not profile.sample_rate > 0:
        raise ConfigError(
            f"bad sample-rate {profile.sample_rate}: give iterations per second above 0"
        )
    if not profile.export_every_s > 0:
        raise ConfigError(f"bad export-every {profile.export_every_s}: give seconds above 0")
    sampled = profile.sample_every > 1 or profile.sample_rate is not None or profile.sample_run > 1
    if sampled and not profile.continuous:
        raise ConfigError(
            "sampling applies to a continuous session: add --iterations 0 or a --duration"
        )


@dataclass(frozen=True)
class RunSpec:
    """One level-set run of a ProfileSpec.

    ``out``: its run directory (``RUN_DIR/<levels>``), or None to store nothing.
    ``run_id``: shared by the ranks of a multi-rank job (one trace per iteration across
    ranks); a fresh one when None. ``measurement_id``: the leveled measurement it belongs to
    (its own run id when None). ``rank``, ``world_size``: a rank of a multi-rank job.
    ``workload``: its name, stored as ``xsp.workload`` (the profile's when None)."""

    levels: LevelSet
    profile: ProfileSpec = field(default_factory=ProfileSpec)
    out: str | None = None
    measurement_id: str | None = None
    run_id: str | None = None
    rank: int | None = None
    world_size: int | None = None
    workload: str | None = None

    def with_profile(self, **changes: Any) -> RunSpec:
        """This run with some of its profile's fields changed."""
        return dataclasses.replace(self, profile=dataclasses.replace(self.profile, **changes))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the level set as its text, the profile nested."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        """The spec back from ``to_dict`` (TypeError, ValueError, KeyError on anything else)."""
        data = dict(data)
        levels = LevelSet(data.pop("levels"))
        profile = ProfileSpec(**(data.pop("profile", None) or {}))
        return cls(levels, profile, **data)

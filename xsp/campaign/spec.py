"""The campaign spec: what a campaign runs (models x batch sizes x modes, level sets, iterations),
expanded into jobs. ``xsp.campaign.files`` reads it from a campaign file.

A job is one workload (model, mode, batch size) measured at every level set, in one
``xsp run`` process tree; its id names its run directory.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import asdict, dataclass, field, fields
from typing import TypedDict, cast

from xsp.core.levelset import LevelSet

__all__ = ["DEFAULT_TIMEOUT_S", "CampaignRecord", "CampaignSpec", "Job", "from_record"]

DEFAULT_TIMEOUT_S = 900


@dataclass(frozen=True)
class Job:
    model: str
    mode: str
    batch_size: int

    @property
    def id(self) -> str:
        """A file-name-safe id: ``torchvision-resnet18__infer__b1``."""
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", self.model)
        return f"{name}__{self.mode}__b{self.batch_size}"


class CampaignRecord(TypedDict, total=False):
    """A ``CampaignSpec`` as JSON (``DIR/campaign.json``, a Ray job's argument): its fields."""

    name: str
    models: list[str]
    batch_sizes: list[int]
    modes: list[str]
    level_sets: list[str]
    iterations: int
    warmup: int
    device: str
    timeout_s: float
    counter_batch_sizes: list[int]
    counter_models: list[str]
    counter_iterations: int


@dataclass
class CampaignSpec:
    name: str
    models: list[str]
    batch_sizes: list[int]
    modes: list[str] = field(default_factory=lambda: ["infer"])
    level_sets: list[str] = field(default_factory=lambda: ["M", "MF"])
    iterations: int = 5
    warmup: int = 2
    device: str = "cuda"
    timeout_s: float = DEFAULT_TIMEOUT_S
    #: Jobs that also get the hardware-counter run (level set MH, under ncu): those at these
    #: batch sizes whose model matches one of ``counter_models`` (shell patterns; none: all).
    counter_batch_sizes: list[int] = field(default_factory=list)
    counter_models: list[str] = field(default_factory=list)
    counter_iterations: int = 1

    def counted(self, job: Job) -> bool:
        """Whether ``job`` gets a counter run."""
        if job.batch_size not in self.counter_batch_sizes:
            return False
        return not self.counter_models or any(
            fnmatch.fnmatch(job.model, pattern) for pattern in self.counter_models
        )

    def level_sets_of(self, job: Job) -> list[LevelSet]:
        """The level sets ``job`` runs: the campaign's, plus MH when it is counted (the
        campaign file's were checked when it was read)."""
        from xsp.core.schema import COUNTER_LEVEL_SET

        extra = [LevelSet(COUNTER_LEVEL_SET)] if self.counted(job) else []
        return [s for s in map(LevelSet, self.level_sets) if not s.counters] + extra

    def jobs(self) -> list[Job]:
        """Every (model, mode, batch size), models outermost, smallest batch first."""
        return [
            Job(model, mode, batch)
            for model in self.models
            for mode in self.modes
            for batch in sorted(self.batch_sizes)
        ]

    def to_dict(self) -> CampaignRecord:
        return cast(CampaignRecord, asdict(self))


def from_record(data: CampaignRecord) -> CampaignSpec:
    """The spec back from ``CampaignSpec.to_dict`` (as a campaign directory stores it; it was
    checked when its file was read)."""
    known = {f.name for f in fields(CampaignSpec)}
    return CampaignSpec(**cast(CampaignRecord, {k: v for k, v in data.items() if k in known}))

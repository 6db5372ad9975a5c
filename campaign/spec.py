"""Campaign files (TOML): what to run, expanded into jobs.

::

    [campaign]
    name = "smoke"
    device = "cpu"            # cpu or cuda
    modes = ["infer"]         # infer, train
    batch_sizes = [1, 2]
    level_sets = ["M", "MF"]
    iterations = 3
    warmup = 1
    timeout_s = 900           # per level set; past it, killed with its children: status timeout

    [models]
    names = ["torchvision:resnet18"]                       # by name
    select = [{ source = "timm", pattern = "resnet1*" }]   # and/or by zoo filter

A job is one workload (model, mode, batch size) measured at every level set, in one
``xsp run`` process tree; its id names its run directory.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tracer import schema, zoo
from tracer.errors import ConfigError

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

    def jobs(self) -> list[Job]:
        """Every (model, mode, batch size), models outermost, smallest batch first."""
        return [
            Job(model, mode, batch)
            for model in self.models
            for mode in self.modes
            for batch in sorted(self.batch_sizes)
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def from_record(data: dict[str, Any]) -> CampaignSpec:
    """The spec back from ``CampaignSpec.to_dict`` (as a campaign directory stores it)."""
    section = {k: v for k, v in data.items() if k != "models"}
    return from_dict({"campaign": section, "models": {"names": data["models"]}})


def load(path: Path) -> CampaignSpec:
    """Read and check a campaign file; ConfigError names the file and the bad value."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read campaign file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from exc
    try:
        return from_dict(data, default_name=path.stem)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def from_dict(data: dict[str, Any], default_name: str = "campaign") -> CampaignSpec:
    section = dict(data.get("campaign", {}))
    unknown = set(section) - {
        "name",
        "device",
        "modes",
        "batch_sizes",
        "level_sets",
        "iterations",
        "warmup",
        "timeout_s",
    }
    if unknown:
        raise ConfigError(f"unknown [campaign] keys {sorted(unknown)}")
    models = _models(data.get("models", {}))
    try:
        level_sets = [schema.parse_levels(str(s)) for s in section.get("level_sets", ["M", "MF"])]
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    modes = [str(m) for m in section.get("modes", ["infer"])]
    bad_modes = [m for m in modes if m not in zoo.MODES]
    if bad_modes:
        raise ConfigError(f"bad modes {bad_modes}: use train and/or infer")
    batch_sizes = [int(b) for b in section.get("batch_sizes", [1])]
    if not batch_sizes or min(batch_sizes) < 1:
        raise ConfigError(f"bad batch_sizes {batch_sizes}: give positive integers")
    device = str(section.get("device", "cuda"))
    if device != "cpu" and not device.startswith("cuda"):
        raise ConfigError(f"bad device {device!r}: use cpu or cuda")
    spec = CampaignSpec(
        name=str(section.get("name", default_name)),
        models=models,
        batch_sizes=batch_sizes,
        modes=modes,
        level_sets=level_sets,
        iterations=int(section.get("iterations", 5)),
        warmup=int(section.get("warmup", 2)),
        device=device,
        timeout_s=float(section.get("timeout_s", DEFAULT_TIMEOUT_S)),
    )
    if spec.iterations < 1 or spec.warmup < 0 or spec.timeout_s <= 0:
        raise ConfigError("iterations must be >= 1, warmup >= 0 and timeout_s > 0")
    return spec


def _models(section: dict[str, Any]) -> list[str]:
    """Model names in file order, then the zoo filters' matches; duplicates dropped. Names are
    kept even when the zoo does not know them: the job records that failure and moves on."""
    names = [str(n) for n in section.get("names", [])]
    for selector in section.get("select", []):
        if not isinstance(selector, dict) or set(selector) - {"source", "pattern", "task"}:
            raise ConfigError(f"bad models.select entry {selector!r}: keys source, pattern, task")
        entries = zoo.list_models(selector.get("source"), selector.get("pattern"))
        task = selector.get("task")
        names += [e.qualified for e in entries if task is None or e.task == task]
    unique = list(dict.fromkeys(names))
    if not unique:
        raise ConfigError("no models: give [models] names or select")
    return unique

"""Campaign files (TOML), read and checked into a ``CampaignSpec``.

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

    [counters]                # optional: hardware counters (level set MH, Nsight Compute)
    batch_sizes = [64]        # jobs at these batch sizes get a counter run
    models = ["torchvision:resnet*"]   # of these models (shell patterns; default: all)
    iterations = 1            # iterations it measures (each kernel replayed per pass)

Model names are kept even when the zoo does not know them (the job records that failure);
zoo filters are resolved here, which is why reading a file needs the zoo and a stored spec
(``xsp.campaign.spec.from_record``) does not.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import cast

from xsp.campaign.spec import DEFAULT_TIMEOUT_S, CampaignSpec
from xsp.core.errors import ConfigError
from xsp.core.levelset import LevelSet
from xsp.tracer.workloads import names as zoo_names

__all__ = ["Table", "from_dict", "load"]


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


#: A campaign file's table, or the file itself: open keys, what the user wrote (each key is
#: checked where it is read, unknown ones refused).
Table = Mapping[str, object]


def _table(data: Table, key: str) -> dict[str, object]:
    """The table ``key`` of ``data`` (TOML: a table), empty when absent."""
    return dict(cast(Table, data.get(key, {})))


def from_dict(data: Table, default_name: str = "campaign") -> CampaignSpec:
    section = _table(data, "campaign")
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
    models = _models(cast(Table, data.get("models", {})))
    try:
        level_sets = [LevelSet(s) for s in _strings(section, "level_sets", ["M", "MF"])]
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    modes = _strings(section, "modes", ["infer"])
    bad_modes = [m for m in modes if m not in zoo_names.MODES]
    if bad_modes:
        raise ConfigError(f"bad modes {bad_modes}: use train and/or infer")
    batch_sizes = _integers(section, "batch_sizes", [1])
    if not batch_sizes or min(batch_sizes) < 1:
        raise ConfigError(f"bad batch_sizes {batch_sizes}: give positive integers")
    device = _string(section, "device", "cuda")
    if device != "cpu" and not device.startswith("cuda"):
        raise ConfigError(f"bad device {device!r}: use cpu or cuda")
    spec = CampaignSpec(
        name=_string(section, "name", default_name),
        models=models,
        batch_sizes=batch_sizes,
        modes=modes,
        level_sets=list(dict.fromkeys(level_sets)),
        iterations=_integer(section, "iterations", 5),
        warmup=_integer(section, "warmup", 2),
        device=device,
        timeout_s=_number(section, "timeout_s", DEFAULT_TIMEOUT_S),
    )
    if spec.iterations < 1 or spec.warmup < 0 or spec.timeout_s <= 0:
        raise ConfigError("iterations must be >= 1, warmup >= 0 and timeout_s > 0")
    _counters(_table(data, "counters"), spec)
    return spec


# -- typed values: TOML has types; a string where a number belongs is refused, not converted ----
def _integer(section: Table, key: str, default: int) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"bad {key} {value!r}: give an integer")
    return value


def _number(section: Table, key: str, default: float) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"bad {key} {value!r}: give a number")
    return float(value)


def _string(section: Table, key: str, default: str) -> str:
    value = section.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"bad {key} {value!r}: give a string")
    return value


def _integers(section: Table, key: str, default: list[int]) -> list[int]:
    """A list of integers, each once, in file order."""
    values = section.get(key, default)
    if not isinstance(values, list) or any(
        isinstance(v, bool) or not isinstance(v, int) for v in values
    ):
        raise ConfigError(f"bad {key} {values!r}: give a list of integers, e.g. [1, 16]")
    return list(dict.fromkeys(values))


def _strings(section: Table, key: str, default: list[str]) -> list[str]:
    """A list of strings, each once, in file order."""
    values = section.get(key, default)
    if not isinstance(values, list) or any(not isinstance(v, str) for v in values):
        raise ConfigError(f"bad {key} {values!r}: give a list of strings")
    return list(dict.fromkeys(values))


def _counters(section: Table, spec: CampaignSpec) -> None:
    """The optional [counters] table onto ``spec``."""
    unknown = set(section) - {"batch_sizes", "models", "iterations"}
    if unknown:
        raise ConfigError(f"unknown [counters] keys {sorted(unknown)}")
    try:
        spec.counter_batch_sizes = _integers(section, "batch_sizes", [])
        spec.counter_models = _strings(section, "models", [])
        spec.counter_iterations = _integer(section, "iterations", 1)
    except ConfigError as exc:
        raise ConfigError(f"bad [counters]: {exc}") from exc
    if spec.counter_iterations < 1 or any(b < 1 for b in spec.counter_batch_sizes):
        raise ConfigError("[counters] iterations and batch_sizes must be positive")


def _models(section: Table) -> list[str]:
    """Model names in file order, then the zoo filters' matches; duplicates dropped. Names are
    kept even when the zoo does not know them: the job records that failure and moves on."""
    names = _strings(section, "names", [])
    for selector in cast(Iterable[object], section.get("select", [])):  # entries checked here
        if not isinstance(selector, dict) or set(selector) - {"source", "pattern", "task"}:
            raise ConfigError(f"bad models.select entry {selector!r}: keys source, pattern, task")
        entries = zoo_names.list_models(selector.get("source"), selector.get("pattern"))
        task = selector.get("task")
        names += [e.qualified for e in entries if task is None or e.task == task]
    unique = list(dict.fromkeys(names))
    if not unique:
        raise ConfigError("no models: give [models] names or select")
    return unique

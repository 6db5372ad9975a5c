"""The zoo's model names, known without importing torch.

Names are ``SOURCE:NAME``. The transformers models are the families listed here. The names
torchvision and timm register are known only once they are imported, which imports torch:
seconds before ``xsp run --model`` could say that a name is unknown. So a catalogue of them,
``zoo_names.json``, is kept beside this module, per library one entry for each version it was
read from (the dev machine's and the GPU image's): where one is the installed version, names are
read from it, and otherwise from the libraries themselves. The libraries stay the one source of
truth: ``python -m xsp.tracer.workloads.names`` adds or rewrites the installed versions' entries
from them, and ``tests/test_zoo.py`` checks the installed one against them.
"""

from __future__ import annotations

import fnmatch
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias, TypedDict

from xsp.core.errors import ConfigError, WorkloadError

__all__ = [
    "CATALOGUE",
    "CATALOGUED",
    "MODES",
    "SOURCES",
    "TRANSFORMERS_SEQ2SEQ",
    "TRANSFORMERS_SIZED",
    "TRANSFORMERS_TEXT",
    "TRANSFORMERS_VISION",
    "Catalogue",
    "CatalogueEntry",
    "ZooEntry",
    "catalogue_from_libraries",
    "catalogued_version",
    "find",
    "installed_version",
    "library_entries",
    "list_models",
]

SOURCES = ("torchvision", "timm", "transformers")
MODES = ("train", "infer")

# transformers model types built from their default configuration (the base-size model of each
# family), with the inputs each takes.
TRANSFORMERS_TEXT = ("bert", "distilbert", "roberta", "albert", "electra", "gpt2", "xlnet", "mpnet")
TRANSFORMERS_SEQ2SEQ = ("t5", "bart")
TRANSFORMERS_VISION = ("vit", "deit", "swin", "convnext")
#: Sized transformers: zoo name -> (model type, configuration, sequence length). ``llama-1b`` has
#: TinyLlama's shape (1.03B parameters without its LM head, 22 layers): a model of the size
#: users trace today, for the H200 with ``--fix bf16``.
TRANSFORMERS_SIZED: dict[str, tuple[str, dict[str, int], int]] = {
    "llama-1b": (
        "llama",
        {
            "hidden_size": 2048,
            "intermediate_size": 5632,
            "num_hidden_layers": 22,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "vocab_size": 32000,
        },
        1024,
    ),
}

#: The sources whose names come from their library (imported) or the catalogue.
CATALOGUED = ("torchvision", "timm")
CATALOGUE = Path(__file__).with_name("zoo_names.json")


@dataclass(frozen=True)
class ZooEntry:
    source: str
    name: str
    task: str

    @property
    def qualified(self) -> str:
        return f"{self.source}:{self.name}"


def list_models(source: str | None = None, pattern: str | None = None) -> list[ZooEntry]:
    """Every zoo model, optionally of one source and matching a shell-style ``pattern``."""
    if source is not None and source not in SOURCES:
        raise ConfigError(f"unknown zoo source {source!r}: use one of {', '.join(SOURCES)}")
    entries: list[ZooEntry] = []
    for each in CATALOGUED:
        if source in (None, each):
            entries += _catalogued(each) or library_entries(each)
    if source in (None, "transformers"):
        entries += [ZooEntry("transformers", n, "text") for n in TRANSFORMERS_TEXT]
        entries += [ZooEntry("transformers", n, "text") for n in TRANSFORMERS_SIZED]
        entries += [ZooEntry("transformers", n, "seq2seq") for n in TRANSFORMERS_SEQ2SEQ]
        entries += [ZooEntry("transformers", n, "vision") for n in TRANSFORMERS_VISION]
    if pattern:
        entries = [e for e in entries if fnmatch.fnmatch(e.qualified, f"*{pattern}*")]
    return entries


def find(name: str) -> ZooEntry:
    """The zoo entry of ``SOURCE:NAME``; WorkloadError saying what is wrong with the name."""
    source, sep, model = name.partition(":")
    if not sep or not model:
        raise WorkloadError(
            f"bad model name {name!r}: write SOURCE:NAME, e.g. torchvision:resnet50"
        )
    if source not in SOURCES:
        raise WorkloadError(
            f"unknown model source {source!r} in {name!r}: use one of {', '.join(SOURCES)}"
        )
    for entry in list_models(source):
        if entry.name == model:
            return entry
    raise WorkloadError(
        f"unknown model {name!r}: `xsp models --source {source}` lists the known ones"
    )


def library_entries(source: str) -> list[ZooEntry]:
    """The models ``source`` (torchvision or timm) registers, from the library itself (it
    imports torch)."""
    try:
        if source == "torchvision":
            from torchvision import models

            return [
                ZooEntry("torchvision", n, "classification")
                for n in models.list_models(module=models)
            ] + [
                ZooEntry("torchvision", n, "segmentation")
                for n in models.list_models(module=models.segmentation)
            ]
        import timm

        return [ZooEntry("timm", n, "classification") for n in timm.list_models()]
    except ImportError as exc:
        raise WorkloadError(f"the zoo's {source} models need {source}: {exc}") from exc


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (read from its metadata: nothing is imported),
    None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


class CatalogueEntry(TypedDict):
    """A source's names as one version of it lists them (``zoo_names.json``)."""

    version: str | None
    tasks: dict[str, list[str]]  # task -> model names


#: ``zoo_names.json``: "about" (a line on what it is), then per source its entries.
Catalogue: TypeAlias = dict[str, str | list[CatalogueEntry]]


def catalogued_version(source: str, version: str | None) -> CatalogueEntry | None:
    """The catalogue's entry of ``source`` read from ``version`` of it, if it has one."""
    listed = _catalogue().get(source)
    for entry in listed if isinstance(listed, list) else []:
        if isinstance(entry, dict) and entry.get("version") == version:
            return entry
    return None


def _catalogued(source: str) -> list[ZooEntry]:
    """The catalogue's names of ``source`` for its installed version, or none where the
    catalogue was not read from that version."""
    listed = catalogued_version(source, installed_version(source))
    if listed is None:
        return []
    return [ZooEntry(source, n, task) for task, names in listed["tasks"].items() for n in names]


@functools.cache
def _catalogue() -> Catalogue:
    try:
        data = json.loads(CATALOGUE.read_text())
    except (OSError, ValueError):  # missing or damaged: the libraries answer, only slower
        return {}
    return data if isinstance(data, dict) else {}


def catalogue_from_libraries() -> Catalogue:
    """The catalogue with the installed libraries' entries added (or rewritten): per source,
    per version read, its model names per task. Other versions' entries stay."""
    data: Catalogue = {
        "about": "the zoo's torchvision and timm names, per version of each; written by "
        "`python -m xsp.tracer.workloads.names`, checked by tests/test_zoo.py",
    }
    for source in CATALOGUED:
        tasks: dict[str, list[str]] = {}
        for entry in library_entries(source):
            tasks.setdefault(entry.task, []).append(entry.name)
        version = installed_version(source)
        kept = [
            e
            for e in (_catalogue().get(source) or [])
            if isinstance(e, dict) and e.get("version") != version
        ]
        data[source] = sorted(
            [*kept, {"version": version, "tasks": tasks}], key=lambda e: str(e["version"])
        )
    return data


if __name__ == "__main__":
    CATALOGUE.write_text(json.dumps(catalogue_from_libraries(), indent=0) + "\n")
    print(f"wrote {CATALOGUE}")

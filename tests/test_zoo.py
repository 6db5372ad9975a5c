from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from xsp.core.errors import ConfigError, WorkloadError
from xsp.tracer.workloads import names, zoo


def test_names_resolve_and_unknown_ones_are_reported() -> None:
    assert zoo.find("torchvision:resnet50").task == "classification"
    assert zoo.find("transformers:bert").task == "text"
    with pytest.raises(WorkloadError, match="unknown model 'timm:nope'"):
        zoo.find("timm:nope")
    with pytest.raises(WorkloadError, match="write SOURCE:NAME"):
        zoo.find("resnet50")
    with pytest.raises(WorkloadError, match="unknown model source 'keras'"):
        zoo.find("keras:resnet50")
    with pytest.raises(ConfigError, match="'keras'"):
        names.list_models("keras")


def test_listing_covers_the_three_sources() -> None:
    entries = names.list_models()
    sources = {e.source for e in entries}
    assert sources == {"torchvision", "timm", "transformers"}
    assert [e.qualified for e in names.list_models("torchvision", "resnet18")] == [
        "torchvision:resnet18"
    ]
    assert any(e.task == "segmentation" for e in entries)


@pytest.mark.parametrize("source", names.CATALOGUED)
def test_the_catalogue_of_names_is_the_installed_librarys(source: str) -> None:
    """The catalogue that answers without torch holds what the library registers: after an
    upgrade, `python -m xsp.tracer.workloads.names` rewrites it."""
    catalogue = names.catalogued_version(source, names.installed_version(source))
    assert catalogue is not None, "add the installed version: python -m xsp.tracer.workloads.names"
    listed = [(task, n) for task, models in catalogue["tasks"].items() for n in models]
    assert listed == [(e.task, e.name) for e in names.library_entries(source)]
    assert names.list_models(source) == names.library_entries(source)


def test_names_come_from_the_catalogue_of_the_installed_version_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catalogue of the installed timm is believed (here a doctored one: one model of a
    made-up name); one of another version is not, and timm itself answers."""
    doctored = tmp_path / "zoo_names.json"
    version = names.installed_version("timm")
    entry = {"version": version, "tasks": {"x": ["made_up"]}}
    doctored.write_text(json.dumps({"timm": [{"version": "0.0.0", "tasks": {}}, entry]}))
    monkeypatch.setattr(names, "CATALOGUE", doctored)
    names._catalogue.cache_clear()
    try:
        assert names.find("timm:made_up") == names.ZooEntry("timm", "made_up", "x")
        with pytest.raises(WorkloadError, match="unknown model 'timm:resnet18'"):
            names.find("timm:resnet18")
        monkeypatch.setattr(names, "installed_version", lambda distribution: "0.0.1")
        assert names.find("timm:resnet18").task == "classification"  # timm's own list
        with pytest.raises(WorkloadError, match="unknown model 'timm:made_up'"):
            names.find("timm:made_up")
    finally:
        names._catalogue.cache_clear()


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("torchvision:mobilenet_v3_small", "train"),
        ("timm:test_vit", "train"),
        ("transformers:bert", "infer"),
        ("transformers:t5", "train"),
    ],
)
def test_workloads_build_and_step_with_random_weights(name: str, mode: str) -> None:
    workload = zoo.build(name, 2, mode, "cpu")
    before = [p.detach().clone() for p in workload.model.parameters()][:3]
    workload.step()
    after = list(workload.model.parameters())[:3]
    changed = any(not torch.equal(a, b) for a, b in zip(before, after, strict=False))
    assert changed == (mode == "train")


def test_bad_workload_options() -> None:
    with pytest.raises(ConfigError, match="bad mode 'eval'"):
        zoo.build("torchvision:resnet18", 1, "eval")
    with pytest.raises(ConfigError, match="bad batch size 0"):
        zoo.build("torchvision:resnet18", 0, "infer")


def test_the_fork_servers_preload_imports_every_transformers_familys_modeling_code() -> None:
    # a fresh interpreter: the test process may have imported some of them already
    code = (
        "import sys, torch; import xsp.tracer.workloads.preload; "
        "from xsp.tracer.workloads import names as zoo; "
        "names = zoo.TRANSFORMERS_TEXT + zoo.TRANSFORMERS_SEQ2SEQ + zoo.TRANSFORMERS_VISION; "
        "print(sum(f'transformers.models.{n}.modeling_{n}' in sys.modules for n in names), "
        "len(names), torch.cuda.is_initialized())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["14", "14", "False"]


def test_the_sized_llama_has_a_billion_parameters_and_long_sequences() -> None:
    from transformers import AutoConfig, AutoModel

    entry = zoo.find("transformers:llama-1b")
    with torch.device("meta"):  # counted without allocating 4.4 GB
        model = AutoModel.from_config(zoo.transformers_config(entry, AutoConfig))
    params = sum(p.numel() for p in model.parameters())
    # TinyLlama's shape: embeddings 32000 x 2048, 22 layers of attention (q, o: 2048^2; k, v
    # with 4 of 32 heads: 2048 x 256) and MLP (3 x 2048 x 5632), two RMSNorms each, a final one
    per_layer = 2 * 2048 * 2048 + 2 * 2048 * 256 + 3 * 2048 * 5632 + 2 * 2048
    assert params == 32000 * 2048 + 22 * per_layer + 2048 == 1_034_512_384

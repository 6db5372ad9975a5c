from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from xsp.tracer.errors import ConfigError, WorkloadError
from xsp.tracer.workloads import zoo


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
        zoo.list_models("keras")


def test_listing_covers_the_three_sources() -> None:
    entries = zoo.list_models()
    sources = {e.source for e in entries}
    assert sources == {"torchvision", "timm", "transformers"}
    assert [e.qualified for e in zoo.list_models("torchvision", "resnet18")] == [
        "torchvision:resnet18"
    ]
    assert any(e.task == "segmentation" for e in entries)


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
        "from xsp.tracer.workloads import zoo; "
        "names = zoo.TRANSFORMERS_TEXT + zoo.TRANSFORMERS_SEQ2SEQ + zoo.TRANSFORMERS_VISION; "
        "print(sum(f'transformers.models.{n}.modeling_{n}' in sys.modules for n in names), "
        "len(names), torch.cuda.is_initialized())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["14", "14", "False"]

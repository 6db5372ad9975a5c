"""The device a run gets, decided by the runner without importing torch (xsp.core.devices):
the same answer torch gives, and no torch import in the runner's process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from xsp.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from xsp.core import devices
from xsp.tracer.run.plan import LeveledSpec, validate
from xsp.tracer.spec import ProfileSpec

answer = {{"cuda": devices.torch_cuda_version(), "available": devices.cuda_available(),
          "auto": devices.resolve_device(None)}}
validate(LeveledSpec(out=Path({out!r}), profile=ProfileSpec(model="torchvision:resnet18", device="cpu")))
answer["torch_imported"] = "torch" in sys.modules
print(json.dumps(answer))
"""


def test_the_runner_decides_the_device_as_torch_would_without_importing_it(
    tmp_path: Path,
) -> None:
    code = PROBE.format(root=str(ROOT), out=str(tmp_path / "R"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer == {
        "cuda": torch.version.cuda,
        "available": torch.cuda.is_available(),
        "auto": "cuda" if torch.cuda.is_available() else "cpu",
        "torch_imported": False,
    }


def test_a_bad_device_is_named() -> None:
    from xsp.core.devices import resolve_device

    with pytest.raises(ConfigError, match="bad device 'tpu': use cpu or cuda"):
        resolve_device("tpu")

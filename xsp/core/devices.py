"""Which device a run gets: ``None`` picks CUDA when a GPU is visible, a named CUDA device must
exist.

The leveled runner decides before it starts any process, and importing torch there would cost
seconds (2.7 s on the dev machine) that the level-set processes then pay again. So where torch is
not imported yet, the answer comes from torch's own ``version.py`` (whether this build has CUDA)
and the CUDA driver (``cuInit`` and ``cuDeviceGetCount``, which honour ``CUDA_VISIBLE_DEVICES``
as torch does); a process that has torch asks it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
import sys
from functools import cache
from pathlib import Path

from xsp.core.errors import ConfigError, DeviceError

__all__ = ["cuda_available", "resolve_device", "torch_cuda_version"]

_VERSION_LINE = re.compile(r"^cuda\b[^=]*=\s*(?:None|['\"]([^'\"]*)['\"])", re.MULTILINE)


def torch_cuda_version() -> str | None:
    """``torch.version.cuda``: the CUDA version this torch was built with, None without CUDA."""
    if "torch" in sys.modules:
        return sys.modules["torch"].version.cuda
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return None
    found = _VERSION_LINE.search(text)
    return found.group(1) if found else None


@cache
def _driver_device_count() -> int:
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def cuda_available() -> bool:
    """``torch.cuda.is_available()``, without importing torch where it is not imported yet."""
    if "torch" in sys.modules:
        return bool(sys.modules["torch"].cuda.is_available())
    return torch_cuda_version() is not None and _driver_device_count() > 0


def resolve_device(device: str | None) -> str:
    """``None`` picks cuda when present; a named CUDA device must exist."""
    if device is None:
        return "cuda" if cuda_available() else "cpu"
    if device == "cpu":
        return device
    if device.startswith("cuda"):
        if not cuda_available():
            reason = (
                "this torch build has no CUDA"
                if torch_cuda_version() is None
                else "no CUDA GPU is visible"
            )
            raise DeviceError(f"--device {device}: {reason} (torch.cuda.is_available() is False)")
        return device
    raise ConfigError(f"bad device {device!r}: use cpu or cuda[:N]")

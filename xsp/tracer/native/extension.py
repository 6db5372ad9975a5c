"""Building and loading xsp's native extensions, shared by the capture core (``build``) and the
collector door's check (``xsp.collector.door``); torch-free, so that the collector never reaches
torch through it."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.machinery
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from xsp.tracer.errors import XspError


class NativeBuildError(XspError):
    """A native extension (the capture core, the collector door's check) cannot be built or
    loaded here."""


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """One builder at a time: the level-set processes of a run may all start cold, and so may
    several collectors."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def import_extension(name: str, path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module

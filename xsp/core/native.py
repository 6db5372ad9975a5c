"""Building and loading xsp's native extensions, shared by the capture core (``build``) and the
collector's C modules (``xsp.collector.door``, ``xsp.collector.span_columns``); torch-free, so
that the collector never reaches torch through it."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

from xsp.core import config
from xsp.core.errors import XspError

__all__ = [
    "NativeBuildError",
    "import_extension",
    "load_c_module",
    "loaded_capture",
    "locked",
    "optional_c_module",
    "register_capture",
]

log = logging.getLogger(__name__)


class NativeBuildError(XspError):
    """A native extension (the capture core, one of the collector's C modules) cannot be built
    or loaded here."""


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


_capture: ModuleType | None = None


def register_capture(module: ModuleType) -> None:
    """Record the native capture module once the capture stage has loaded it."""
    global _capture
    _capture = module


def loaded_capture() -> ModuleType | None:
    """The native capture module if this process has loaded it already (a traced process), else
    None: conversion elsewhere (the runner, a recovery) neither imports torch nor builds it."""
    return _capture


def import_extension(name: str, path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load_c_module(source: Path, what: str) -> ModuleType:
    """The plain CPython module (no torch) of one C ``source``, named after its file
    (``xsp_<stem>``): built first, with the C compiler Python was built with, into
    ``XSP_NATIVE_DIR``, once per source, the headers beside it and this Python. ``what`` names
    it in errors ("the collector's native check")."""
    name = f"xsp_{source.stem}"
    digest = hashlib.sha256(source.read_bytes())
    for header in sorted(source.parent.glob("*.h")):
        digest.update(header.read_bytes())
    digest.update(sys.version.encode())
    directory = config.native_dir() / f"{source.stem}-{digest.hexdigest()[:16]}"
    built = directory / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    if not built.is_file():
        with locked(directory):
            if not built.is_file():
                _build_c(source, built, what)
    try:
        return import_extension(name, built)
    except ImportError as exc:
        raise NativeBuildError(f"{what} ({built}) cannot be loaded: {exc}") from exc


def optional_c_module(
    source: Path, what: str, switch: str, keys: Sequence[tuple[str, int, int, int]], fallback: str
) -> ModuleType | None:
    """A collector's C module (``load_c_module``), configured with ``keys``; None where its
    on/off ``switch`` (on by default) is off, or where it cannot be built here: then said once,
    with what is done instead (``fallback``)."""
    if not config.switch(switch, True):
        return None
    try:
        module = load_c_module(source, what)
    except NativeBuildError as exc:
        log.warning("xsp collector: %s; %s", exc, fallback)
        return None
    module.configure(keys)
    return module


def _build_c(source: Path, built: Path, what: str) -> None:
    compiler = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not compiler or shutil.which(compiler[0]) is None:
        raise NativeBuildError(f"{what} needs a C compiler and none was found ({compiler[0]})")
    partial = built.with_suffix(".partial")
    command = [
        *compiler,
        "-O2",
        "-shared",
        "-fPIC",
        f"-I{sysconfig.get_paths()['include']}",
        str(source),
        "-o",
        str(partial),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        log_path = built.parent / "build.log"
        log_path.write_text(done.stderr)
        first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr)
        raise NativeBuildError(f"building {what} failed: {first.strip()[:200]} (log: {log_path})")
    partial.rename(built)  # whole or not at all: a reader never loads a half-written library

"""The environment of a level-set process: the runner's, the spec's, what its levels need, the
measurement's own inductor cache, and the settings that keep a shared host's GPUs in service."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from xsp.core.levelset import LevelSet
from xsp.tracer.run.plan import LeveledSpec

#: Forced into every process the runner starts, whatever the caller's environment or a spec's
#: own says: NVLink multicast (NVLS) in NCCL, PyTorch's symmetric memory and NVSHMEM can put a
#: shared host's GPUs out of service for everyone, so xsp never lets a traced job switch it on.
SHARED_HOST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

#: Inductor's cache directory. A leveled measurement gets one of its own, unless the caller's
#: environment names one: its first level set compiles a torch.compile'd program and saves it
#: there with its kernels' provenance, the others load it (``xsp.tracer.capture.hooks.inductor``).
COMPILE_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
#: Inductor starts its compile workers (a process per core, each importing torch) whenever a
#: program compiles or loads a compiled graph, since loading its Triton kernels goes through
#: them too, and the process's exit waits for them: 6-13 s after a warm-cache ResNet-18's loop on
#: the H200, against 3.2-3.5 s after a cold one that used them. A level set after the first
#: loads what the first compiled, so there inductor compiles in the process itself (torch's own
#: setting; the user's wins).
COMPILE_THREADS_ENV = "TORCHINDUCTOR_COMPILE_THREADS"


def child_environment(spec: LeveledSpec, levels: LevelSet) -> dict[str, str]:
    """The environment of the level-set process of ``levels``: the runner's, the spec's own
    (a campaign's CUDA_VISIBLE_DEVICES), what the levels need, and ``SHARED_HOST_ENV`` last, so
    that nothing overrides it."""
    env = {**os.environ, **spec.env}
    env.update(_level_environment(spec, levels, env))
    return {**env, "PYTHONUNBUFFERED": "1", **SHARED_HOST_ENV}


def _level_environment(
    spec: LeveledSpec, levels: LevelSet, environ: Mapping[str, str]
) -> dict[str, str]:
    """What the levels need in the environment before the child's libraries start; the user's
    own settings win."""
    from xsp.core.devices import resolve_device
    from xsp.tracer.capture.levels import LevelContext, level_environment

    device = resolve_device(spec.profile.device)
    needed = level_environment(LevelContext(device, levels))
    return {k: v for k, v in needed.items() if k not in environ}


def own_compile_cache(spec: LeveledSpec) -> str | None:
    """A fresh inductor cache directory for the measurement, so that what it compiles is
    neither read from nor left in the user's cache; None where the caller names one."""
    if COMPILE_CACHE_ENV in os.environ or COMPILE_CACHE_ENV in spec.env:
        return None
    return tempfile.mkdtemp(prefix="xsp-compile-")


def later(spec: LeveledSpec, index: int) -> LeveledSpec:
    """The spec of the ``index``-th level set: after the first, once the inductor cache holds
    what it compiled, inductor has no compile workers (``COMPILE_THREADS_ENV``). A first level
    set that saved nothing (it failed first) leaves the next one its workers to compile with."""
    if index == 0 or COMPILE_THREADS_ENV in os.environ or COMPILE_THREADS_ENV in spec.env:
        return spec
    cache = spec.env.get(COMPILE_CACHE_ENV) or os.environ.get(COMPILE_CACHE_ENV)
    if not cache or not _holds_files(Path(cache)):
        return spec
    return dataclasses.replace(spec, env={**spec.env, COMPILE_THREADS_ENV: "1"})


def _holds_files(directory: Path) -> bool:
    try:
        return any(p.is_file() for p in directory.rglob("*"))
    except OSError:
        return False


__all__ = [
    "COMPILE_CACHE_ENV",
    "COMPILE_THREADS_ENV",
    "SHARED_HOST_ENV",
    "child_environment",
    "later",
    "own_compile_cache",
]

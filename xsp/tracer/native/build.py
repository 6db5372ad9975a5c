"""Build and load xsp's native capture core (``capture.cpp``) against the installed torch.

The build runs once per (source, torch, Python, CUPTI) combination, through torch's own extension
builder, into ``XSP_NATIVE_DIR`` (default ``~/.cache/xsp/native``): a torch upgrade or a source
change selects a new directory, so it rebuilds by itself. Later loads import the built library
directly. CUPTI (levels L and G) is compiled in when torch is a CUDA build and CUPTI's headers
and library are found, in the wheels torch depends on (``nvidia/cu13``, ``nvidia/cuda_cupti``)
or under ``CUDA_HOME``. No binary is kept in git.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from xsp.core import config
from xsp.core.native import NativeBuildError, import_extension, locked, register_capture

__all__ = ["CFLAGS", "SOURCE", "Cupti", "find_cupti", "load"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("capture.cpp")
#: NDEBUG as torch itself is built: ATen's headers add debug-only members to RecordFunction
#: without it, and the extension would then disagree with libtorch about its layout.
CFLAGS = ("-O2", "-DNDEBUG")


@dataclass(frozen=True)
class Cupti:
    include: Path
    library: Path  # the libcupti.so that NVTX must load as its injection library too
    crt: Path  # the directory holding crt/host_defines.h, which CUDA 13's wheels ship apart


def _site_roots() -> list[Path]:
    roots = [Path(p) for p in sys.path if p] + [Path(sysconfig.get_paths()["purelib"])]
    return list(dict.fromkeys(r for r in roots if r.is_dir()))


@functools.lru_cache(maxsize=1)
def find_cupti() -> Cupti | None:
    """CUPTI's headers and library, or None. Reads no torch."""
    candidates: list[tuple[Path, Path]] = []
    for root in _site_roots():
        for sub in ("nvidia/cu13", "nvidia/cu12", "nvidia/cuda_cupti"):
            candidates.append((root / sub / "include", root / sub / "lib"))
    cuda_home = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
    candidates.append((cuda_home / "extras/CUPTI/include", cuda_home / "extras/CUPTI/lib64"))
    for include, lib in candidates:
        if not (include / "cupti.h").is_file():
            continue
        libraries = sorted(lib.glob("libcupti.so*"), key=lambda p: len(p.name))
        crt = _find_crt([include, cuda_home / "include"])
        if libraries and crt is not None:
            return Cupti(include, libraries[0].resolve(), crt)
    return None


def _find_crt(first: list[Path]) -> Path | None:
    """cupti.h reaches crt/host_defines.h through the runtime's type headers; CUDA 13's wheels
    put it in nvidia-cuda-crt, which torch does not pull in, while triton's CUDA headers hold
    a copy (host-only macros, the same across a major release)."""
    places = first + [root / "triton/backends/nvidia/include" for root in _site_roots()]
    return next((p for p in places if (p / "crt" / "host_defines.h").is_file()), None)


def _key(with_cupti: Cupti | None) -> str:
    import torch

    digest = hashlib.sha256(SOURCE.read_bytes())
    parts = (torch.__version__, torch.version.cuda or "cpu", sys.version, str(with_cupti), *CFLAGS)
    for part in parts:
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def _compiler() -> str:
    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(compiler) is None:
        raise NativeBuildError(
            f"xsp's native capture needs a C++ compiler and none was found ({compiler}): "
            "install g++ or set CXX"
        )
    return compiler


@functools.lru_cache(maxsize=1)
def load() -> ModuleType:
    """The native capture module, built first if this torch has none yet."""
    module = _load()
    register_capture(module)
    return module


def _load() -> ModuleType:
    import torch  # the extension links against the loaded libtorch

    cupti = find_cupti() if torch.version.cuda else None
    key = _key(cupti)
    name = f"xsp_capture_{key}"
    directory = config.native_dir() / key
    built = directory / f"{name}.so"
    if not built.is_file():
        with locked(directory):
            if not built.is_file():
                return _build(name, directory, cupti)
    try:
        return import_extension(name, built)
    except ImportError as exc:
        raise NativeBuildError(f"xsp's native capture ({built}) cannot be loaded: {exc}") from exc


def _build(name: str, directory: Path, cupti: Cupti | None) -> ModuleType:
    os.environ.setdefault("CXX", _compiler())
    # torch's builder runs ninja from PATH; the ninja wheel installs it beside this Python
    here = str(Path(sys.executable).parent)
    if here not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([here, os.environ.get("PATH", "")])
    if shutil.which("ninja") is None:
        raise NativeBuildError(
            "xsp's native capture is built with ninja and none was found: pip install ninja"
        )
    from torch.utils import cpp_extension

    flags, includes, ldflags = list(CFLAGS), [], []
    if cupti is not None:
        flags.append("-DXSP_WITH_CUPTI")
        includes += [str(cupti.include), str(cupti.crt)]
        ldflags = [str(cupti.library), f"-Wl,-rpath,{cupti.library.parent}"]
    print(
        f"xsp: building the native capture core once for torch "
        f"{cpp_extension.torch.__version__} ({'with' if cupti else 'without'} CUPTI) "
        f"in {directory} ...",
        file=sys.stderr,
        flush=True,
    )
    log_path = directory / "build.log"
    try:  # quiet: the compiler's output goes into the error, never onto the user's terminal
        module: ModuleType = cpp_extension.load(
            name=name,
            sources=[str(SOURCE)],
            extra_cflags=flags,
            extra_include_paths=includes,
            extra_ldflags=ldflags,
            build_directory=str(directory),
            verbose=False,
        )
        return module
    except Exception as exc:
        first = next((line for line in str(exc).splitlines() if "error" in line), str(exc))
        log_path.write_text(str(exc))
        raise NativeBuildError(
            f"building xsp's native capture failed: {first.strip()[:200]} (log: {log_path})"
        ) from exc

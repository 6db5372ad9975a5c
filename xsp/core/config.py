"""xsp's own ``XSP_*`` environment switches, read in one place.

Each is read when it is used, never at import, so that a bad value fails as one line: a
``ConfigError`` that names the variable and the value (``XSP_CUPTI_BUFFER_MB='lots': ...``).
``check()`` reads them all, so that ``xsp run`` refuses a bad value before any process starts.
The OpenTelemetry exporter variables (``OTEL_EXPORTER_OTLP_*``) are read by
``xsp.core.otlp.transport.OtlpConfig``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from xsp.core.errors import ConfigError

__all__ = [
    "COUNTER_SETS",
    "DEFAULT_ARENA_MB",
    "DEFAULT_CUPTI_BUFFER_MB",
    "DEFAULT_M_PROCESSES",
    "MAX_ARENA_MB",
    "MAX_CUPTI_BUFFER_MB",
    "MAX_M_PROCESSES",
    "OP_SHAPE_ITERATIONS",
    "arena_bytes",
    "cache_dir",
    "check",
    "counter_set",
    "cupti_all_api",
    "cupti_buffer_bytes",
    "cupti_sampling",
    "m_processes",
    "native_dir",
    "ncu_path",
    "op_shape_iterations",
    "switch",
]

#: CUPTI activity buffer size in MB. CUPTI touches every buffer it is given, so the size is
#: resident memory: on the H200 (ResNet-50 b64 training, MFLG) 256 MB buffers took peak RSS to
#: 1.55x the untraced run, 16 MB buffers to 1.17x. A full buffer only joins a queue (the
#: records are decoded after the window), and the next comes from the native pool.
DEFAULT_CUPTI_BUFFER_MB = 16
#: More than this is surely a typo (CUPTI asks for a buffer per completion).
MAX_CUPTI_BUFFER_MB = 16 * 1024

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

#: The capture arena (``xsp.tracer.capture.hooks.arena``): ~10M records by default.
DEFAULT_ARENA_MB = 512
MAX_ARENA_MB = 64 * 1024


def _get(name: str, env: Mapping[str, str] | None) -> str | None:
    value = (os.environ if env is None else env).get(name)
    return None if value is None or value.strip() == "" else value.strip()


def switch(name: str, default: bool, env: Mapping[str, str] | None = None) -> bool:
    """An on/off switch: 1/true/yes/on or 0/false/no/off (any case); unset or empty: default."""
    value = _get(name, env)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ConfigError(f"bad {name}={value!r}: use 1 or 0")


def _whole_number(
    name: str, default: int, maximum: int, env: Mapping[str, str] | None, unit: str = ""
) -> int:
    """A switch that is a whole number from 1 to ``maximum`` (``_`` between digits allowed)."""
    value = _get(name, env)
    if value is None:
        return default
    try:
        number = int(value.replace("_", ""))
    except ValueError:
        number = 0
    if not 1 <= number <= maximum:
        raise ConfigError(f"bad {name}={value!r}: give 1 to {maximum}{unit}")
    return number


def _megabytes(name: str, default: int, maximum: int, env: Mapping[str, str] | None) -> int:
    value = _get(name, env)
    if value is None:
        return default * 1024 * 1024
    try:
        mb = int(value)
    except ValueError:
        mb = -1
    if not 1 <= mb <= maximum:
        raise ConfigError(
            f"bad {name}={value!r}: a whole number of MB from 1 to {maximum} (default {default})"
        )
    return mb * 1024 * 1024


def cupti_buffer_bytes(env: Mapping[str, str] | None = None) -> int:
    """``XSP_CUPTI_BUFFER_MB`` (default 16): the size of each CUPTI activity buffer."""
    return _megabytes("XSP_CUPTI_BUFFER_MB", DEFAULT_CUPTI_BUFFER_MB, MAX_CUPTI_BUFFER_MB, env)


def arena_bytes(env: Mapping[str, str] | None = None) -> int:
    """``XSP_ARENA_MB`` (default 512): the capture arena's size, a sparse file of which only
    what is written takes disk and memory (48 bytes per op, module call or range)."""
    return _megabytes("XSP_ARENA_MB", DEFAULT_ARENA_MB, MAX_ARENA_MB, env)


def cupti_all_api(env: Mapping[str, str] | None = None) -> bool:
    """``XSP_CUPTI_ALL_API=1``: CUPTI records the bookkeeping API calls too."""
    return switch("XSP_CUPTI_ALL_API", False, env)


def cupti_sampling(env: Mapping[str, str] | None = None) -> str:
    """``XSP_CUPTI_SAMPLING`` (default ``pause``): how a continuous session's levels L and G on
    CUDA switch CUPTI off between sampled iterations. ``pause``: CUPTI stays initialized with
    its kinds off and the API calls recorded from callbacks whose domains are off;
    ``finalize``: CUPTI started for each sampled iteration and finalized after it (11 ms a
    sampled iteration on the H200)."""
    value = (_get("XSP_CUPTI_SAMPLING", env) or "pause").strip().lower()
    if value not in ("pause", "finalize"):
        raise ConfigError(f"bad XSP_CUPTI_SAMPLING={value!r}: pause or finalize")
    return value


def ncu_path(env: Mapping[str, str] | None = None) -> str | None:
    """``XSP_NCU``: the Nsight Compute command line (``ncu``) for the hardware-counter level set
    MH (None: unset; xsp looks on PATH and in CUDA's and Nsight Compute's install folders)."""
    return _get("XSP_NCU", env)


def native_dir(env: Mapping[str, str] | None = None) -> Path:
    """``XSP_NATIVE_DIR`` (default ``~/.cache/xsp/native``): where the native capture core
    (``xsp.tracer.native.build``) and the collector's C modules are built, one folder per
    source, torch and Python."""
    value = _get("XSP_NATIVE_DIR", env)
    return Path(value) if value is not None else Path.home() / ".cache" / "xsp" / "native"


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``XSP_CACHE_DIR`` (default ``~/.cache/xsp``): where a command that reads a measurement
    keeps what it computed for the next reader (the replay's fits, ``replay-fits/``), so that
    no read writes into the measurement."""
    value = _get("XSP_CACHE_DIR", env)
    return Path(value) if value is not None else Path.home() / ".cache" / "xsp"


#: When level F records op input shapes: in the ``first`` measured iteration, which the others
#: that ran the same ops take (``xsp.tracer.convert.shapes``), or in ``every`` one (programs
#: whose shapes change from one iteration to the next).
OP_SHAPE_ITERATIONS = ("first", "every")


def op_shape_iterations(env: Mapping[str, str] | None = None) -> str:
    """``XSP_OP_SHAPES``: first (default) or every."""
    value = _get("XSP_OP_SHAPES", env)
    if value is None:
        return "first"
    if value not in OP_SHAPE_ITERATIONS:
        raise ConfigError(f"bad XSP_OP_SHAPES={value!r}: use {' or '.join(OP_SHAPE_ITERATIONS)}")
    return value


#: The hardware-counter metric sets: ``full`` (every quantity), ``lean`` (without the SM and memory
#: throughput breakdowns, which take the most replay passes).
COUNTER_SETS = ("full", "lean")


def counter_set(env: Mapping[str, str] | None = None) -> str:
    """``XSP_COUNTER_METRICS``: full (default) or lean."""
    value = _get("XSP_COUNTER_METRICS", env)
    if value is None:
        return "full"
    if value not in COUNTER_SETS:
        raise ConfigError(f"bad XSP_COUNTER_METRICS={value!r}: use {' or '.join(COUNTER_SETS)}")
    return value


#: ``xsp run`` times M in this many processes unless ``--m-processes`` says otherwise
#: (``xsp.tracer.run.m_processes``); XSP_M_PROCESSES changes the default.
DEFAULT_M_PROCESSES = 3
MAX_M_PROCESSES = 64


def m_processes(env: Mapping[str, str] | None = None) -> int:
    """How many processes ``xsp run`` times M in by default (XSP_M_PROCESSES)."""
    return _whole_number("XSP_M_PROCESSES", DEFAULT_M_PROCESSES, MAX_M_PROCESSES, env)


#: The collector's dedupe window (``collector_dedupe_spans``): per run directory, the newest
#: this many spans' keys are indexed (8 bytes each, at most twice as many held).
DEFAULT_COLLECTOR_DEDUPE_SPANS = 2_000_000
MAX_COLLECTOR_DEDUPE_SPANS = 1 << 32


def collector_dedupe_spans(env: Mapping[str, str] | None = None) -> int:
    """``XSP_COLLECTOR_DEDUPE_SPANS`` (default 2,000,000): the collector stores a span once
    per run directory when its earlier copy is among the directory's newest this many spans
    (whole parts, the newest always); the index holds 8 to 16 bytes a window span."""
    return _whole_number(
        "XSP_COLLECTOR_DEDUPE_SPANS",
        DEFAULT_COLLECTOR_DEDUPE_SPANS,
        MAX_COLLECTOR_DEDUPE_SPANS,
        env,
    )


DEFAULT_COLLECTOR_DEDUPE_INDEX_MIB = 256
MAX_COLLECTOR_DEDUPE_INDEX_MIB = 1 << 20


def collector_dedupe_index_bytes(env: Mapping[str, str] | None = None) -> int:
    """``XSP_COLLECTOR_DEDUPE_INDEX_MIB`` (default 256): the most memory, in MiB, that the
    collector's dedupe indexes of all its run directories hold together (the least recently
    written ones are dropped beyond it, and read again from their parts when next written; the
    directory being written keeps its own whatever its size); returned in bytes."""
    mib = _whole_number(
        "XSP_COLLECTOR_DEDUPE_INDEX_MIB",
        DEFAULT_COLLECTOR_DEDUPE_INDEX_MIB,
        MAX_COLLECTOR_DEDUPE_INDEX_MIB,
        env,
        " (MiB)",
    )
    return mib << 20


def check(env: Mapping[str, str] | None = None) -> None:
    """Read every switch once: raise ConfigError on the first bad value."""
    cupti_buffer_bytes(env)
    arena_bytes(env)
    cupti_all_api(env)
    cupti_sampling(env)
    switch("XSP_FORK_SERVER", True, env)
    switch("XSP_OVERLAP", True, env)
    switch("XSP_SHARE_PROCESS", True, env)
    switch("XSP_STEADY_HEAP", True, env)
    m_processes(env)
    collector_dedupe_spans(env)
    collector_dedupe_index_bytes(env)
    ncu_path(env)
    native_dir(env)
    counter_set(env)
    op_shape_iterations(env)

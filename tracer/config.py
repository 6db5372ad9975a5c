"""xsp's own ``XSP_*`` environment switches, read in one place.

Each is read when it is used, never at import, so that a bad value fails as one line: a
``ConfigError`` that names the variable and the value (``XSP_CUPTI_BUFFER_MB='lots': ...``).
``check()`` reads them all, so that ``xsp run`` refuses a bad value before any process starts.
The OpenTelemetry exporter variables (``OTEL_EXPORTER_OTLP_*``) are read by
``xsp.tracer.export.transport.OtlpConfig``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from xsp.tracer.errors import ConfigError

#: CUPTI activity buffer size in MB: measured on the H200, 8 MB buffers completing mid-iteration
#: slowed ResNet-50 training up to 4.3x, 256 MB buffers decoded after the window cost 1.02x.
DEFAULT_CUPTI_BUFFER_MB = 256
#: More than this is surely a typo (CUPTI asks for a buffer per completion).
MAX_CUPTI_BUFFER_MB = 16 * 1024

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

#: The framework capture switch's values (``xsp.tracer.capture.levels.framework``'s capture names).
FRAMEWORK_CAPTURES = ("kineto", "nvtx")


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


def cupti_buffer_bytes(env: Mapping[str, str] | None = None) -> int:
    """``XSP_CUPTI_BUFFER_MB`` (default 256) in bytes."""
    value = _get("XSP_CUPTI_BUFFER_MB", env)
    if value is None:
        return DEFAULT_CUPTI_BUFFER_MB * 1024 * 1024
    try:
        mb = int(value)
    except ValueError:
        mb = -1
    if not 1 <= mb <= MAX_CUPTI_BUFFER_MB:
        raise ConfigError(
            f"bad XSP_CUPTI_BUFFER_MB={value!r}: a whole number of MB from 1 to "
            f"{MAX_CUPTI_BUFFER_MB} (default {DEFAULT_CUPTI_BUFFER_MB})"
        )
    return mb * 1024 * 1024


def cupti_all_api(env: Mapping[str, str] | None = None) -> bool:
    """``XSP_CUPTI_ALL_API=1``: CUPTI records the bookkeeping API calls too."""
    return switch("XSP_CUPTI_ALL_API", False, env)


def nvtx_op_shapes(env: Mapping[str, str] | None = None) -> bool:
    """``XSP_NVTX_OP_SHAPES=1``: op shapes in NVTX names when F runs through CUPTI."""
    return switch("XSP_NVTX_OP_SHAPES", False, env)


def framework_capture(env: Mapping[str, str] | None = None) -> str | None:
    """``XSP_FRAMEWORK_CAPTURE``: kineto or nvtx (None: unset, xsp chooses)."""
    value = _get("XSP_FRAMEWORK_CAPTURE", env)
    if value is None:
        return None
    if value not in FRAMEWORK_CAPTURES:
        raise ConfigError(
            f"bad XSP_FRAMEWORK_CAPTURE={value!r}: use {' or '.join(FRAMEWORK_CAPTURES)}"
        )
    return value


def check(env: Mapping[str, str] | None = None) -> None:
    """Read every switch once: raise ConfigError on the first bad value."""
    cupti_buffer_bytes(env)
    cupti_all_api(env)
    nvtx_op_shapes(env)
    framework_capture(env)
    switch("XSP_FORK_SERVER", True, env)
    switch("XSP_OVERLAP", True, env)

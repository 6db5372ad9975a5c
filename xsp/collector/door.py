"""The collector's check of a request before it is acknowledged: native first, Python when unsure.

``ingest_view.check`` (upb's parse of the request, then a Python loop over its spans) costs
3.8–4.0 µs a span, half of what the receivers spend on a span. ``native/door.c`` walks the wire
format once, in C and without the GIL, and answers either the span count of a request it is
certain the Python check accepts or "not sure"; then the Python check decides, and its message
is the one a sender sees. Its rules are stricter than the Python check's, never looser (see the
C file), so the native path changes which requests are accepted in no case, only how fast. A
key that comes twice in a span: the C check is sure only where every value passes, the Python
check reads the last (a map), and the store worker stores the last (``decode_spans.any_columns``).

The extension is a plain CPython module (no torch), built once per source and Python into
``XSP_NATIVE_DIR`` with the C compiler Python was built with. Where none is found, the
collector says so once and checks every request in Python.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType

from xsp.collector import ingest_view
from xsp.core import schema
from xsp.core.native import load_c_module, optional_c_module
from xsp.core.otlp.attributes import NUMERIC

__all__ = ["SOURCE", "WHAT", "check", "checked_keys", "load", "prepare"]

SOURCE = Path(__file__).with_name("native") / "door.c"
WHAT = "the collector's native check"
_INT64 = (-(1 << 63), (1 << 63) - 1)
# the kinds of door.c
_WIDE_INT, _INT, _FLOAT, _SPAN_ID_HEX = 0, 1, 2, 3


def check(body: bytes) -> int:
    """The span count of a protobuf trace request; ``otlp.DecodeError`` naming the span, field
    and value where it cannot be stored (``ingest_view.check``'s rules and messages)."""
    native = _native()
    if native is not None:
        count: int = native.check(body)
        if count >= 0:
            return count
    return ingest_view.check(body)


def checked_keys() -> list[tuple[str, int, int, int]]:
    """The span attributes whose values the native check inspects: (key, kind, low, high)."""
    keys = []
    for key, kind in NUMERIC.items():
        if kind.is_float:
            keys.append((key, _FLOAT, 0, 0))
        elif kind.wide:
            keys.append((key, _WIDE_INT, *_INT64))
        else:  # bounds clamped to int64's: an int_value is an int64
            keys.append((key, _INT, max(kind.low, _INT64[0]), min(kind.high, _INT64[1])))
    keys.append((schema.ATTR_VIEW_STORED_PARENT, _SPAN_ID_HEX, 0, 0))
    return keys


def prepare() -> bool:
    """Build and load the native check now (a collector's start); whether it is in use."""
    return _native() is not None


@functools.lru_cache(maxsize=1)
def _native() -> ModuleType | None:
    return optional_c_module(
        SOURCE, WHAT, "XSP_NATIVE_DOOR", checked_keys(), "every request is checked in Python"
    )


def load() -> ModuleType:
    """The door's extension, built first where this Python has none yet."""
    return load_c_module(SOURCE, WHAT)

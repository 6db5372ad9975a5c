"""An op's recorded input or output shapes (a JSON list per span), parsed once per distinct text."""

from __future__ import annotations

import functools
import json
from typing import Any

__all__ = ["json_list"]


# An iteration repeats its ops' shapes: parsed once per distinct text (callers never write to
# the lists; on 1M spans, 43k parses and their checks took 0.6 s of the count's 2.2 s).
@functools.lru_cache(maxsize=1 << 16)
def json_list(text: str | None) -> list[Any]:
    """The list ``text`` holds; empty for no text, bad JSON or anything but a list."""
    try:
        value = json.loads(text) if text else []
    except ValueError:
        return []
    return value if isinstance(value, list) else []

"""The store's JSON files read and written whole: a reader never sees half a file."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xsp.core.errors import StoreError

__all__ = ["read_json", "write_json_atomic"]


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON so that a reader never sees half a file, even if the writer is killed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; a missing or unreadable file, or one that holds something
    else, is a StoreError naming it."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise StoreError(f"{path}: missing") from exc
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path}: not readable JSON ({exc})") from exc
    except RecursionError as exc:  # no document of xsp's nests deeper than a few levels
        raise StoreError(f"{path}: not readable JSON (nested too deep)") from exc
    if not isinstance(data, dict):
        raise StoreError(f"{path}: expected a JSON object")
    return data

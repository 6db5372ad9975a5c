"""The replay's fitted cost of F, kept so that the next analysis does not fit again.

The fit (``xsp.analysis.replay.fit``) replays the F run's steps nine times: 0.25 s of the 1.1 s
that ``xsp summary`` took of a store that needed it on the dev machine. ``xsp run`` fits once,
at the end of its measurement (its summary); every later ``xsp summary``, ``xsp analyze`` or
export of the same store reads the outcome from xsp's cache folder (``XSP_CACHE_DIR``, default
``~/.cache/xsp``: ``replay-fits/``, one file per store's absolute path). A command that reads a
measurement never writes into it; a ``replay-fit.json`` that an earlier xsp kept beside the
manifest is still read.

The outcome is kept with a key of everything it was computed from: each run's ``run.json`` and
span files (name, size, modification time), the source of the analysis package and of the
conversion package whose interval and column helpers it calls (a changed replay fits again),
and what the fit starts from (its settings and the cost it starts at, as they are when it
runs). A missing, unreadable or differing key, or a cache that cannot be written, means the fit
runs as if nothing were kept: the cache can cost a fit, never change an answer.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from xsp.core.config import cache_dir
from xsp.core.errors import StoreError
from xsp.core.store import read_json, write_json_atomic

if TYPE_CHECKING:
    from xsp.analysis.measurement.store import MeasurementStore

log = logging.getLogger(__name__)

__all__ = ["FITS_FOLDER", "FIT_FILE", "KEPT", "Fit", "cache_file", "key", "read", "write"]

#: The file an earlier xsp kept its fits in, beside the store's manifest (read, never written).
FIT_FILE = "replay-fit.json"
#: The cache folder's sub-folder of fits, one file per store.
FITS_FOLDER = "replay-fits"
#: The code a fit's outcome depends on: the analysis package (its sub-packages too), and the
#: conversion package whose helpers it calls (``intervals``: the replay's orders and stabs;
#: ``columns``: its arrays).
_ANALYSIS = Path(__file__).resolve().parents[1]
_CONVERT = Path(__file__).resolve().parents[2] / "tracer" / "convert"


@dataclass(frozen=True)
class Fit:
    """A fit's outcome: the factor on the probe's cost and why (None: the probe's cost stands)."""

    factor: float | None
    why: str | None = None


def _code_digest() -> str:
    digest = hashlib.sha256()
    sources = [*_ANALYSIS.rglob("*.py"), *_CONVERT.glob("*.py")]
    for path in sorted(sources):
        digest.update(f"{path.parent.name}/{path.name}".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def key(store: MeasurementStore, settings: tuple[object, ...]) -> str | None:
    """What a fit of ``store`` with ``settings`` is computed from (None: it cannot be told, so
    nothing is kept)."""
    try:
        digest = hashlib.sha256(f"{_code_digest()} {settings!r}\n".encode())
        for run in store.runs:
            for path in sorted([run.path / "run.json", *run.span_files]):
                stat = path.stat()
                digest.update(
                    f"{run.path.name}/{path.name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode()
                )
        return digest.hexdigest()
    except OSError:
        return None


def cache_file(store: MeasurementStore) -> Path:
    """Where the fits of ``store`` are kept: named by the store's absolute path (the key inside
    names its runs' files as they are)."""
    root = str(store.root.resolve())
    return cache_dir() / FITS_FOLDER / f"{hashlib.sha256(root.encode()).hexdigest()[:32]}.json"


def read(store: MeasurementStore, kept_as: str | None) -> Fit | None:
    """The fit kept for ``store`` under the key ``kept_as`` (``key``), if there is one: in the
    cache, else in the store's own ``replay-fit.json`` (an earlier xsp's)."""
    if kept_as is None:
        return None
    for path in (cache_file(store), store.root / FIT_FILE):
        try:
            found = _kept(path).get(kept_as)
            if not isinstance(found, dict):
                continue
            factor = found["factor"]
            return Fit(None if factor is None else float(factor), found.get("why"))
        except (StoreError, ValueError, KeyError, TypeError):
            continue
    return None


#: Fits kept at most: the replay's, and one per fold of its in-process check, for a few keys.
KEPT = 6


def _kept(path: Path) -> dict[str, object]:
    """The fits kept in ``path`` by key (an older file's single fit, or nothing)."""
    try:
        kept = read_json(path)
    except StoreError:
        return {}
    fits = kept.get("fits")
    if isinstance(fits, dict):
        return fits
    if isinstance(kept.get("key"), str):  # the single fit an earlier xsp kept
        return {kept["key"]: {"factor": kept.get("factor"), "why": kept.get("why")}}
    return {}


def write(store: MeasurementStore, kept_as: str | None, fit: Fit) -> None:
    """Keep ``fit`` under ``kept_as`` in the cache for the next reader; a cache that cannot be
    written is left as it is."""
    if kept_as is None:
        return
    path = cache_file(store)
    fits = {k: v for k, v in _kept(path).items() if isinstance(v, dict)}
    fits[kept_as] = {"factor": fit.factor, "why": fit.why}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # the fit of every pair and of each fold (the in-process check's): the last few kept
        write_json_atomic(path, {"fits": dict(list(fits.items())[-KEPT:])})
    except OSError as exc:
        log.debug("replay: the fit is not kept in %s: %s", path, exc)

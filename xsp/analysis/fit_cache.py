"""The replay's fitted cost of F, kept in the store so that the next analysis does not fit again.

The fit (``xsp.analysis.replay._fitted_graph``) replays the F run's steps nine times: 0.25 s of
the 1.1 s that ``xsp summary`` took of a store that needed it on the dev machine. ``xsp run``
fits once, at the end of its measurement (its summary); every later ``xsp summary``,
``xsp analyze`` or export of the same store reads the outcome from ``replay-fit.json`` beside
the manifest.

The outcome is kept with a key of everything it was computed from: each run's ``run.json`` and
span files (name, size, modification time), the source of the analysis package and of the
conversion package whose interval and column helpers it calls (a changed replay fits again),
and what the fit starts from (its settings and the cost it starts at, as they are when it
runs). A missing, unreadable or differing key, or a store that cannot be
written (a read-only copy), means the fit runs as if nothing were kept: the cache can cost a
fit, never change an answer.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from xsp.core.errors import StoreError
from xsp.core.store import read_json, write_json_atomic

if TYPE_CHECKING:
    from xsp.analysis.store import MeasurementStore

log = logging.getLogger(__name__)

FIT_FILE = "replay-fit.json"
#: The code a fit's outcome depends on: the analysis package, and the conversion package whose
#: helpers it calls (``intervals``: the replay's orders and stabs; ``columns``: its arrays).
_SOURCES = (
    Path(__file__).resolve().parent,
    Path(__file__).resolve().parents[1] / "tracer" / "convert",
)


@dataclass(frozen=True)
class Fit:
    """A fit's outcome: the factor on the probe's cost and why (None: the probe's cost stands)."""

    factor: float | None
    why: str | None = None


def _code_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(path for folder in _SOURCES for path in folder.glob("*.py")):
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


def read(store: MeasurementStore, kept_as: str | None) -> Fit | None:
    """The fit kept for ``store`` under the key ``kept_as`` (``key``), if there is one."""
    if kept_as is None:
        return None
    try:
        found = _kept(store).get(kept_as)
        if not isinstance(found, dict):
            return None
        factor = found["factor"]
        return Fit(None if factor is None else float(factor), found.get("why"))
    except (StoreError, ValueError, KeyError, TypeError):
        return None


#: Fits kept at most: the replay's, and one per fold of its in-process check, for a few keys.
KEPT = 6


def _kept(store: MeasurementStore) -> dict[str, object]:
    """The fits kept in the store by key (an older file's single fit, or nothing)."""
    try:
        kept = read_json(store.root / FIT_FILE)
    except StoreError:
        return {}
    fits = kept.get("fits")
    if isinstance(fits, dict):
        return fits
    if isinstance(kept.get("key"), str):  # the single fit an earlier xsp kept
        return {kept["key"]: {"factor": kept.get("factor"), "why": kept.get("why")}}
    return {}


def write(store: MeasurementStore, kept_as: str | None, fit: Fit) -> None:
    """Keep ``fit`` under ``kept_as`` for the next reader; a store that cannot be written is
    left as it is."""
    if kept_as is None:
        return
    fits = {k: v for k, v in _kept(store).items() if isinstance(v, dict)}
    fits[kept_as] = {"factor": fit.factor, "why": fit.why}
    try:
        # the fit of every pair and of each fold (the in-process check's): the last few kept
        write_json_atomic(store.root / FIT_FILE, {"fits": dict(list(fits.items())[-KEPT:])})
    except OSError as exc:
        log.debug("replay: the fit is not kept in %s: %s", store.root, exc)

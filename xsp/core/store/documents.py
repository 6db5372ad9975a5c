"""The store's two JSON documents, typed: a level-set run's ``run.json`` (``RunMeta``) and a
measurement's ``manifest.json`` (``Manifest``, its runs each a ``ManifestRun``).

Every process that writes or amends them (a session, the runner, a rank job, the collector, the
counter import, a recovery) and every reader goes through this module, so a key is spelled in
one place and the status rule (``Status.with_reason``: a reason makes ``ok`` partial) is one.

A document keeps what it does not type (a level's own section, a newer writer's key) verbatim in
``extra``, and which typed keys its file held as ``null`` in ``nulls``: ``to_json`` gives back the
same JSON object that ``from_json`` read, so an older store's files read and round-trip as they
are. A typed key whose value has another type than the one declared is kept in ``extra`` too:
the document reads it as absent, the file keeps it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypedDict, TypeVar

from xsp.core.store.json_io import read_json, write_json_atomic

__all__ = [
    "CounterInfo",
    "Manifest",
    "ManifestRun",
    "ProgramEnd",
    "RankRun",
    "RunMeta",
    "SkippedLevels",
    "Status",
    "amend_manifest",
    "amend_run_meta",
    "read_manifest",
    "read_run_meta",
    "write_manifest",
    "write_run_meta",
]


class Status(StrEnum):
    """A run's, a manifest entry's or a measurement's status (the same words in all three).

    ``partial``: something is missing (fewer iterations, a failed sink, records CUPTI dropped);
    ``error``: the program failed, nothing usable was stored, or the process ended before xsp
    could store anything; ``interrupted``: Ctrl-C; ``collected``: a run the collector stored
    from OTLP spans (it cannot know how the sender's run went)."""

    RUNNING = "running"
    OK = "ok"
    PARTIAL = "partial"
    ERROR = "error"
    INTERRUPTED = "interrupted"
    COLLECTED = "collected"

    def with_reason(self) -> Status:
        """The status once a reason is added: an ok run is partial, any other stays itself."""
        return Status.PARTIAL if self is Status.OK else self


class ProgramEnd(TypedDict, total=False):
    """How a level-set process's program ended: its exit code or exception, an interrupt, or
    the signal that killed it."""

    exit_code: int
    exception: str
    interrupted: bool
    signal: int
    signal_name: str


class CounterInfo(TypedDict, total=False):
    """A hardware-counter run's ``counters`` section (``xsp.tracer.run.ncu``): the tool and what
    it collected. The manifest entry keeps ``kernels``, ``passes``, ``import_s`` and
    ``tool_version`` of it."""

    tool: str
    tool_path: str
    tool_version: str | None
    flags: list[str]
    metric_set: str
    metrics_requested: list[str]
    quantities_without_metric: list[str]
    metrics_checked_against_device: bool
    kernels: int
    kernels_per_iteration: dict[str, int]
    kernels_outside_iterations: int
    unreadable_cells: int
    iterations_from_nvtx: bool
    metrics_read: list[str]
    passes: dict[str, float]
    peaks_measured: dict[str, float]
    tool_errors: list[str]
    import_s: float


class RankRun(TypedDict):
    """One rank of a multi-rank job's run (run.json's ``ranks``): its process and its own
    status, reasons, program and counts; each null where the rank's run.json had none."""

    rank: int
    pid: int | None
    status: str | None
    error: str | None
    status_reasons: list[str] | None
    program: ProgramEnd | None
    iterations_measured: int | None
    spans: int | None
    calibration: Mapping[str, Any] | None
    warmup_steps_ms: list[float] | None


class SkippedLevels(TypedDict):
    """A level set the plan left out, and why (the manifest's ``skipped``)."""

    levels: str
    reason: str


_Doc = TypeVar("_Doc", "RunMeta", "ManifestRun", "Manifest")
_WithReasons = TypeVar("_WithReasons", "RunMeta", "ManifestRun")


# --- how a typed key's JSON value is checked and converted (one mechanism for every field)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError
    return value


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError
    return value


def _section(value: Any) -> Any:
    """An object kept as read (a TypedDict or a mapping of the document)."""
    if not isinstance(value, dict):
        raise TypeError
    return value


def _texts(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError
    return tuple(value)


def _numbers(value: Any) -> tuple[float, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int | float) for v in value):
        raise TypeError
    return tuple(value)


def _sections(value: Any) -> tuple[Any, ...]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise TypeError
    return tuple(value)


def _status(value: Any) -> Status:
    try:
        return Status(_text(value))
    except ValueError as exc:
        raise TypeError from exc


def _runs(value: Any) -> tuple[ManifestRun, ...]:
    return tuple(ManifestRun.from_json(entry) for entry in _sections(value))


# each typed field's metadata: how its JSON value is checked; a field without is not a key
_TEXT = {"check": _text}
_COUNT = {"check": _count}
_FLAG = {"check": _flag}
_SECTION = {"check": _section}
_TEXTS = {"check": _texts}
_NUMBERS = {"check": _numbers}
_SECTIONS = {"check": _sections}
_STATUS = {"check": _status}
_RUNS = {"check": _runs}


def _from_json(cls: type[_Doc], data: Mapping[str, Any]) -> _Doc:
    """``cls`` from a JSON object: each typed key checked, the rest (and any typed key of
    another type) kept verbatim in ``extra``, the typed keys held as null in ``nulls``."""
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    nulls: set[str] = set()
    typed = {f.name: f.metadata["check"] for f in dataclasses.fields(cls) if f.metadata}
    for key, value in data.items():
        check = typed.get(key)
        if check is None:
            extra[key] = value
        elif value is None:
            nulls.add(key)
        else:
            try:
                values[key] = check(value)
            except TypeError:
                extra[key] = value
    return cls(**values, extra=extra, nulls=frozenset(nulls))


def _to_json(document: RunMeta | ManifestRun | Manifest) -> dict[str, Any]:
    """A document's JSON object: its typed keys that are set (or were null), then ``extra``."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(document):
        if not f.metadata:
            continue
        value = getattr(document, f.name)
        if value is None:
            if f.name in document.nulls:
                out[f.name] = None
            continue
        if isinstance(value, Status):
            value = value.value
        elif isinstance(value, tuple):
            value = [v.to_json() if isinstance(v, ManifestRun) else v for v in value]
        out[f.name] = value
    out.update(document.extra)
    return out


def _merged(reasons: tuple[str, ...] | None, more: Iterable[str]) -> tuple[str, ...]:
    """``reasons`` with those of ``more`` it does not already have, in order."""
    return tuple(dict.fromkeys([*(reasons or ()), *more]))


@dataclass(frozen=True)
class RunMeta:
    """A level-set run's ``run.json``: who it is, how it went, what it stored.

    The level-specific sections read by name (``calibration``, ``interleaved``, ``host``,
    ``cupti``, ``arena``, ``monitor``, ...) are mappings as the run wrote them; a rank-joined
    run has ``ranks`` and ``world_size``, a collected one its senders' resources by id in
    ``resources-*.parquet`` parts (``resources_in_parts``; an older collector's: ``resources``
    here, read by ``files.read_resources``)."""

    format: str | None = field(default=None, metadata=_TEXT)
    run_id: str | None = field(default=None, metadata=_TEXT)
    measurement_id: str | None = field(default=None, metadata=_TEXT)
    levels: str | None = field(default=None, metadata=_TEXT)
    workload: str | None = field(default=None, metadata=_TEXT)
    resource: Mapping[str, Any] | None = field(default=None, metadata=_SECTION)
    resources: Mapping[str, Any] | None = field(default=None, metadata=_SECTION)
    status: Status | None = field(default=None, metadata=_STATUS)
    error: str | None = field(default=None, metadata=_TEXT)
    status_reasons: tuple[str, ...] | None = field(default=None, metadata=_TEXTS)
    program: ProgramEnd | None = field(default=None, metadata=_SECTION)
    iterations_requested: int | None = field(default=None, metadata=_COUNT)
    iterations_measured: int | None = field(default=None, metadata=_COUNT)
    iteration_boundary: str | None = field(default=None, metadata=_TEXT)
    warmup: int | None = field(default=None, metadata=_COUNT)
    warmup_steps_ms: tuple[float, ...] | None = field(default=None, metadata=_NUMBERS)
    warmup_settled: bool | None = field(default=None, metadata=_FLAG)
    warmup_steps_dropped: int | None = field(default=None, metadata=_COUNT)
    failed_iterations: Mapping[str, str] | None = field(default=None, metadata=_SECTION)
    errors: tuple[str, ...] | None = field(default=None, metadata=_TEXTS)
    started_ns: int | None = field(default=None, metadata=_COUNT)
    finished_ns: int | None = field(default=None, metadata=_COUNT)
    phases_ns: Mapping[str, int] | None = field(default=None, metadata=_SECTION)
    switch_on_ms: Mapping[str, float] | None = field(default=None, metadata=_SECTION)
    spans: int | None = field(default=None, metadata=_COUNT)
    spans_by_level: Mapping[str, int] | None = field(default=None, metadata=_SECTION)
    files: tuple[str, ...] | None = field(default=None, metadata=_TEXTS)
    memory_events: int | None = field(default=None, metadata=_COUNT)
    events_outside_iterations: int | None = field(default=None, metadata=_COUNT)
    ranges_left_open: int | None = field(default=None, metadata=_COUNT)
    next_span_id: int | None = field(default=None, metadata=_COUNT)
    calibration: Mapping[str, Any] | None = field(default=None, metadata=_SECTION)
    interleaved: Mapping[str, Any] | None = field(default=None, metadata=_SECTION)
    host: Mapping[str, Any] | None = field(default=None, metadata=_SECTION)
    cupti: Mapping[str, Any] | None = field(default=None, metadata=_SECTION)
    arena: Mapping[str, int] | None = field(default=None, metadata=_SECTION)
    counters: CounterInfo | None = field(default=None, metadata=_SECTION)
    recovered: bool | None = field(default=None, metadata=_FLAG)
    timed_out: bool | None = field(default=None, metadata=_FLAG)
    rank: int | None = field(default=None, metadata=_COUNT)
    world_size: int | None = field(default=None, metadata=_COUNT)
    ranks: tuple[RankRun, ...] | None = field(default=None, metadata=_SECTIONS)
    #: a collected run's: who stored it, the spans it left out as already stored (in all and by
    #: part file), and the requests of it set aside in the quarantine (their count, their files)
    source: str | None = field(default=None, metadata=_TEXT)
    duplicate_spans_skipped: int | None = field(default=None, metadata=_COUNT)
    duplicate_spans_skipped_by_part: Mapping[str, int] | None = field(
        default=None, metadata=_SECTION
    )
    quarantined_requests: int | None = field(default=None, metadata=_COUNT)
    quarantined: tuple[str, ...] | None = field(default=None, metadata=_TEXTS)
    #: the senders' resources are in ``resources-<part>.parquet`` beside each span part
    resources_in_parts: bool | None = field(default=None, metadata=_FLAG)
    #: what xsp stepped aside from while the program's own torch.profiler ran (capture/coexist)
    program_profiler: Mapping[str, Any] | None = field(default=None, metadata=_SECTION)
    extra: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = frozenset()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunMeta:
        return _from_json(cls, data)

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    @property
    def partial_for_the_programs_profiler(self) -> bool:
        """Partial only because the program's own torch.profiler held CUPTI for some
        iterations: every later level set would meet the same, so the measurement goes on."""
        held = self.program_profiler or {}
        return (
            self.status == Status.PARTIAL
            and bool(held.get("spans_missing"))
            and tuple(self.status_reasons or ()) == (held.get("line"),)
        )

    def with_reasons(self, reasons: Iterable[str]) -> RunMeta:
        """This run with ``reasons`` added to its ``status_reasons``: one makes an ok run
        partial."""
        return _with_reasons(self, reasons)


@dataclass(frozen=True)
class ManifestRun:
    """One level-set process's entry in the manifest (``runs``, or ``m_processes`` for a
    further M process, which also has its ``process`` number and ``path``): its run.json's
    status and counts, how its program ended, and where its time went (``seconds``)."""

    levels: str | None = field(default=None, metadata=_TEXT)
    process: int | None = field(default=None, metadata=_COUNT)
    path: str | None = field(default=None, metadata=_TEXT)
    returncode: int | None = field(default=None, metadata=_COUNT)
    program: ProgramEnd | None = field(default=None, metadata=_SECTION)
    status: Status | None = field(default=None, metadata=_STATUS)
    error: str | None = field(default=None, metadata=_TEXT)
    status_reasons: tuple[str, ...] | None = field(default=None, metadata=_TEXTS)
    iterations_measured: int | None = field(default=None, metadata=_COUNT)
    spans: int | None = field(default=None, metadata=_COUNT)
    seconds: Mapping[str, float] | None = field(default=None, metadata=_SECTION)
    cupti: Mapping[str, Any] | None = field(default=None, metadata=_SECTION)
    counters: Mapping[str, Any] | None = field(default=None, metadata=_SECTION)
    timed_out: bool | None = field(default=None, metadata=_FLAG)
    #: partial only because the program's profiler held CUPTI: the level sets after it ran
    goes_on: bool | None = field(default=None, metadata=_FLAG)
    stored: bool | None = field(default=None, metadata=_FLAG)
    in_process_of: str | None = field(default=None, metadata=_TEXT)
    failed_ahead: str | None = field(default=None, metadata=_TEXT)
    extra: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = frozenset()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ManifestRun:
        return _from_json(cls, data)

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)

    def with_reasons(self, reasons: Iterable[str]) -> ManifestRun:
        """This entry with ``reasons`` added: one makes an ok entry partial."""
        return _with_reasons(self, reasons)


@dataclass(frozen=True)
class Manifest:
    """A measurement's ``manifest.json``: its spec, its level sets, one entry per level-set
    process, its status, and the runner's own time around them (``runner_s``)."""

    format: str | None = field(default=None, metadata=_TEXT)
    measurement_id: str | None = field(default=None, metadata=_TEXT)
    created_ns: int | None = field(default=None, metadata=_COUNT)
    finished_ns: int | None = field(default=None, metadata=_COUNT)
    interrupted_ns: int | None = field(default=None, metadata=_COUNT)
    workload: str | None = field(default=None, metadata=_TEXT)
    spec: Mapping[str, Any] | None = field(default=None, metadata=_SECTION)
    cwd: str | None = field(default=None, metadata=_TEXT)
    level_sets: tuple[str, ...] | None = field(default=None, metadata=_TEXTS)
    skipped: tuple[SkippedLevels, ...] | None = field(default=None, metadata=_SECTIONS)
    runs: tuple[ManifestRun, ...] | None = field(default=None, metadata=_RUNS)
    m_processes: tuple[ManifestRun, ...] | None = field(default=None, metadata=_RUNS)
    status: Status | None = field(default=None, metadata=_STATUS)
    runner_s: Mapping[str, float] | None = field(default=None, metadata=_SECTION)
    extra: Mapping[str, Any] = field(default_factory=dict)
    nulls: frozenset[str] = frozenset()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Manifest:
        return _from_json(cls, data)

    def to_json(self) -> dict[str, Any]:
        return _to_json(self)


def _with_reasons(document: _WithReasons, reasons: Iterable[str]) -> _WithReasons:
    added = list(reasons)
    if not added:
        return document
    status = document.status.with_reason() if document.status is not None else None
    merged = _merged(document.status_reasons, added)
    return dataclasses.replace(document, status=status, status_reasons=merged)


def read_run_meta(path: Path) -> RunMeta:
    """A run.json (``path``: the file); a missing or unreadable one is a StoreError."""
    return RunMeta.from_json(read_json(path))


def write_run_meta(path: Path, meta: RunMeta) -> None:
    """Write run.json whole (a reader never sees half of it)."""
    write_json_atomic(path, meta.to_json())


def amend_run_meta(path: Path, change: Callable[[RunMeta], RunMeta]) -> RunMeta:
    """Read run.json, ``change`` it and write it back whole; returns what was written."""
    meta = change(read_run_meta(path))
    write_run_meta(path, meta)
    return meta


def read_manifest(path: Path) -> Manifest:
    """A manifest.json (``path``: the file); a missing or unreadable one is a StoreError."""
    return Manifest.from_json(read_json(path))


def write_manifest(path: Path, manifest: Manifest) -> None:
    """Write manifest.json whole (a reader never sees half of it)."""
    write_json_atomic(path, manifest.to_json())


def amend_manifest(path: Path, change: Callable[[Manifest], Manifest]) -> Manifest:
    """Read manifest.json, ``change`` it and write it back whole; returns what was written."""
    manifest = change(read_manifest(path))
    write_manifest(path, manifest)
    return manifest

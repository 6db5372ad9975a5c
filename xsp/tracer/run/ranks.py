"""A multi-rank job's level-set run, made of its ranks' runs.

The level-set process of a multi-rank job records nothing itself: it runs the launcher
(``xsp.tracer.run.launcher``), whose workers each write a run of their own into
``RUN_DIR/<levels>/rank-<N>/`` (``xsp.tracer.run.rank``). Once they have ended, ``finish`` makes
them the level set's run as the store and every reader expect it: one span part, the ranks'
spans joined into one trace per iteration (``xsp.tracer.convert.ranks``), and one run.json
whose status is the worst of the ranks' (a rank that stored nothing makes it partial), whose
counts add up, and whose ``ranks`` list keeps each rank's own status, reasons, program and
counts. The ranks' directories go once the join is stored; a join that fails keeps them and
says why. The joined spans then go to the OTLP endpoint, if any: the ranks send nothing
themselves, so that each iteration's trace arrives whole, its root included.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import statistics
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xsp.core import schema, store
from xsp.core.errors import StoreError
from xsp.core.store import ProgramEnd, RankRun, RunMeta, Status
from xsp.tracer.convert.ranks import join_ranks
from xsp.tracer.export.sinks import CompositeSink, Sink, SpanBatch
from xsp.tracer.run.launcher import JobEnd
from xsp.tracer.run.protocol import RANK_SPEC_ENV, ChildSpec, describe_end

__all__ = ["RANK_GLOB", "STATUS_ORDER", "ProcessFigures", "RankedRun", "Ranks"]

log = logging.getLogger(__name__)

#: Statuses from best to worst: the level set's is the worst of its ranks'.
STATUS_ORDER = (Status.OK, Status.PARTIAL, Status.INTERRUPTED, Status.ERROR)
RANK_GLOB = "rank-*"

#: (rank, its run.json), by rank
Ranks = list[tuple[int, RunMeta]]


@dataclass(frozen=True)
class ProcessFigures:
    """What the replay reads of a level set's process, joined over its ranks (each absent where
    no rank has it): F's calibration and the untraced warm-up steps."""

    calibration: Mapping[str, Any] | None = None
    warmup_steps_ms: tuple[float, ...] | None = None
    warmup_settled: bool | None = None
    warmup_steps_dropped: int | None = None


class RankedRun:
    """The level-set run of a multi-rank job, from its start to its ranks' join."""

    def __init__(self, spec: ChildSpec, workload: str) -> None:
        self.spec = spec
        self.workload = workload
        self.run_dir = spec.run_dir
        self.run_id = uuid.uuid4().hex  # shared by the ranks: their trace ids agree
        self.started_ns = time.time_ns()

    def begin(self) -> None:
        """Clear what an earlier run left and say ``running`` until the ranks are joined."""
        store.check_writable(self.run_dir)
        store.reset_run_dir(self.run_dir)
        for old in self.run_dir.glob(RANK_GLOB):
            shutil.rmtree(old, ignore_errors=True)
        running = RunMeta(
            status=Status.RUNNING,
            resource={},
            iterations_measured=0,
            nulls=frozenset({"finished_ns"}),  # said: it has not finished
        )
        self._write(running)

    def rank_environment(self) -> dict[str, str]:
        """What the launcher's workers need in their environment: the spec of their sessions.
        Rank 0 writes its progress lines into this process's progress pipe, by path."""
        fd = self.spec.progress_fd
        ranks = ChildSpec(
            dataclasses.replace(self.spec.run, run_id=self.run_id, workload=self.workload),
            progress_path=f"/proc/{os.getpid()}/fd/{fd}" if fd is not None else None,
        )
        return {RANK_SPEC_ENV: ranks.to_json()}

    def finish(self, end: JobEnd, sinks: Sequence[Sink] = ()) -> RunMeta:
        """Join the ranks' runs into the level set's run; return its run.json. The error and
        program it reports are those of the rank that failed first (the launcher says which),
        else of the lowest failing rank: the others' failures follow from it. A rank that died
        before storing its spans has its finished iterations recovered from its capture arena,
        as the runner does for a level-set process."""
        program, failed_first = end.program, end.first_failure
        ranks: Ranks = []
        for rank, meta in _rank_runs(self.run_dir):
            meta = _recovered(self.run_dir / _rank_dir(rank), meta, end.failed.get(rank))
            if not meta.program:  # how it ended: the launcher's word, or the job's 0
                ended = end.failed.get(rank) or (
                    ProgramEnd(exit_code=0) if program.get("exit_code") == 0 else None
                )
                meta = dataclasses.replace(meta, program=ended)
            ranks.append((rank, meta))
        reasons: list[str] = []
        fatal: str | None = None
        world_size = max((m.world_size or 0 for _, m in ranks), default=0)
        missing = sorted(set(range(world_size)) - {r for r, _ in ranks})
        if not ranks:
            fatal = "no rank stored a run (the workers ended before xsp started in them)"
        elif missing:
            reasons.append(
                f"rank {', '.join(map(str, missing))} of {world_size} stored no run (it ended "
                "before xsp started in it, or ran on another node)"
            )
        for k, (rank, meta) in enumerate(ranks):
            if meta.status == Status.RUNNING:
                error = "it ended before xsp stored its spans"
                meta = dataclasses.replace(meta, status=Status.ERROR, error=error)
                ranks[k] = (rank, meta)
            if meta.status != Status.OK:
                why = meta.status_reasons or (meta.error or meta.status,)
                reasons.extend(f"rank {rank}: {r}" for r in why)
        status = max((m.status for _, m in ranks), key=_badness, default=Status.ERROR)
        code = program.get("exit_code")
        job_failed = (isinstance(code, int) and code != 0) or "signal" in program
        if job_failed and status != Status.ERROR:
            # the job failed (a rank exited nonzero, or a signal killed it, after its spans were
            # stored too): a rank the launcher stopped for it says "interrupted", which is not
            # what happened to the job (an interrupt ends it with no exit code)
            if status == Status.OK or not reasons:
                who = f"rank {failed_first}" if failed_first is not None else "the job"
                fatal = f"{who} {describe_end(program)}"
            status = Status.ERROR
        if missing and status == Status.OK:
            status = Status.PARTIAL
        files: list[str] = []
        spans = 0
        resource = _resource(ranks, self.spec.run.profile.command, world_size)
        if ranks:
            try:
                tables = [store.open_run(self.run_dir / _rank_dir(r)).spans() for r, _ in ranks]
                table = join_ranks(tables, world_size)
                spans = table.num_rows
                if spans:
                    files = [store.write_span_part(self.run_dir, table).name]
                _join_side_tables(self.run_dir, ranks)
                failed = _send(sinks, resource, table)
                if failed and status == Status.OK:
                    status = Status.PARTIAL
                reasons.extend(failed)
            except (StoreError, OSError) as exc:
                fatal, status = f"cannot join the ranks' runs: {exc}", Status.ERROR
                spans, files = 0, []
        if fatal is not None:
            status = Status.ERROR if status != Status.INTERRUPTED else status
            reasons.insert(0, fatal)
        # the rank that failed first leads the reasons: the others' failures follow from it
        first = sorted(ranks, key=lambda item: item[0] != failed_first)
        reasons.sort(key=lambda r: not r.startswith(f"rank {failed_first}: "))
        meta = self._meta(first, status, fatal, reasons, program, resource, spans, files)
        self._write(meta)
        if fatal is None:  # the join is stored: the ranks' own copies go
            for rank, _ in ranks:
                shutil.rmtree(self.run_dir / _rank_dir(rank), ignore_errors=True)
        return meta

    def _meta(
        self,
        ranks: Ranks,
        status: Status | None,
        error: str | None,
        reasons: list[str],
        program: ProgramEnd,
        resource: dict[str, Any],
        spans: int,
        files: list[str],
    ) -> RunMeta:
        metas = [m for _, m in ranks]
        # the ranks come failed-first: the first one not ok leads
        failing = next((m for m in metas if m.status != Status.OK), None)
        phases: dict[str, int] = {}
        for meta in metas:  # each mark when the last rank reached it
            for name, mark in (meta.phases_ns or {}).items():
                if isinstance(mark, int):
                    phases[name] = max(phases.get(name, mark), mark)
        failed_iterations: dict[str, str] = {}
        for rank, meta in ranks:
            for it, why in (meta.failed_iterations or {}).items():
                failed_iterations.setdefault(it, f"rank {rank}: {why}")
        if error is None and reasons and status in (Status.ERROR, Status.INTERRUPTED):
            error = reasons[0]
        figures = _process_figures(metas)
        return RunMeta(
            status=status,
            error=error,
            status_reasons=tuple(dict.fromkeys(reasons)),
            resource=resource,
            program=(failing.program if failing is not None else None) or program,
            iterations_measured=min((m.iterations_measured or 0 for m in metas), default=0),
            world_size=max((m.world_size or 0 for m in metas), default=0),
            spans=spans,
            spans_by_level=_summed([m.spans_by_level for m in metas]),
            events_outside_iterations=sum(m.events_outside_iterations or 0 for m in metas),
            ranges_left_open=sum(m.ranges_left_open or 0 for m in metas),
            failed_iterations=dict(sorted(failed_iterations.items())),
            errors=tuple(f"rank {r}: {e}" for r, m in ranks for e in m.errors or ()),
            phases_ns=phases,
            files=tuple(files),
            finished_ns=time.time_ns(),
            cupti=_summed([m.cupti for m in metas]) if any(m.cupti for m in metas) else None,
            arena=_summed([m.arena for m in metas]) if any(m.arena for m in metas) else None,
            memory_events=(
                sum(m.memory_events or 0 for m in metas)
                if any(m.memory_events is not None for m in metas)
                else None
            ),
            calibration=figures.calibration,
            warmup_steps_ms=figures.warmup_steps_ms,
            warmup_settled=figures.warmup_settled,
            warmup_steps_dropped=figures.warmup_steps_dropped,
            ranks=tuple(_rank_entry(rank, meta) for rank, meta in sorted(ranks)),
            nulls=frozenset() if error is not None else frozenset({"error"}),
        )

    def _write(self, meta: RunMeta) -> None:
        """Write run.json: the level set's identity, then ``meta``."""
        identity = {
            "format": schema.STORE_FORMAT,
            "run_id": self.run_id,
            "measurement_id": self.spec.run.measurement_id,
            "levels": self.spec.run.levels,
            "workload": self.workload,
            "iterations_requested": self.spec.run.profile.iterations,
            "warmup": self.spec.run.profile.warmup,
            "started_ns": self.started_ns,
        }
        path = self.run_dir / store.RUN_META
        try:
            store.write_run_meta(path, RunMeta.from_json({**identity, **meta.to_json()}))
        except OSError as exc:
            log.error("xsp: cannot write %s: %s", path, exc)


def _recovered(rank_dir: Path, meta: RunMeta, program: ProgramEnd | None) -> RunMeta:
    """A rank's run.json, its spans recovered first when it died before storing them."""
    if meta.status != Status.RUNNING:
        return meta
    from xsp.tracer.run.recover import recover_run

    ended = describe_end(program) if program else "ended before xsp stored its spans"
    meta = recover_run(rank_dir, ended) or meta
    return dataclasses.replace(meta, program=program) if program else meta


def _badness(status: Status | None) -> int:
    return STATUS_ORDER.index(status) if status in STATUS_ORDER else len(STATUS_ORDER)


def _rank_dir(rank: int) -> str:
    return f"rank-{rank}"


def _rank_runs(run_dir: Path) -> Ranks:
    """(rank, run.json) of every rank that wrote one, by rank."""
    found = []
    for path in run_dir.glob(f"{RANK_GLOB}/{store.RUN_META}"):
        suffix = path.parent.name.removeprefix("rank-")
        if not suffix.isdigit():
            continue
        try:
            found.append((int(suffix), store.read_run_meta(path)))
        except StoreError as exc:
            log.error("xsp: %s", exc)
    return sorted(found, key=lambda item: item[0])


def _resource(ranks: Ranks, command: Sequence[str], world_size: int) -> dict[str, Any]:
    """The lowest rank's resource, made the job's: no rank of its own, the launcher's process."""
    resource = dict(ranks[0][1].resource or {}) if ranks else {}
    resource.pop(schema.RES_RANK, None)
    resource.update(
        {
            schema.RES_WORLD_SIZE: world_size,
            "process.pid": os.getpid(),
            "process.command_line": " ".join(command)[:500],
        }
    )
    return resource


def _summed(counts: Sequence[Mapping[str, Any] | None]) -> dict[str, Any]:
    """The ranks' counts (each a mapping of numbers), added up."""
    total: dict[str, Any] = {}
    for each in counts:
        for name, value in (each or {}).items():
            if _is_number(value):
                total[name] = total.get(name, 0) + value
            elif value is None and name not in total:
                total[name] = None  # a rank could not say; the sum cannot either
    return total


def _process_figures(metas: Sequence[RunMeta]) -> ProcessFigures:
    """What the replay reads of a level set's process, for the job: F's cost per record (each
    figure the ranks' median) and the warm-up steps timed with the levels off (each step the
    ranks' median: the ranks' steps end together at their collectives); absent where no rank
    has them."""
    calibration: dict[str, Any] | None = None
    calibrations = [m.calibration for m in metas if m.calibration is not None]
    if calibrations:  # its figures the ranks' medians, the rest (probes, device) the first's
        figures = (
            "framework_ns_per_record",
            "module_ns_per_call",
            "framework_ns_per_record_first_iteration",
        )
        calibration = {
            **calibrations[0],
            **{
                key: statistics.median(found)
                for key in figures
                if (found := [c[key] for c in calibrations if _is_number(c.get(key))])
            },
            "ranks": len(calibrations),
        }
    steps = [m.warmup_steps_ms for m in metas if m.warmup_steps_ms]
    if not steps or len(steps) != len(metas):
        return ProcessFigures(calibration)
    return ProcessFigures(
        calibration,
        tuple(round(statistics.median(each), 3) for each in zip(*steps, strict=False)),
        all(bool(m.warmup_settled) for m in metas),
        max(m.warmup_steps_dropped or 0 for m in metas),
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _rank_entry(rank: int, meta: RunMeta) -> RankRun:
    steps = meta.warmup_steps_ms
    return RankRun(
        rank=rank,
        pid=(meta.resource or {}).get("process.pid"),
        status=meta.status,
        error=meta.error,
        status_reasons=list(meta.status_reasons) if meta.status_reasons is not None else None,
        program=meta.program,
        iterations_measured=meta.iterations_measured,
        spans=meta.spans,
        calibration=meta.calibration,
        warmup_steps_ms=list(steps) if steps is not None else None,
    )


def _join_side_tables(run_dir: Path, ranks: Ranks) -> None:
    """The ranks' GPU monitor samples and allocator events, each as one file whose rows carry
    their rank (a rank's span ids are its own, so an event still finds its span)."""
    import pyarrow as pa

    for read, write in (
        (store.Run.monitor, store.write_monitor_samples),
        (store.Run.memory, store.write_memory_events),
    ):
        tables = []
        for rank, _ in ranks:
            table = read(store.open_run(run_dir / _rank_dir(rank)))
            if table is not None and table.num_rows:
                rank_column = pa.array([rank] * table.num_rows, pa.int32())
                tables.append(table.append_column("rank", rank_column))
        if tables:
            write(run_dir, pa.concat_tables(tables, promote_options="permissive"))


def _send(sinks: Sequence[Sink], resource: dict[str, Any], table: Any) -> list[str]:
    """Export the joined spans to ``sinks``; one reason per sink that failed."""
    if not sinks:
        return []
    composite = CompositeSink(list(sinks))
    composite.export(SpanBatch.of(resource, table))
    composite.force_flush()
    composite.shutdown()
    return [f"a sink failed: {error}" for error in composite.errors]

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from xsp.core import schema, store
from xsp.core.errors import StoreError
from xsp.tracer.convert.ranks import join_ranks
from xsp.tracer.export.sinks import CompositeSink, Sink, SpanBatch
from xsp.tracer.run.launcher import JobEnd
from xsp.tracer.run.protocol import RANK_SPEC_ENV, ChildSpec, describe_end

log = logging.getLogger(__name__)

#: Statuses from best to worst: the level set's is the worst of its ranks'.
STATUS_ORDER = ("ok", "partial", "interrupted", "error")
RANK_GLOB = "rank-*"


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
        self._write(
            {"status": "running", "resource": {}, "iterations_measured": 0, "finished_ns": None}
        )

    def rank_environment(self) -> dict[str, str]:
        """What the launcher's workers need in their environment: the spec of their sessions.
        Rank 0 writes its progress lines into this process's progress pipe, by path."""
        fd = self.spec.progress_fd
        ranks = ChildSpec(
            dataclasses.replace(self.spec.run, run_id=self.run_id, workload=self.workload),
            progress_path=f"/proc/{os.getpid()}/fd/{fd}" if fd is not None else None,
        )
        return {RANK_SPEC_ENV: ranks.to_json()}

    def finish(self, end: JobEnd, sinks: Sequence[Sink] = ()) -> dict[str, Any]:
        """Join the ranks' runs into the level set's run; return its run.json. The error and
        program it reports are those of the rank that failed first (the launcher says which),
        else of the lowest failing rank: the others' failures follow from it. A rank that died
        before storing its spans has its finished iterations recovered from its capture arena,
        as the runner does for a level-set process."""
        program, failed_first = end.program, end.first_failure
        ranks = [
            (rank, _recovered(self.run_dir / _rank_dir(rank), meta, end.failed.get(rank)))
            for rank, meta in _rank_runs(self.run_dir)
        ]
        for rank, meta in ranks:  # how each rank ended: the launcher's word, or the job's 0
            if not meta.get("program"):
                meta["program"] = end.failed.get(rank) or (
                    {"exit_code": 0} if program.get("exit_code") == 0 else None
                )
        reasons: list[str] = []
        fatal: str | None = None
        world_size = max((int(m.get("world_size") or 0) for _, m in ranks), default=0)
        missing = sorted(set(range(world_size)) - {r for r, _ in ranks})
        if not ranks:
            fatal = "no rank stored a run (the workers ended before xsp started in them)"
        elif missing:
            reasons.append(
                f"rank {', '.join(map(str, missing))} of {world_size} stored no run (it ended "
                "before xsp started in it, or ran on another node)"
            )
        for rank, meta in ranks:
            if meta.get("status") == "running":
                meta["status"], meta["error"] = "error", "it ended before xsp stored its spans"
            if meta.get("status") != "ok":
                why = meta.get("status_reasons") or [meta.get("error") or meta.get("status")]
                reasons.extend(f"rank {rank}: {r}" for r in why)
        statuses = [str(m.get("status")) for _, m in ranks]
        status = max(statuses, key=_badness, default="error")
        code = program.get("exit_code")
        job_failed = (isinstance(code, int) and code != 0) or "signal" in program
        if job_failed and status != "error":
            # the job failed (a rank exited nonzero, or a signal killed it, after its spans were
            # stored too): a rank the launcher stopped for it says "interrupted", which is not
            # what happened to the job (an interrupt ends it with no exit code)
            if status == "ok" or not reasons:
                who = f"rank {failed_first}" if failed_first is not None else "the job"
                fatal = f"{who} {describe_end(program)}"
            status = "error"
        if missing and status == "ok":
            status = "partial"
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
                if failed and status == "ok":
                    status = "partial"
                reasons.extend(failed)
            except (StoreError, OSError) as exc:
                fatal, status, spans, files = f"cannot join the ranks' runs: {exc}", "error", 0, []
        if fatal is not None:
            status = "error" if status != "interrupted" else status
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
        ranks: list[tuple[int, dict[str, Any]]],
        status: str,
        error: str | None,
        reasons: list[str],
        program: dict[str, Any],
        resource: dict[str, Any],
        spans: int,
        files: list[str],
    ) -> dict[str, Any]:
        metas = [m for _, m in ranks]
        # the ranks come failed-first: the first one not ok leads
        failing = next((m for m in metas if m.get("status") != "ok"), None)
        phases: dict[str, int] = {}
        for meta in metas:  # each mark when the last rank reached it
            for name, mark in (meta.get("phases_ns") or {}).items():
                if isinstance(mark, int):
                    phases[name] = max(phases.get(name, mark), mark)
        failed_iterations: dict[str, str] = {}
        for rank, meta in ranks:
            for it, why in (meta.get("failed_iterations") or {}).items():
                failed_iterations.setdefault(it, f"rank {rank}: {why}")
        return {
            "status": status,
            "error": error
            or (reasons[0] if reasons and status in ("error", "interrupted") else None),
            "status_reasons": list(dict.fromkeys(reasons)),
            "resource": resource,
            "program": (failing or {}).get("program") or program,
            "iterations_measured": min(
                (int(m.get("iterations_measured") or 0) for m in metas), default=0
            ),
            "world_size": max((int(m.get("world_size") or 0) for m in metas), default=0),
            "spans": spans,
            "spans_by_level": _summed(metas, "spans_by_level"),
            "events_outside_iterations": sum(
                int(m.get("events_outside_iterations") or 0) for m in metas
            ),
            "ranges_left_open": sum(int(m.get("ranges_left_open") or 0) for m in metas),
            "failed_iterations": dict(sorted(failed_iterations.items())),
            "errors": [f"rank {r}: {e}" for r, m in ranks for e in m.get("errors") or []],
            "phases_ns": phases,
            "files": files,
            "finished_ns": time.time_ns(),
            **{
                key: _summed(metas, key)
                for key in ("cupti", "arena")
                if any(m.get(key) for m in metas)
            },
            **(
                {"memory_events": sum(int(m.get("memory_events") or 0) for m in metas)}
                if any("memory_events" in m for m in metas)
                else {}
            ),
            **_process_figures(metas),
            "ranks": [_rank_entry(rank, meta) for rank, meta in sorted(ranks)],
        }

    def _write(self, fields: dict[str, Any]) -> None:
        meta = {
            "format": schema.STORE_FORMAT,
            "run_id": self.run_id,
            "measurement_id": self.spec.run.measurement_id,
            "levels": self.spec.run.levels,
            "workload": self.workload,
            "iterations_requested": self.spec.run.profile.iterations,
            "warmup": self.spec.run.profile.warmup,
            "started_ns": self.started_ns,
            **fields,
        }
        try:
            store.write_json_atomic(self.run_dir / store.RUN_META, meta)
        except OSError as exc:
            log.error("xsp: cannot write %s: %s", self.run_dir / store.RUN_META, exc)


def _recovered(
    rank_dir: Path, meta: dict[str, Any], program: dict[str, Any] | None
) -> dict[str, Any]:
    """A rank's run.json, its spans recovered first when it died before storing them."""
    if meta.get("status") != "running":
        return meta
    from xsp.tracer.run.recover import recover_run

    ended = describe_end(program) if program else "ended before xsp stored its spans"
    recovered = recover_run(rank_dir, ended)
    meta = recovered.to_json() if recovered is not None else meta
    if program:
        meta["program"] = program
    return meta


def _badness(status: str) -> int:
    return STATUS_ORDER.index(status) if status in STATUS_ORDER else len(STATUS_ORDER)


def _rank_dir(rank: int) -> str:
    return f"rank-{rank}"


def _rank_runs(run_dir: Path) -> list[tuple[int, dict[str, Any]]]:
    """(rank, run.json) of every rank that wrote one, by rank."""
    found = []
    for path in run_dir.glob(f"{RANK_GLOB}/{store.RUN_META}"):
        suffix = path.parent.name.removeprefix("rank-")
        if not suffix.isdigit():
            continue
        try:
            found.append((int(suffix), store.read_json(path)))
        except StoreError as exc:
            log.error("xsp: %s", exc)
    return sorted(found, key=lambda item: item[0])


def _resource(
    ranks: list[tuple[int, dict[str, Any]]], command: Sequence[str], world_size: int
) -> dict[str, Any]:
    """The lowest rank's resource, made the job's: no rank of its own, the launcher's process."""
    resource = dict(ranks[0][1].get("resource") or {}) if ranks else {}
    resource.pop(schema.RES_RANK, None)
    resource.update(
        {
            schema.RES_WORLD_SIZE: world_size,
            "process.pid": os.getpid(),
            "process.command_line": " ".join(command)[:500],
        }
    )
    return resource


def _summed(metas: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The ranks' counts under ``key`` (a dict of numbers), added up."""
    total: dict[str, Any] = {}
    for meta in metas:
        for name, value in (meta.get(key) or {}).items():
            if _is_number(value):
                total[name] = total.get(name, 0) + value
            elif value is None and name not in total:
                total[name] = None  # a rank could not say; the sum cannot either
    return total


def _process_figures(metas: list[dict[str, Any]]) -> dict[str, Any]:
    """What the replay reads of a level set's process, for the job: F's cost per record (each
    figure the ranks' median) and the warm-up steps timed with the levels off (each step the
    ranks' median: the ranks' steps end together at their collectives); absent where no rank
    has them."""
    out: dict[str, Any] = {}
    calibrations = [m["calibration"] for m in metas if isinstance(m.get("calibration"), dict)]
    if calibrations:  # its figures the ranks' medians, the rest (probes, device) the first's
        figures = (
            "framework_ns_per_record",
            "module_ns_per_call",
            "framework_ns_per_record_first_iteration",
        )
        out["calibration"] = {
            **calibrations[0],
            **{
                key: statistics.median(found)
                for key in figures
                if (found := [c[key] for c in calibrations if _is_number(c.get(key))])
            },
            "ranks": len(calibrations),
        }
    steps = [m["warmup_steps_ms"] for m in metas if m.get("warmup_steps_ms")]
    if steps and len(steps) == len(metas):
        out["warmup_steps_ms"] = [
            round(statistics.median(each), 3) for each in zip(*steps, strict=False)
        ]
        out["warmup_settled"] = all(bool(m.get("warmup_settled")) for m in metas)
        out["warmup_steps_dropped"] = max(int(m.get("warmup_steps_dropped") or 0) for m in metas)
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _rank_entry(rank: int, meta: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "status",
        "error",
        "status_reasons",
        "program",
        "iterations_measured",
        "spans",
        "calibration",
        "warmup_steps_ms",
    )
    pid = (meta.get("resource") or {}).get("process.pid")
    return {"rank": rank, "pid": pid, **{k: meta.get(k) for k in keys}}


def _join_side_tables(run_dir: Path, ranks: list[tuple[int, dict[str, Any]]]) -> None:
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

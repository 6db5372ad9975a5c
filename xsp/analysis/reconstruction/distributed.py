"""Multi-rank analyses: pure functions from a measurement store to tables, each empty for a
single-rank measurement.

- ``rank_summary``: each rank's step, as M measured it and as the leveled reconstruction rebuilt
  it, its collectives and how often it was the straggler.
- ``communication_overlap``: per rank, communication against computation time and their overlap
  (Holistic Trace Analysis's comm/comp overlap): on a GPU run with NCCL kernels, NCCL kernels
  against the other kernels, as HTA counts them; else, on the host, the collective spans (c10d
  calls and the backend's work, such as gloo's transfer on its own thread) against the
  framework spans that hold no collective (the ops that compute). Overlapping spans count once;
  the overlap is the time both run.
- ``collective_skew``: per collective, matched across ranks by its ordinal among the rank's c10d
  calls of the iteration: when each rank arrived (called it), the skew between the first and the
  last arrival, the time the ranks spent waiting for the last one (the straggler, named), and the
  straggler's own time in it, about the transfer alone.

Every figure is of complete iterations: an iteration in which a rank failed, stepped no more,
or was cut short is left out for all ranks (the others waited in a collective for it), and a
rank's own step figures leave out its incomplete steps, as ``xsp summary`` does.

Times are compared across ranks as recorded: ranks on one host share its clock; ranks on several
hosts carry their clocks' offsets into the skew.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xsp.analysis.measurement.store import MeasurementStore
from xsp.analysis.reconstruction.reconstruct import reconstruct
from xsp.analysis.tables.kernels import union_length
from xsp.core import schema
from xsp.core.intervals import find_rows

__all__ = [
    "COMPUTE_KINDS",
    "OVERLAP_SCHEMA",
    "collective_skew",
    "communication_overlap",
    "is_multi_rank",
    "rank_summary",
]

#: The run with the fewest levels that recorded collectives (the least overhead on their times).
_COLLECTIVE_RUN = """(SELECT arg_min(run_index, length(levels)) FROM spans
                      WHERE kind = 'collective')"""
#: The deepest run with NCCL kernels: HTA's overlap is read from the GPU when there is one.
_NCCL_RUN = """(SELECT max(run_index) FROM spans WHERE kind = 'kernel' AND name ILIKE 'nccl%')"""

#: The iterations of each run that every rank finished: each rank's step is there and none
#: failed or was cut short by the session's end (its status message says so). An iteration a
#: rank died in leaves the others hanging in a collective, which no figure should average in.
_COMPLETE = """
    ranks_of AS (SELECT run_index, count(DISTINCT rank) AS n FROM spans
                 WHERE kind = 'step' AND rank IS NOT NULL GROUP BY run_index),
    complete AS (
        SELECT s.run_index, s.iteration FROM spans s JOIN ranks_of USING (run_index)
        WHERE s.kind = 'step' AND s.rank IS NOT NULL
        GROUP BY s.run_index, s.iteration, ranks_of.n
        HAVING bool_and(s.status_message IS NULL) AND count(DISTINCT s.rank) = ranks_of.n
    )"""

#: Framework spans that compute, unless they hold a collective.
COMPUTE_KINDS = (
    schema.KIND_OP,
    schema.KIND_MODULE,
    schema.KIND_BACKWARD,
    schema.KIND_OPTIMIZER,
)

OVERLAP_SCHEMA = pa.schema(
    [
        ("rank", pa.int64()),
        ("iterations", pa.int64()),
        ("step_ms_per_iteration", pa.float64()),
        ("compute_ms_per_iteration", pa.float64()),
        ("communication_ms_per_iteration", pa.float64()),
        ("overlap_ms_per_iteration", pa.float64()),
        ("exposed_communication_ms_per_iteration", pa.float64()),
        ("overlap_pct", pa.float64()),
        ("communication_pct", pa.float64()),
        ("source", pa.string()),
    ]
)


def is_multi_rank(store: MeasurementStore) -> bool:
    """True when a run of the measurement holds the spans of more than one rank."""
    return any(int(run.resource.get(schema.RES_WORLD_SIZE) or 0) > 1 for run in store.runs)


def communication_overlap(store: MeasurementStore) -> pa.Table:
    """Per rank: iterations, step_ms_per_iteration, compute_ms_per_iteration,
    communication_ms_per_iteration, overlap_ms_per_iteration (both at once),
    exposed_communication_ms_per_iteration (communication with no computation beside it),
    overlap_pct (of the communication time, as HTA reports it), communication_pct (of the step)
    and source (``gpu kernels`` or ``host spans``). Intervals are clipped to the rank's step."""
    if not is_multi_rank(store):
        return OVERLAP_SCHEMA.empty_table()
    gpu = store.sql(f"SELECT {_NCCL_RUN} AS r").column("r")[0].as_py()
    if gpu is not None:
        run, source = int(gpu), "gpu kernels"
        work = store.sql(
            f"""SELECT rank, iteration, start_ns, start_ns + dur_ns AS end_ns,
                       name ILIKE 'nccl%' AS is_communication, true AS is_computation
                FROM spans WHERE run_index = {run} AND kind = 'kernel'"""
        ).to_pydict()
    else:
        found = store.sql(f"SELECT {_COLLECTIVE_RUN} AS r").column("r")[0].as_py()
        if found is None:
            return OVERLAP_SCHEMA.empty_table()
        run, source = int(found), "host spans"
        work = _host_work(store, run)
    steps = store.sql(
        f"""WITH {_COMPLETE}
            SELECT rank, iteration, start_ns, start_ns + dur_ns AS end_ns FROM spans
            WHERE run_index = {run} AND kind = 'step' AND rank IS NOT NULL
              AND iteration IN (SELECT iteration FROM complete WHERE run_index = {run})"""
    ).to_pylist()
    rank = np.asarray(work["rank"], dtype=np.int64)
    iteration = np.asarray(work["iteration"], dtype=np.int64)
    start = np.asarray(work["start_ns"], dtype=np.int64)
    end = np.asarray(work["end_ns"], dtype=np.int64)
    comm = np.asarray(work["is_communication"], dtype=bool)
    keep = comm | np.asarray(work["is_computation"], dtype=bool)
    rank, iteration, start, end, comm = (
        rank[keep],
        iteration[keep],
        start[keep],
        end[keep],
        comm[keep],
    )
    per_rank: dict[int, list[tuple[int, int, int, int]]] = {}
    for step in steps:
        rows = (rank == step["rank"]) & (iteration == step["iteration"])
        lo, hi = step["start_ns"], step["end_ns"]
        s, e = np.clip(start[rows], lo, hi), np.clip(end[rows], lo, hi)
        c = comm[rows]
        computing = union_length(s[~c], e[~c])
        communicating = union_length(s[c], e[c])
        both = computing + communicating - union_length(s, e)
        per_rank.setdefault(step["rank"], []).append((hi - lo, computing, communicating, both))
    out = []
    for r, values in sorted(per_rank.items()):
        step_ns, computing, communicating, both = (np.mean(v) for v in zip(*values, strict=True))
        out.append(
            {
                "rank": r,
                "iterations": len(values),
                "step_ms_per_iteration": step_ns / 1e6,
                "compute_ms_per_iteration": computing / 1e6,
                "communication_ms_per_iteration": communicating / 1e6,
                "overlap_ms_per_iteration": both / 1e6,
                "exposed_communication_ms_per_iteration": (communicating - both) / 1e6,
                "overlap_pct": 100.0 * both / communicating if communicating else None,
                "communication_pct": 100.0 * communicating / step_ns if step_ns else None,
                "source": source,
            }
        )
    return pa.Table.from_pylist(out, schema=OVERLAP_SCHEMA)


def _host_work(store: MeasurementStore, run: int) -> dict[str, Any]:
    """The framework spans of ``run``: collectives communicate; the ops, layers, autograd nodes
    and optimizer calls with no collective inside them compute (one that holds a collective
    call, such as the autograd node whose hook starts DDP's all-reduce, counts through its
    other children)."""
    spans = store.sql(
        f"""SELECT span_id, parent_span_id, rank, iteration, start_ns,
                   start_ns + dur_ns AS end_ns, kind FROM spans
            WHERE run_index = {run} AND level = 'framework' AND rank IS NOT NULL"""
    ).to_pydict()
    kind = np.asarray(spans["kind"], dtype=object)
    collective = kind == schema.KIND_COLLECTIVE
    parent = find_rows(
        np.asarray(spans["span_id"], dtype=np.uint64),
        np.asarray(spans["parent_span_id"], dtype=np.uint64),
    )
    holds = np.zeros(len(kind), dtype=bool)
    up = parent[collective]
    while len(up := up[up >= 0]):
        holds[up] = True
        up = parent[up]
    computing = np.isin(kind, COMPUTE_KINDS) & ~collective & ~holds
    return {**spans, "is_communication": collective, "is_computation": computing}


#: Each rank's c10d calls in the collective run's complete iterations, numbered within its
#: iteration, with the time the collective ended for it: the end of its backend work (the k-th
#: work range of the same operation), or of the call when the backend records none.
_ARRIVALS = f"""
    WITH {_COMPLETE},
    c AS (SELECT * FROM spans WHERE run_index = {_COLLECTIVE_RUN}
          AND kind = 'collective' AND rank IS NOT NULL
          AND iteration IN (SELECT iteration FROM complete WHERE run_index = {_COLLECTIVE_RUN})),
    calls AS (
        SELECT rank, iteration, collective, collective_bytes, start_ns, start_ns + dur_ns AS end_ns,
               row_number() OVER (PARTITION BY rank, iteration ORDER BY start_ns) - 1 AS ordinal,
               row_number() OVER (PARTITION BY rank, iteration, collective ORDER BY start_ns)
                   AS nth
        FROM c WHERE name LIKE 'c10d::%'
    ),
    works AS (
        SELECT rank, iteration, collective, start_ns + dur_ns AS end_ns,
               row_number() OVER (PARTITION BY rank, iteration, collective ORDER BY start_ns)
                   AS nth
        FROM c WHERE name NOT LIKE 'c10d::%'
    ),
    arrivals AS (
        SELECT calls.rank, calls.iteration, calls.ordinal, calls.collective,
               calls.collective_bytes, calls.start_ns,
               greatest(calls.end_ns, coalesce(works.end_ns, calls.end_ns)) AS end_ns
        FROM calls LEFT JOIN works USING (rank, iteration, collective, nth)
    ),
    matched AS (
        SELECT *, max(start_ns) OVER (PARTITION BY iteration, ordinal) AS last_ns,
               count(*) OVER (PARTITION BY iteration, ordinal) AS ranks
        FROM arrivals
    )"""


def collective_skew(store: MeasurementStore) -> pa.Table:
    """Per collective seen on two ranks or more: iteration, ordinal (among the rank's c10d
    calls of the iteration), collective, bytes, ranks, first_rank, straggler_rank (the last to
    arrive), skew_ms (last arrival against first), wait_ms (the time the ranks spent waiting for
    the straggler, added up) and straggler_ms (the straggler's time from its call to the end of
    the collective: about the transfer alone)."""
    if not is_multi_rank(store) or not _has_collectives(store):
        return _empty_skew()
    return store.sql(
        f"""{_ARRIVALS}
        SELECT iteration, ordinal, string_agg(DISTINCT collective, ',') AS collective,
               max(collective_bytes) AS bytes, any_value(ranks) AS ranks,
               arg_min(rank, start_ns) AS first_rank, arg_max(rank, start_ns) AS straggler_rank,
               (max(start_ns) - min(start_ns)) / 1e6 AS skew_ms,
               sum(last_ns - start_ns) / 1e6 AS wait_ms,
               arg_max(end_ns - start_ns, start_ns) / 1e6 AS straggler_ms
        FROM matched WHERE ranks > 1
        GROUP BY iteration, ordinal ORDER BY iteration, ordinal
        """
    )


def rank_summary(store: MeasurementStore) -> pa.Table:
    """Per rank: step_median_ms (as the shallowest run with M measured it),
    reconstructed_step_median_ms (the leveled reconstruction's), collectives_per_iteration,
    straggler_count (collectives this rank arrived at last) and wait_ms_per_iteration (time it
    spent waiting in collectives for a later rank)."""
    if not is_multi_rank(store):
        return pa.table({})
    measured = store.sql(
        """SELECT rank, count(*) AS iterations, median(dur_ns) / 1e6 AS step_median_ms
           FROM spans WHERE kind = 'step' AND rank IS NOT NULL AND status_message IS NULL
             AND run_index = (SELECT arg_min(run_index, length(levels)) FROM spans)
           GROUP BY rank"""
    ).to_pylist()
    rebuilt = reconstruct(store)[0]
    steps = rebuilt.filter(
        pc.and_(
            pc.equal(rebuilt.column("kind"), schema.KIND_STEP),
            pc.is_null(rebuilt.column("status_message")),
        )
    )
    step_rank = np.asarray(steps.column("rank").fill_null(-1), dtype=np.int64)
    step_dur = np.asarray(steps.column("dur_ns"), dtype=np.int64)
    median = {int(r): float(np.median(step_dur[step_rank == r])) / 1e6 for r in set(step_rank)}
    collectives: dict[int, dict[str, float]] = {}
    if _has_collectives(store):
        collectives = {
            row["rank"]: row
            for row in store.sql(
                f"""{_ARRIVALS}
                , iterations AS (SELECT greatest(count(*), 1) AS n FROM complete
                                 WHERE run_index = {_COLLECTIVE_RUN})
                SELECT rank, count(*) / any_value(iterations.n) AS per_iteration,
                       count(*) FILTER (WHERE start_ns = last_ns AND ranks > 1) AS last,
                       sum(last_ns - start_ns) / any_value(iterations.n) / 1e6 AS wait_ms
                FROM matched, iterations GROUP BY rank"""
            ).to_pylist()
        }
    rows = []
    for row in sorted(measured, key=lambda r: r["rank"]):
        seen = collectives.get(row["rank"], {})
        rows.append(
            {
                "rank": row["rank"],
                "iterations": row["iterations"],
                "step_median_ms": row["step_median_ms"],
                "reconstructed_step_median_ms": median.get(row["rank"]),
                "collectives_per_iteration": seen.get("per_iteration", 0.0),
                "straggler_count": int(seen.get("last", 0)),
                "wait_ms_per_iteration": seen.get("wait_ms"),
            }
        )
    return pa.Table.from_pylist(rows)


def _has_collectives(store: MeasurementStore) -> bool:
    return store.sql(f"SELECT {_COLLECTIVE_RUN} AS r").column("r")[0].as_py() is not None


def _empty_skew() -> pa.Table:
    return pa.schema(
        [
            ("iteration", pa.int32()),
            ("ordinal", pa.int64()),
            ("collective", pa.string()),
            ("bytes", pa.int64()),
            ("ranks", pa.int64()),
            ("first_rank", pa.int32()),
            ("straggler_rank", pa.int32()),
            ("skew_ms", pa.float64()),
            ("wait_ms", pa.float64()),
            ("straggler_ms", pa.float64()),
        ]
    ).empty_table()

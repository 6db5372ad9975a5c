"""The collector's store on S3 (``xsp collector serve --store s3://bucket/prefix``): the writer
writes into a local working copy laid out as a local store, and this module keeps each run
directory of it in step with the object store while the collector runs.

- ``pull`` (before the writer indexes a run directory, and again before it settles run.json)
  lists the run's prefix and downloads the span parts that other writers (the other replicas)
  added or rewrote since, and then their run.json, so the writer's dedupe sees their spans as
  it sees its own. Only span parts come down (the dedupe reads their key columns); another
  writer's ``resources-*`` files stay on S3, where readers find them. The run.json that comes
  down is merged with the working copy's (``merged_meta``): this writer's own counts (its parts'
  duplicates, the requests it quarantined) stay where their upload failed.
- ``push`` (once a part and run.json are written) uploads exactly the part just written (its
  ``resources-`` and ``spans-`` files) and run.json, each as one whole object, in that order
  (``ObjectStore.send``), so a reader that finds an index or a part finds what it names.

The collector removes a spool segment only once ``push`` returned for every run it wrote, so a
crash or an S3 outage before that keeps the segment, which is replayed and stored (once: the
replayed part replaces its own name) when S3 answers again. An S3 error is a ``StoreError``,
which the flusher retries with back-off like a full disk.

Own parts (``Spool.is_own_part``): with ``--replica NAME``, the parts of this replica's
segments; without, every part (the collector is the store's only writer). Another writer's
objects are never uploaded or deleted here.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from xsp.collector.spool import Spool
from xsp.core import store
from xsp.core.errors import StoreError
from xsp.core.store import RUN_META, RunMeta
from xsp.core.store.location import ObjectStore, object_store

__all__ = ["MAX_LOOKED_RUNS", "ObjectMirror", "StoreTarget", "merged_meta"]

log = logging.getLogger(__name__)

_SPANS, _RESOURCES, _PARQUET = "spans-", "resources-", ".parquet"
#: Run directories whose run.json this process fetched at least once, remembered (the least
#: recently pulled forgotten first); a forgotten one's run.json is fetched again when next pulled.
MAX_LOOKED_RUNS = 1024


@dataclass(frozen=True)
class StoreTarget:
    """Where a writer stores (crosses to the store worker process): the local store, or the
    local working copy of the object store at ``uri``; ``replica`` names the writer's parts."""

    root: Path
    uri: str | None = None
    replica: str | None = None


class ObjectMirror:
    """The run directories of the working copy ``root`` and the objects under ``uri``."""

    def __init__(
        self,
        uri: str,
        root: Path,
        replica: str | None = None,
        env: Mapping[str, str] | None = None,
        max_runs: int = MAX_LOOKED_RUNS,
    ) -> None:
        self.store = object_store(uri, env)
        self.root = Path(root)
        self.replica = replica
        self._max_runs = max_runs
        self._looked: OrderedDict[str, None] = OrderedDict()  # least recently pulled first

    def _own(self, part: str) -> bool:
        return Spool.is_own_part(part, self.replica)

    def _run(self, run_dir: Path) -> tuple[str, ObjectStore]:
        relative = run_dir.relative_to(self.root).as_posix()
        base = self.store
        return relative, ObjectStore(f"{base.uri}/{relative}", base.fs, base.key(relative))

    def pull(self, run_dir: Path, meta: bool = False) -> int:
        """Download the span parts of ``run_dir`` that another writer added or rewrote (its
        size differs) since, and its run.json when any came, on this process's first look at
        the run, or with ``meta``; own parts only where the working copy lacks them. The
        number of other writers' parts that came."""
        relative, objects = self._run(run_dir)
        listed = objects.listing()
        first = relative not in self._looked
        wanted, came = [], 0
        for name, size in sorted(listed.items()):
            if not (name.startswith(_SPANS) and name.endswith(_PARQUET)):
                continue
            path = run_dir / name
            if self._own(name[len(_SPANS) : -len(_PARQUET)]):
                if not path.is_file():  # the working copy lost it: the dedupe needs it back
                    wanted.append(name)
            elif not path.is_file() or path.stat().st_size != size:
                wanted.append(name)
                came += 1
        objects.fetch(run_dir, wanted)
        if (came or first or meta) and RUN_META in listed:
            self._take_meta(run_dir, objects.get(RUN_META))
        self._looked[relative] = None
        self._looked.move_to_end(relative)
        while len(self._looked) > self._max_runs:
            self._looked.popitem(last=False)
        return came

    def _take_meta(self, run_dir: Path, data: bytes) -> None:
        """The other writers' run.json (their spans, resource, duplicate and quarantine
        counts) in place of the working copy's, this writer's own counts kept."""
        path = run_dir / RUN_META
        try:
            document = json.loads(data)
            if not isinstance(document, dict):
                raise ValueError("not a JSON object")
            theirs = RunMeta.from_json(document)
        except (StoreError, ValueError, RecursionError) as exc:  # ours stays, the next counts
            log.warning("xsp collector: ignoring the run.json of %s: %s", run_dir, exc)
            return
        try:
            ours = store.read_run_meta(path)
        except StoreError:  # none yet (or unreadable): theirs alone
            ours = None
        merged = theirs if ours is None else merged_meta(theirs, ours, self._own)
        store.write_run_meta(path, merged)

    def push(self, run_dir: Path, part_name: str | None = None) -> int:
        """Upload the part ``part_name`` just written into ``run_dir`` (its resources and span
        files, those there) and run.json, each as one whole object, in that order; without
        ``part_name``, run.json alone. The number uploaded."""
        names = [f"{_RESOURCES}{part_name}{_PARQUET}", f"{_SPANS}{part_name}{_PARQUET}"]
        names = [*(names if part_name is not None else ()), RUN_META]
        files = {name: run_dir / name for name in names if (run_dir / name).is_file()}
        _, objects = self._run(run_dir)
        objects.send(files, list(files), remember=False)  # resources, spans, run.json
        return len(files)


def merged_meta(theirs: RunMeta, ours: RunMeta, own: Callable[[str], bool]) -> RunMeta:
    """``theirs`` (the run.json on S3) with the counts that ``ours`` (the working copy's) may
    hold alone, where their upload failed: the duplicates of this writer's own parts (``own``:
    ours replace theirs), and the quarantined requests either names (a file counted once)."""
    by_part = {
        **(theirs.duplicate_spans_skipped_by_part or {}),
        **{k: v for k, v in (ours.duplicate_spans_skipped_by_part or {}).items() if own(k)},
    }
    items = tuple(dict.fromkeys((*(theirs.quarantined or ()), *(ours.quarantined or ()))))
    requests = max(theirs.quarantined_requests or 0, ours.quarantined_requests or 0, len(items))
    if by_part:
        theirs = replace(
            theirs,
            duplicate_spans_skipped=sum(by_part.values()),
            duplicate_spans_skipped_by_part=dict(sorted(by_part.items())),
        )
    if items or requests:
        theirs = replace(theirs, quarantined_requests=requests, quarantined=items or None)
    return theirs

"""The collector's store on S3 (``xsp collector serve --store s3://bucket/prefix``): the writer
writes into a local working copy laid out as a local store, and this module keeps each run
directory of it in step with the object store while the collector runs.

- ``pull`` (before the writer indexes a run directory, and again before it settles run.json)
  lists the run's prefix and downloads the span parts that other writers (the other replicas)
  added or rewrote since, and then their run.json, so the writer's dedupe sees their spans as
  it sees its own. Only span parts come down (the dedupe reads their key columns); another
  writer's ``resources-*`` files stay on S3, where readers find them.
- ``push`` (once a part and run.json are written) uploads this writer's own new or changed
  files of the run directory, each as one whole object (``ObjectStore.put``): resources, then
  span parts, then run.json, so a reader that finds an index or a part finds what it names.

The collector removes a spool segment only once ``push`` returned for every run it wrote, so a
crash or an S3 outage before that keeps the segment, which is replayed and stored (once: the
replayed part replaces its own name) when S3 answers again. An S3 error is a ``StoreError``,
which the flusher retries with back-off like a full disk.

Own files: with ``--replica NAME``, the parts whose name ends with ``-NAME`` and run.json;
without, every part (the collector is the store's only writer). Another writer's objects are
never uploaded or deleted here.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from xsp.core.store import RUN_META
from xsp.core.store.location import ObjectStore, object_store

__all__ = ["ObjectMirror", "StoreTarget"]

#: Objects sent at a time (each one request, mostly waiting on the network).
_THREADS = 8
_PART = re.compile(r"(?P<kind>spans|resources)-(?P<name>.+)\.parquet")
#: Upload order within a run directory: resources before the spans naming them, run.json last.
_RANK = {"resources": 0, "spans": 1}


@dataclass(frozen=True)
class StoreTarget:
    """Where a writer stores (crosses to the store worker process): the local store, or the
    local working copy of the object store at ``uri``; ``replica`` names the writer's parts."""

    root: Path
    uri: str | None = None
    replica: str | None = None


@dataclass(frozen=True)
class _Stat:
    size: int
    mtime_ns: int


def _stat(path: Path) -> _Stat:
    info = path.stat()
    return _Stat(info.st_size, info.st_mtime_ns)


class ObjectMirror:
    """The run directories of the working copy ``root`` and the objects under ``uri``."""

    def __init__(
        self,
        uri: str,
        root: Path,
        replica: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.store = object_store(uri, env)
        self.root = Path(root)
        self.replica = replica
        self._started_ns = time.time_ns()
        self._sent: dict[str, _Stat] = {}  # own file -> its stat when uploaded (or found there)
        self._looked: set[str] = set()  # run directories listed by this process

    def _own(self, name: str) -> bool:
        if name == RUN_META:
            return True
        match = _PART.fullmatch(name)
        if match is None:
            return False
        if self.replica is None:
            return True
        own = rf"c[0-9a-f]{{16}}-[0-9]{{6}}-{re.escape(self.replica)}"
        return re.fullmatch(own, match["name"]) is not None

    def _run(self, run_dir: Path) -> tuple[str, ObjectStore]:
        relative = run_dir.relative_to(self.root).as_posix()
        base = self.store
        return relative, ObjectStore(f"{base.uri}/{relative}", base.fs, base.key(relative))

    def pull(self, run_dir: Path) -> int:
        """Download the span parts of ``run_dir`` that another writer added or rewrote (its
        size differs) since, and its run.json when any came (or on this process's first look);
        own parts only where the working copy lacks them. The number of parts that came."""
        relative, objects = self._run(run_dir)
        listed = objects.listing()
        first = relative not in self._looked
        came = 0
        for name, size in sorted(listed.items()):
            match = _PART.fullmatch(name)
            if match is None or match["kind"] != "spans":
                continue
            path = run_dir / name
            here = _stat(path) if path.is_file() else None
            if self._own(name):
                if here is None:  # the working copy lost it: the dedupe needs it back
                    self._sent[f"{relative}/{name}"] = _download(objects, name, path)
                elif first and here.size == size and here.mtime_ns < self._started_ns:
                    self._sent[f"{relative}/{name}"] = here  # an earlier start's, already up
                continue
            if here is None or here.size != size:
                _download(objects, name, path)
                came += 1
        if (came or first) and RUN_META in listed:
            # the other writers' duplicate and quarantine counts (the writer keeps its own)
            _download(objects, RUN_META, run_dir / RUN_META)
        self._looked.add(relative)
        return came

    def push(self, run_dir: Path, meta_only: bool = False) -> int:
        """Upload this writer's new or changed files of ``run_dir`` (with ``meta_only``, its
        run.json alone), each as one whole object, resources, then span parts, then run.json;
        the number uploaded."""
        relative, objects = self._run(run_dir)
        changed: dict[int, list[Path]] = {}
        for path in run_dir.iterdir() if run_dir.is_dir() else ():
            if not path.is_file() or not self._own(path.name):
                continue
            if meta_only and path.name != RUN_META:
                continue
            if self._sent.get(f"{relative}/{path.name}") != _stat(path):
                match = _PART.fullmatch(path.name)
                rank = _RANK[match["kind"]] if match else len(_RANK)
                changed.setdefault(rank, []).append(path)

        def send(path: Path) -> None:
            seen = _stat(path)
            objects.put(path.name, path.read_bytes())  # read whole first: never half a file
            self._sent[f"{relative}/{path.name}"] = seen

        for rank in sorted(changed):  # each rank up before the next
            with ThreadPoolExecutor(_THREADS) as pool:
                list(pool.map(send, changed[rank]))
        return sum(len(paths) for paths in changed.values())


def _download(objects: ObjectStore, name: str, path: Path) -> _Stat:
    """One object into ``path``, whole: written under a temporary name, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".tmp-{name}")
    partial.write_bytes(objects.get(name))
    os.replace(partial, path)
    return _stat(path)

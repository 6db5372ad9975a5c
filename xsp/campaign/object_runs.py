"""A campaign's runs on an object store (``--out s3://bucket/prefix``): each job runs into a
scratch directory of the node it runs on and is published from there as ``runs/<job>/``, whole
(``xsp.core.store.location.ObjectStore.publish``: the index deleted first and written last),
so no node reads or writes another's disk and the driver never copies a run.

It answers what ``CampaignStore``'s staging answers on a shared file system (``stage``,
``attempts``, ``commit``, ``clear_staging``): an attempt is marked by an empty object
``staging/<job>/<attempt>`` while its job runs, so a retry knows its number, and the driver
drops the marks once the job is recorded.
"""

from __future__ import annotations

import glob
import os
import re
import secrets
import shutil
import socket
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the CLI reads the patterns without pyarrow
    from xsp.campaign.spec import Job
    from xsp.core.store.location import ObjectStore

__all__ = ["COMMITTED", "RECORDS", "STAGED", "ObjectRuns", "new_attempt", "sweep_scratch"]

#: The driver's records: the campaign's spec and one result a job, stored as each job ends.
RECORDS = ("campaign.json", "jobs/*")
#: What ``campaign run`` stages of a campaign on an object store: its records and Ray's log
#: (``ray_executor.RAY_LOG``); its runs stay where each job published them.
STAGED = (*RECORDS, "ray-driver.log")
#: The prefixes that are published whole: a reader takes one without its index as absent.
COMMITTED = ("runs/*",)


def new_attempt() -> str:
    """A name unique to one attempt at a job: ``<host>-<pid>-<random>``, the host and the
    process that run it (``sweep_scratch`` reads the pid back)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: running
        return True
    return True


def sweep_scratch(job: Job, scratch: Path) -> list[Path]:
    """Remove from ``scratch`` (this node's temporary directory) the scratch directories of
    ``job``'s earlier attempts on this host whose process is no longer running (a worker
    killed mid-job: no ``finally`` ran); the ones removed."""
    prefix = f"xsp-job-{job.id}-{socket.gethostname()}-"
    attempt = re.compile(r"(\d+)-[0-9a-f]{6}-")  # <pid>-<random>- and mkdtemp's suffix
    swept = []
    for path in scratch.glob(f"{glob.escape(prefix)}*"):
        found = attempt.match(path.name[len(prefix) :])
        if path.is_dir() and found and not _running(int(found.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            swept.append(path)
    return swept


class ObjectRuns:
    """The runs of the campaign at ``uri``, written by whichever node runs each job."""

    def __init__(self, uri: str, store: ObjectStore | None = None) -> None:
        self.uri = uri
        self._store = store

    @classmethod
    def of_staged(cls, local: Path) -> ObjectRuns | None:
        """The runs of the campaign that the staging directory ``local`` stands for (None
        for a local campaign), with its spec stored at once."""
        from xsp.core.store.location import staged_store

        staged = staged_store(local)
        if staged is None:
            return None
        runs = cls(staged.uri, staged)
        runs.record(local)
        return runs

    def record(self, local: Path) -> None:
        """Store the spec and the job records that are new or changed in ``local`` (the
        driver's staged copy), each one whole object: a job's record goes up as it ends, so
        a driver killed later loses none."""
        self.store.upload(local, RECORDS)

    @property
    def store(self) -> ObjectStore:
        if self._store is None:  # opened where it is used: on the Ray worker, from its env
            from xsp.core.store.location import object_store

            self._store = object_store(self.uri)
        return self._store

    def stage(self, job: Job, attempt: str) -> Path:
        """A new local directory for one attempt at ``job`` (``attempt``: unique to it,
        ``new_attempt``), in this node's temporary directory, and the attempt's mark in the
        store. The scratch directories that dead attempts of the job left here go first: each
        is a whole measurement."""
        sweep_scratch(job, Path(tempfile.gettempdir()))
        self.store.put(f"staging/{job.id}/{attempt}", b"")
        return Path(tempfile.mkdtemp(prefix=f"xsp-job-{job.id}-{attempt}-"))

    def attempts(self, job: Job) -> list[str]:
        """The marks of ``job``'s attempts since the driver last cleared them."""
        return sorted(self.store.listing(f"staging/{job.id}"))

    def commit(self, job: Job, staged: Path) -> None:
        """Publish a finished attempt as the job's run, replacing an earlier attempt's, and
        drop the local copy. An attempt that wrote nothing (refused before it ran) replaces
        nothing."""
        try:
            if staged.is_dir() and any(staged.iterdir()):
                self.store.publish(staged, f"runs/{job.id}")
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def clear_staging(self, job: Job) -> None:
        """Drop the marks of ``job``'s attempts (its record is written)."""
        for mark in self.store.listing(f"staging/{job.id}"):
            self.store.delete(mark)

"""Campaign jobs on a Ray cluster (``xsp campaign run --executor ray``).

Each job is a Ray task that asks for one GPU (a CUDA campaign) or one CPU. The task writes the
job's measurement straight into the campaign's store. On a shared file system: into a staging
directory of its own, moved in place as the job's run directory once it is whole
(``CampaignStore.stage``/``commit``). On an object store (``s3://``): into a scratch directory
of its own node, published from there as the job's run prefix, whole (``ObjectRuns``). Only the
job's small record comes back, and the driver records it. A task whose node or worker dies is
retried by Ray on another node (``MAX_RETRIES``); the retry writes a new staging directory, so
nothing half-written is ever a run, and the driver records each job once, when its task ends.
A cluster that cannot be reached, or that the driver loses mid-campaign, is one
``ClusterError`` line (``ray_connection``): what finished is recorded, and the same command
resumes.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypedDict

from xsp.campaign.object_runs import ObjectRuns, new_attempt
from xsp.campaign.ray_connection import GcsWatch, connect, disconnect, first_line, lost
from xsp.campaign.records import UNSTORED, JobRecord
from xsp.campaign.spec import CampaignRecord, CampaignSpec, Job
from xsp.campaign.store import CampaignStore
from xsp.core.errors import ClusterError, StoreError

__all__ = ["MAX_RETRIES", "RAY_LOG", "JobArguments", "assigned_gpu", "run_ray", "task_options"]

#: Ray's retries of a job whose worker or node died (Ray's default too). A job's failures
#: (out of memory, an unsupported model) are records, never exceptions: Ray retries no job
#: that ran through.
MAX_RETRIES = 3
#: Where, in the campaign directory, the driver's Ray writes its own messages.
RAY_LOG = "ray-driver.log"
#: Seconds between looks at the cluster while no job ends.
_POLL_S = 2.0


class _Runs(Protocol):
    """Where a job's attempts write and commit its run: ``CampaignStore`` (a shared file
    system) or ``ObjectRuns`` (an object store)."""

    def stage(self, job: Job, attempt: str) -> Path: ...
    def attempts(self, job: Job) -> list[Any]: ...
    def commit(self, job: Job, staged: Path) -> None: ...
    def clear_staging(self, job: Job) -> None: ...


class JobArguments(TypedDict):
    """A ``Job`` as a Ray worker gets it."""

    model: str
    mode: str
    batch_size: int


def run_ray(
    spec: CampaignSpec,
    store: CampaignStore,
    jobs: list[Job],
    on_done: Callable[[JobRecord], None],
    address: str | None = None,
    runs_uri: str | None = None,
) -> None:
    """Run ``jobs`` as Ray tasks and call ``on_done`` with each one's record as it ends.
    ``address``: a running cluster (``auto``, ``host:6379``, ``ray://host:10001``), or None
    for a Ray of this machine's own. The campaign directory must be where every node finds it
    under the same name (a shared file system), unless ``runs_uri`` names the object store
    that the campaign's runs go to (``s3://...``), which every node reaches."""
    import ray

    runs: _Runs = ObjectRuns(runs_uri) if runs_uri else store
    target = runs_uri or str(store.root.resolve())
    connect(address, store.root / RAY_LOG)
    finished = 0
    cluster_lost = False
    try:
        _check_resources(spec, address)
        pending = _submit(spec, runs, target, jobs)
        gcs = GcsWatch()
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=_POLL_S)
            if not done and not gcs.answers():
                cluster_lost = True
                why = f"its GCS at {gcs.address} stopped taking connections"
                raise ClusterError(lost(address, why, finished, len(jobs)))
            for ref in done:
                job = pending.pop(ref)
                on_done(_outcome(ref, job))
                finished += 1
                runs.clear_staging(job)
    except (ConnectionError, ray.exceptions.RayError) as exc:
        cluster_lost = True
        why = f"{type(exc).__name__}: {first_line(exc)}"
        raise ClusterError(lost(address, why, finished, len(jobs))) from exc
    finally:
        disconnect(cluster_lost)


def task_options(spec: CampaignSpec) -> dict[str, Any]:
    """What a job's Ray task asks for: one whole GPU (a CUDA campaign) or none, one CPU, and
    Ray's retries of a worker or node that died (never of a job that ran through)."""
    return {
        "num_gpus": 1 if spec.device.startswith("cuda") else 0,
        "num_cpus": 1,
        "max_retries": MAX_RETRIES,
        "retry_exceptions": False,
    }


def _submit(spec: CampaignSpec, runs: _Runs, target: str, jobs: list[Job]) -> dict[Any, Job]:
    """One task a job, one GPU (or CPU) each, writing into ``target`` (a shared directory or
    an object-store URI); what a killed campaign left staged goes first."""
    import ray

    remote = ray.remote(**task_options(spec))(_remote_job)
    record = spec.to_dict()
    pending: dict[Any, Job] = {}
    for job in jobs:
        runs.clear_staging(job)
        arguments = JobArguments(model=job.model, mode=job.mode, batch_size=job.batch_size)
        pending[remote.remote(target, record, arguments)] = job
    return pending


def _remote_job(target: str, spec_record: CampaignRecord, arguments: JobArguments) -> JobRecord:
    """Runs on a Ray worker: the job into a staging directory of its own, put in place (a
    shared directory) or published (an object store) once whole; returns its record."""
    import ray

    from xsp.campaign.jobs import run_job
    from xsp.campaign.spec import from_record
    from xsp.core.store.location import is_uri

    spec = from_record(spec_record)
    job = Job(**arguments)
    runs: _Runs = ObjectRuns(target) if is_uri(target) else CampaignStore(Path(target))
    staged = runs.stage(job, new_attempt())
    try:
        attempt = len(runs.attempts(job))  # this one's and those before it that died
        record = run_job(spec, job, staged, assigned_gpu(spec))
        runs.commit(job, staged)
    except BaseException:  # an attempt that raises leaves no scratch copy (a measurement) behind
        shutil.rmtree(staged, ignore_errors=True)
        raise
    record["host"] = socket.gethostname()
    record["node"] = ray.get_runtime_context().get_node_id()
    record["attempt"] = attempt
    return record


def assigned_gpu(spec: CampaignSpec) -> int | str | None:
    """The GPU Ray gave this task, as CUDA_VISIBLE_DEVICES names it on this node (an index, or
    what the node's own CUDA_VISIBLE_DEVICES lists): the job's level-set processes get it set
    whatever the worker's environment says (RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES, a
    worker reused from another task)."""
    if not spec.device.startswith("cuda"):
        return None
    import ray

    ids = ray.get_gpu_ids()
    if len(ids) != 1:  # the task asks for exactly one whole GPU
        raise ClusterError(f"Ray gave this job {len(ids)} GPUs ({ids}), not one")
    return ids[0]


def _outcome(ref: Any, job: Job) -> JobRecord:
    """The job's record; a task that Ray gave up on is a failed record (a rerun retries it),
    and a lost cluster is raised."""
    import ray
    from ray import exceptions as rx

    try:
        return ray.get(ref)
    except rx.RayTaskError as exc:  # raised in the task: xsp's bug or a store it cannot write
        cause = exc.cause if exc.cause is not None else exc
        reason = UNSTORED if isinstance(cause, StoreError) else "failed"  # as run_local's
        error = f"{type(cause).__name__}: {first_line(cause)}"
    except (
        rx.WorkerCrashedError,
        rx.NodeDiedError,
        rx.OutOfMemoryError,
        rx.ObjectLostError,
        rx.TaskUnschedulableError,
        rx.RuntimeEnvSetupError,
        rx.OutOfDiskError,
    ) as exc:
        reason = "lost"
        error = f"Ray gave up after {MAX_RETRIES} retries: {type(exc).__name__}: {first_line(exc)}"
    return JobRecord(
        job=job.id,
        model=job.model,
        mode=job.mode,
        batch_size=job.batch_size,
        status="failed",
        reason=reason,
        error=error[-500:],
        wall_s=0.0,
    )


def _check_resources(spec: CampaignSpec, address: str | None) -> None:
    """A CUDA campaign on a cluster with no GPU would wait forever for one: refuse it."""
    import ray

    if spec.device.startswith("cuda") and not ray.cluster_resources().get("GPU"):
        raise ClusterError(
            f"the Ray cluster at {address or 'this machine'} has no GPU for a {spec.device} "
            "campaign; add GPU nodes (ray start --num-gpus N), then run the same command to "
            "resume"
        )

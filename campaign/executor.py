"""Where campaign jobs run: locally, one job per GPU at a time (``--parallel`` at a time on CPU), or
on a Ray cluster, one GPU per job. Results land in the campaign store as each job ends, so an
interrupted campaign resumes where it stopped."""

from __future__ import annotations

import io
import queue
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from campaign.jobs import run_job
from campaign.spec import CampaignSpec, Job
from campaign.store import CampaignStore

OnDone = Callable[[dict[str, Any]], None]


def gpu_count() -> int:
    """Visible NVIDIA GPUs, through NVML (no CUDA context in the campaign process)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


def run_local(
    spec: CampaignSpec,
    store: CampaignStore,
    jobs: list[Job],
    on_done: OnDone,
    parallel: int | None = None,
) -> None:
    """Run ``jobs`` in parallel slots: one per GPU on CUDA (each job sees only its GPU), or
    ``parallel`` (default 1) on CPU."""
    if spec.device.startswith("cuda"):
        gpus: list[int | None] = list(range(parallel or gpu_count() or 1))
    else:
        gpus = [None] * (parallel or 1)
    slots: queue.Queue[int | None] = queue.Queue()
    for gpu in gpus:
        slots.put(gpu)

    def one(job: Job) -> dict[str, Any]:
        gpu = slots.get()
        try:
            return run_job(spec, job, store.run_dir(job), gpu)
        finally:
            slots.put(gpu)

    with ThreadPoolExecutor(max_workers=len(gpus)) as pool:
        futures = {pool.submit(one, job) for job in jobs}
        while futures:
            done, futures = wait(futures, return_when=FIRST_COMPLETED)
            for future in done:
                on_done(future.result())


def _remote_job(
    spec_dict: dict[str, Any], job_dict: dict[str, Any]
) -> tuple[dict[str, Any], bytes]:
    """Runs on a Ray worker: the job into a scratch directory, returned as (result, tar.gz)."""
    from campaign.spec import from_record

    spec = from_record(spec_dict)
    job = Job(**job_dict)
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / job.id
        record = run_job(spec, job, out)
        buffer = io.BytesIO()
        if out.exists():
            with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
                archive.add(out, arcname=job.id)
        import socket

        record["host"] = socket.gethostname()
        return record, buffer.getvalue()


def run_ray(
    spec: CampaignSpec,
    store: CampaignStore,
    jobs: list[Job],
    on_done: OnDone,
    address: str | None = None,
) -> None:
    """Submit every job to Ray (one GPU each on CUDA, one CPU on CPU); each result and run
    directory comes back to the driver and is merged into the campaign store. ``address``:
    a running cluster (``auto``, ``ray://host:10001``), or None for a local Ray."""
    import ray

    ray.init(
        address=address, ignore_reinit_error=True, log_to_driver=False, include_dashboard=False
    )
    try:
        gpus = 1 if spec.device.startswith("cuda") else 0
        remote = ray.remote(num_gpus=gpus, num_cpus=1, max_retries=0)(_remote_job)
        spec_dict = spec.to_dict()
        pending = {
            remote.remote(spec_dict, {"model": j.model, "mode": j.mode, "batch_size": j.batch_size})
            for j in jobs
        }
        while pending:
            done, rest = ray.wait(list(pending), num_returns=1)
            pending = set(rest)
            for ref in done:
                record, archive = ray.get(ref)
                shutil.rmtree(store.runs_dir / record["job"], ignore_errors=True)  # a retry
                if archive:
                    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
                        tar.extractall(store.runs_dir, filter="data")
                on_done(record)
    finally:
        ray.shutdown()

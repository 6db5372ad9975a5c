"""Where campaign jobs run locally: one job per GPU at a time (``--parallel`` at a time on CPU);
``ray_executor`` runs them on a Ray cluster. Results land in the campaign store as each job
ends, so an interrupted campaign resumes where it stopped."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xsp.campaign.jobs import run_job, switched_on
from xsp.campaign.records import JobRecord
from xsp.campaign.spec import CampaignSpec, Job
from xsp.campaign.store import CampaignStore

__all__ = ["OnDone", "gpu_count", "run_local"]

OnDone = Callable[[JobRecord], None]


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
    """Run ``jobs`` in parallel lanes: one per GPU on CUDA (each job sees only its GPU), or
    ``parallel`` (default 1) on CPU. Within a lane, a job starts once the job before has
    measured its last level set, and measures once that job has ended (``XSP_OVERLAP=0``: a
    job starts once the one before has ended)."""
    if spec.device.startswith("cuda"):
        lanes: list[int | None] = list(range(parallel or gpu_count() or 1))
    else:
        lanes = [None] * (parallel or 1)
    overlap = switched_on("XSP_OVERLAP")
    pending: queue.SimpleQueue[Job] = queue.SimpleQueue()
    for job in jobs:
        pending.put(job)
    results: queue.SimpleQueue[JobRecord | BaseException] = queue.SimpleQueue()

    from xsp.tracer.run.interrupt import INTERRUPT, INTERRUPT_GRACE_S

    INTERRUPT.clear()
    chains: list[_Chain] = []

    def lane(gpu: int | None) -> None:
        previous: threading.Event | None = None
        while not INTERRUPT.is_set():
            try:
                job = pending.get_nowait()
            except queue.Empty:
                return
            chain = _Chain(previous.wait if previous is not None and overlap else None)
            chains.append(chain)
            threading.Thread(
                target=chain.run,
                args=(spec, job, store.run_dir(job), gpu, results),
                name=f"xsp-job-{job.id}",
                daemon=True,
            ).start()
            (chain.measured if overlap else chain.ended).wait()
            previous = chain.ended

    for gpu in lanes:
        threading.Thread(target=lane, args=(gpu,), name=f"xsp-lane-{gpu}", daemon=True).start()
    try:
        for _ in jobs:
            result = results.get()
            if isinstance(result, BaseException):
                raise result
            on_done(result)
    except KeyboardInterrupt:  # Ctrl-C: the running jobs put their measurements away
        INTERRUPT.set()
        deadline = time.monotonic() + INTERRUPT_GRACE_S + 10
        for chain in list(chains):
            chain.ended.wait(max(0.0, deadline - time.monotonic()))
        while not results.empty():
            result = results.get()
            if not isinstance(result, BaseException):
                on_done(result)  # an interrupted job's record: a rerun runs it again
        raise


class _Chain:
    """One job in a lane: it measures after ``after`` returns (the job before has ended) and
    tells the lane when it has measured (the job after may start) and when it has ended."""

    def __init__(self, after: Callable[[], Any] | None) -> None:
        self.after = after
        self.measured = threading.Event()
        self.ended = threading.Event()

    def run(
        self,
        spec: CampaignSpec,
        job: Job,
        out: Path,
        gpu: int | None,
        results: queue.SimpleQueue[JobRecord | BaseException],
    ) -> None:
        try:
            results.put(run_job(spec, job, out, gpu, self.after, self.measured.set))
        except BaseException as exc:  # a bug, not a job failure: the campaign stops
            results.put(exc)
        finally:
            self.ended.set()
            self.measured.set()

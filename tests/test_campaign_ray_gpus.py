"""A CUDA campaign's Ray tasks each hold one GPU of their own, and xsp pins the job to it whether
or not Ray sets ``CUDA_VISIBLE_DEVICES`` (``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1``, one
of Ray's GPU-isolation caveats, docs/campaigns.md). A real Ray on this machine with two logical
GPUs: Ray assigns them by its own bookkeeping and no CUDA is touched, so the tasks, which ask for
what a campaign's tasks ask (``ray_executor.task_options``), run here without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]
#: Seconds a task waits for another to hold a GPU at the same time (workers start staggered on
#: a loaded machine): past it, it returns alone, and the overlap check below fails.
MEET_S = 60.0

#: Four jobs' tasks at once on two GPUs, in a process of their own (Ray's state stays there).
#: Each task leaves a marker in a shared directory and returns only once two markers are there,
#: so the first two tasks provably hold their GPUs at the same time.
SCRIPT = f"""
import json, os, sys, time, uuid
from pathlib import Path
import ray
from xsp.campaign.ray_executor import assigned_gpu, task_options
from xsp.campaign.spec import CampaignSpec

spec = CampaignSpec("gpus", ["torchvision:resnet18"], [1], device="cuda")
ray.init(num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False,
         runtime_env={{"env_vars": json.loads(sys.argv[1])}})

def job(spec, meeting):
    began = time.monotonic()
    gpu = assigned_gpu(spec)
    (Path(meeting) / uuid.uuid4().hex).touch()
    while len(os.listdir(meeting)) < 2 and time.monotonic() < began + {MEET_S}:
        time.sleep(0.05)
    return {{"gpu": gpu, "ray_set": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "began": began, "ended": time.monotonic()}}

task = ray.remote(**task_options(spec))(job)
print(json.dumps(ray.get([task.remote(spec, sys.argv[2]) for _ in range(4)])))
ray.shutdown()
"""


def _tasks(env_vars: dict[str, str], meeting: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(env_vars), str(meeting)],
        env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_one_gpu_each_at_a_time(tasks: list[dict[str, Any]]) -> None:
    """Each task holds one GPU id of the two, and tasks that ran at the same time (the first
    two did: each waited for the other's marker) hold different ones: never two jobs
    measuring on one GPU."""
    assert {str(t["gpu"]) for t in tasks} <= {"0", "1"}
    together = 0
    for i, a in enumerate(tasks):
        for b in tasks[i + 1 :]:
            if a["began"] < b["ended"] and b["began"] < a["ended"]:
                together += 1
                assert a["gpu"] != b["gpu"], tasks
    assert together >= 1


def test_each_job_task_holds_one_gpu_and_the_job_is_pinned_to_it(tmp_path: Path) -> None:
    tasks = _tasks({}, tmp_path)
    _assert_one_gpu_each_at_a_time(tasks)
    # Ray set the task's own variable to its GPU: what the job's level sets get (jobs.run_job)
    assert all(t["ray_set"] == str(t["gpu"]) for t in tasks)


def test_where_ray_does_not_set_cuda_visible_devices_xsp_still_pins_the_job(
    tmp_path: Path,
) -> None:
    tasks = _tasks({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}, tmp_path)
    # the caveat is real: the task itself would see every GPU of its node
    assert all(t["ray_set"] is None for t in tasks)
    # the assignment is still one GPU a task, which xsp gives the job's processes itself
    _assert_one_gpu_each_at_a_time(tasks)

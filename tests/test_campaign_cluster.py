"""Campaigns on a real multi-node Ray cluster on this machine (``tests/ray_cluster.py``): a node
killed mid-campaign costs no job and duplicates none, on a shared directory and into an object
store (a real SeaweedFS, ``tests/object_store.py``), and Ray's failures are one line with exit
status 75 after which the same command resumes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures import free_ports
from tests.object_store import SeaweedS3, seaweed
from xsp.core.store import location

pytest.importorskip("ray")

from tests.ray_cluster import ROOT, RayCluster
from xsp.core.errors import EXIT_CLUSTER

__all__ = ["seaweed"]  # the fixture, used by name

MODELS = ["torchvision:squeezenet1_1", "torchvision:shufflenet_v2_x0_5"]
JOBS = sorted(f"torchvision-{m.split(':')[1]}__infer__b{b}" for m in MODELS for b in (1, 2))


def _campaign_file(path: Path) -> Path:
    names = ", ".join(f'"{m}"' for m in MODELS)
    path.write_text(
        f"""[campaign]
name = "cluster"
device = "cpu"
batch_sizes = [1, 2]
level_sets = ["M"]
iterations = 2
warmup = 0
[models]
names = [{names}]
"""
    )
    return path


def _run(
    campaign: Path, out: Path | str, address: str, env: dict[str, str]
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "xsp", "campaign", "run", str(campaign), "--out", str(out)),
            *("--executor", "ray", "--address", address),
        ],
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(what: str, found: Callable[[], object], timeout_s: float = 150.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not found():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _attempt_pids(out: Path) -> dict[int, str]:
    """The pid of each attempt's Ray worker, from its staging directory's name (host-pid-random),
    with the job it runs."""
    found = {}
    for path in (out / "staging").glob("*/*"):
        if path.is_dir() and not path.name.endswith(".replaced"):
            found[int(path.name.rsplit("-", 2)[1])] = path.parent.name
    return found


def _records(out: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    return {p.stem: json.loads(p.read_text()) for p in sorted((out / "jobs").glob("*.json"))}


def _assert_each_job_once_ok(out: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    """Every job recorded once, ok, with one whole run directory and nothing left staged."""
    records = _records(out)
    assert sorted(records) == JOBS
    assert {r["status"] for r in records.values()} == {"ok"}, records
    assert sorted(p.name for p in (out / "runs").iterdir()) == JOBS  # none lost, none extra
    for job in JOBS:
        manifest = json.loads((out / "runs" / job / "manifest.json").read_text())
        assert [run["status"] for run in manifest["runs"]] == ["ok"]
        assert len(list((out / "runs" / job / "M").glob("spans-*.parquet"))) >= 1
    assert not list((out / "staging").glob("*/*"))  # every attempt's leftovers dropped
    return records


def test_a_worker_node_killed_mid_campaign_costs_no_job_and_duplicates_none(
    tmp_path: Path,
) -> None:
    cluster = RayCluster()
    try:
        cluster.start_head()
        worker = cluster.add_worker("worker")
        out = tmp_path / "C"
        driver = _run(_campaign_file(tmp_path / "c.toml"), out, cluster.address, cluster.env)
        # the moment the worker node starts a job, it dies, as a machine would: mid-job
        on_worker: list[str] = []

        def worker_started_a_job() -> bool:
            pids = worker.pids()
            on_worker.extend(job for pid, job in _attempt_pids(out).items() if pid in pids)
            return bool(on_worker)

        _wait_for("a job on the worker node", worker_started_a_job)
        worker.kill()
        _, stderr = driver.communicate(timeout=240)
        assert driver.returncode == 0, stderr[-3000:]
        assert "4 jobs ok, 0 failed" in stderr, stderr[-3000:]
        records = _assert_each_job_once_ok(out)
        print({job: (r["node"][:8], r["attempt"]) for job, r in records.items()})  # pytest -s
        killed = on_worker[0]
        # Ray ran the killed job again, on the head, the one node left
        assert records[killed]["attempt"] == 2
        assert [job for job, r in records.items() if r["attempt"] != 1] == [killed]
        assert len({r["node"] for r in records.values()}) == 1
    finally:
        cluster.stop()


def test_a_lost_cluster_is_one_line_and_the_same_command_resumes(tmp_path: Path) -> None:
    campaign = _campaign_file(tmp_path / "c.toml")
    out = tmp_path / "C"
    cluster = RayCluster()
    (nobody,) = free_ports(1)
    nothing = _run(campaign, out, f"127.0.0.1:{nobody}", cluster.env)
    _, stderr = nothing.communicate(timeout=120)
    assert nothing.returncode == EXIT_CLUSTER == 75
    assert stderr.strip().splitlines() == [
        f"xsp: error: no Ray cluster at 127.0.0.1:{nobody} (connection refused); start one "
        "(ray start --head) or give its address with --address, then run the same command "
        "to resume"
    ]
    try:
        head = cluster.start_head()
        # a driver without the cluster's token (Ray's 20 connection retries cut to 2)
        strangers = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH")}
        refused = _run(
            campaign, out, cluster.address, {**strangers, "RAY_NUM_REDIS_GET_RETRIES": "2"}
        )
        _, stderr = refused.communicate(timeout=120)
        assert refused.returncode == EXIT_CLUSTER
        assert stderr.strip().splitlines() == [
            f"xsp: error: the Ray cluster at {cluster.address} refused the connection: it uses "
            "token authentication; set RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN, or "
            "~/.ray/auth_token) as on its nodes, then run the same command to resume"
        ]
        # the head stops once the first job is recorded
        driver = _run(campaign, out, cluster.address, cluster.env)
        _wait_for("the first job's record", lambda: list((out / "jobs").glob("*.json")))
        head.kill()
        _, stderr = driver.communicate(timeout=120)
        assert driver.returncode == EXIT_CLUSTER, stderr[-3000:]
        lines = [line for line in stderr.splitlines() if "xsp: error" in line]
        assert len(lines) == 1 and lines[0].startswith(
            f"xsp: error: lost the Ray cluster at {cluster.address} after "
        ), stderr[-3000:]
        assert lines[0].endswith("the finished jobs are recorded: run the same command to resume")
        assert "Traceback" not in stderr
        print(lines[0])  # the figure the docs quote (pytest -s)
        recorded = len(_records(out))
        assert 1 <= recorded < len(JOBS)
        # the head is back at the same address: the same command runs the rest
        cluster.nodes.remove(head)
        cluster.start_head()
        again = _run(campaign, out, cluster.address, cluster.env)
        _, stderr = again.communicate(timeout=240)
        assert again.returncode == 0, stderr[-3000:]
        assert f"4 jobs, {recorded} done, running {4 - recorded}" in stderr
        _assert_each_job_once_ok(out)
    finally:
        cluster.stop()


def test_a_ray_campaign_into_s3_publishes_each_run_from_its_own_node_once(
    seaweed: SeaweedS3, tmp_path: Path
) -> None:
    """Each node (and the driver) with a temporary directory of its own: a job's run is written
    on the node that runs it and published from there; the worker node killed mid-job leaves
    nothing a reader takes as a run, and its job's retry lands once."""
    temps = {name: tmp_path / f"tmp-{name}" for name in ("driver", "head", "worker")}
    for path in temps.values():
        path.mkdir()
    uri = seaweed.uri("ray")
    store = location.object_store(uri, seaweed.env)
    cluster = RayCluster(seaweed.env)
    try:
        cluster.start_head({"TMPDIR": str(temps["head"])})
        worker = cluster.add_worker("worker", {"TMPDIR": str(temps["worker"])})
        campaign = _campaign_file(tmp_path / "c.toml")
        driver = _run(
            campaign, uri, cluster.address, {**cluster.env, "TMPDIR": str(temps["driver"])}
        )
        on_worker: list[str] = []
        staged_by_driver: list[Path] = []

        def worker_started_a_job() -> bool:
            staged_by_driver.extend(temps["driver"].glob("xsp-s3-*/store/runs/*"))
            pids = worker.pids()
            marks = [name.split("/") for name in store.listing("staging")]
            on_worker.extend(job for _, job, mark in marks if int(mark.split("-")[-2]) in pids)
            return bool(on_worker)

        _wait_for("a job on the worker node", worker_started_a_job)
        worker.kill()
        killed = on_worker[0]
        # the killed attempt wrote into the worker's own temporary directory
        assert list(temps["worker"].glob(f"xsp-job-{killed}-*"))
        _, stderr = driver.communicate(timeout=300)
        assert driver.returncode == 0, stderr[-3000:]
        assert "4 jobs ok, 0 failed" in stderr, stderr[-3000:]
        assert not staged_by_driver  # the driver never held a run
        objects = store.listing()
        assert not [name for name in objects if name.startswith("staging/")]
        assert {name.split("/")[1] for name in objects if name.startswith("runs/")} == set(JOBS)
        records = {
            job: json.loads(store.get(f"jobs/{job}.json")) for job in JOBS
        }  # each recorded once, in the store
        assert {r["status"] for r in records.values()} == {"ok"}
        assert records[killed]["attempt"] == 2
        assert [job for job, r in records.items() if r["attempt"] != 1] == [killed]
        assert len({r["node"] for r in records.values()}) == 1  # the head, the one node left
        for job in JOBS:  # one run a job: its index, one level set, its parts
            manifest = json.loads(store.get(f"runs/{job}/manifest.json"))
            assert [run["status"] for run in manifest["runs"]] == ["ok"]
            assert f"runs/{job}/M/run.json" in objects
        # the runs read from the store: 2 steps a job (2 iterations), none counted twice
        done = subprocess.run(
            [sys.executable, "-m", "xsp", "campaign", "sql", uri,
             "SELECT job, count(*) FILTER (kind = 'step') AS steps FROM spans GROUP BY 1 "
             "ORDER BY 1", "--csv"],
            env={**cluster.env, "PYTHONPATH": str(ROOT)}, text=True, capture_output=True,
            timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["job,steps", *(f"{job},2" for job in JOBS)]
        assert not list(temps["head"].glob("xsp-job-*"))  # each published copy dropped
    finally:
        cluster.stop()

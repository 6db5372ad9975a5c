"""Stores on S3-compatible object storage, against a real S3 server (SeaweedFS's gateway,
``tests.object_store``): a measurement copied to ``s3://`` reads exactly as on local disk
through every reading command, a campaign runs into ``s3://`` and answers SQL there, and an
object is absent or whole, never half, when its writer is killed mid-upload."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.object_store import SeaweedS3, seaweed
from xsp.campaign.files import load
from xsp.campaign.object_runs import ObjectRuns
from xsp.campaign.spec import CampaignSpec, Job
from xsp.core.errors import ClusterError, StoreError
from xsp.core.store import location

ROOT = Path(__file__).resolve().parents[1]
MEASUREMENT = ROOT / "benchmarks/data/r50-b64-train"
CHANNELS_LAST = ROOT / "benchmarks/data/r50-b64-train-cl"

__all__ = ["seaweed"]  # the fixture, used by name


def _xsp(
    server: SeaweedS3, *args: str, check: bool = True, aws: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``xsp args`` against ``server``, as its main identity or the one whose AWS variables
    ``aws`` holds."""
    env = {**os.environ, **(aws or server.env), "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    done = subprocess.run(
        [sys.executable, "-m", "xsp", *args], env=env, text=True, capture_output=True, timeout=600
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


def _unpadded(text: str) -> list[str]:
    """``text``'s lines without the padding a table title gets to the table's width (a path
    and a URI differ in length)."""
    return [line.rstrip() for line in text.splitlines()]


def _copy_up(server: SeaweedS3, local: Path) -> str:
    """``local``'s store copied to a fresh prefix, the way xsp writes one (``staged_write``)."""
    uri = server.uri(local.name)
    store = location.object_store(uri, server.env)
    assert store.upload(local) == len([p for p in local.rglob("*") if p.is_file()])
    return uri


def test_every_reading_command_gives_the_same_output_from_s3_as_from_disk(
    seaweed: SeaweedS3, tmp_path: Path
) -> None:
    uri = _copy_up(seaweed, MEASUREMENT)
    other = _copy_up(seaweed, CHANNELS_LAST)
    listed = location.object_store(uri, seaweed.env).listing()
    assert listed == {
        p.relative_to(MEASUREMENT).as_posix(): p.stat().st_size
        for p in MEASUREMENT.rglob("*")
        if p.is_file()
    }
    for args in (
        ("summary", "{m}"),
        ("analyze", "{m}", "--rows", "5"),
        ("analyze", "{m}", "--json"),
        ("export", "{m}"),
        ("diff", "{m}", "{o}"),
    ):
        local = _xsp(seaweed, *(a.format(m=MEASUREMENT, o=CHANNELS_LAST) for a in args))
        remote = _xsp(seaweed, *(a.format(m=uri, o=other) for a in args))
        # the longer path first: the measurement's is a prefix of the other's
        expected = local.stdout.replace(str(CHANNELS_LAST), other).replace(str(MEASUREMENT), uri)
        assert _unpadded(remote.stdout) == _unpadded(expected), args
        assert remote.stderr == local.stderr.replace(str(MEASUREMENT), uri), args
        assert len(local.stdout) > 200, args  # each printed its tables or traces
    for name, target in (("local", MEASUREMENT), ("remote", uri)):  # a file, written locally
        _xsp(
            seaweed,
            "export",
            str(target),
            "--format",
            "chrome",
            "-o",
            str(tmp_path / f"{name}.json"),
        )
    assert (tmp_path / "remote.json").read_bytes() == (tmp_path / "local.json").read_bytes()
    # analyze wrote nothing into the store, so nothing went up
    assert location.object_store(uri, seaweed.env).listing() == listed


def test_a_missing_store_and_a_bad_uri_are_one_line_each(seaweed: SeaweedS3) -> None:
    missing = seaweed.uri("missing")
    done = _xsp(seaweed, "summary", missing, check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == f"xsp: error: {missing}: no such run directory"
    with pytest.raises(StoreError, match="expected s3://bucket/prefix"):
        location.object_store("s3://", seaweed.env)


def test_a_campaign_runs_into_s3_and_answers_sql_there(seaweed: SeaweedS3, tmp_path: Path) -> None:
    campaign_file = tmp_path / "c.toml"
    campaign_file.write_text(
        '[campaign]\nname = "s3"\ndevice = "cpu"\nbatch_sizes = [1]\nlevel_sets = ["M", "MF"]\n'
        'iterations = 2\nwarmup = 0\n[models]\nnames = ["torchvision:squeezenet1_1"]\n'
    )
    uri = seaweed.uri("campaign")
    _xsp(seaweed, "campaign", "run", str(campaign_file), "--out", uri)
    objects = location.object_store(uri, seaweed.env).listing()
    (job,) = [j.id for j in load(campaign_file).jobs()]
    assert {"campaign.json", f"jobs/{job}.json", f"runs/{job}/manifest.json"} <= set(objects)
    assert {f"runs/{job}/{levels}/spans-00000.parquet" for levels in ("M", "MF")} <= set(objects)
    assert not [name for name in objects if name.endswith(".tmp")]
    query = (
        "SELECT levels, count(*) FILTER (kind = 'step') AS steps FROM spans GROUP BY 1 ORDER BY 1"
    )
    done = _xsp(seaweed, "campaign", "sql", uri, query, "--csv")
    assert done.stdout.splitlines() == ["levels,steps", "M,2", "MF,2"]
    jobs = _xsp(seaweed, "campaign", "sql", uri, "SELECT job, status FROM jobs", "--csv")
    assert jobs.stdout.splitlines() == ["job,status", f"{job},ok"]
    # a rerun resumes from what the store holds: the job is done, nothing runs again
    again = _xsp(seaweed, "campaign", "run", str(campaign_file), "--out", uri)
    assert "1 jobs, 1 done, running 0" in again.stderr
    assert location.object_store(uri, seaweed.env).listing() == objects
    # the report is written beside the campaign, and each job's under reports/: nothing goes
    # into a run's prefix, which only its job's publish writes (the commit rule)
    _xsp(seaweed, "campaign", "report", uri)
    store = location.object_store(uri, seaweed.env)
    reports = {"report.html", f"reports/{job}.html", "reports/runs.json"}
    assert set(store.listing()) == {*objects, *reports}
    record = json.loads(store.get(f"jobs/{job}.json"))
    assert json.loads(store.get("reports/runs.json")) == {job: record["started"]}
    assert f"href='reports/{job}.html'" in store.get("report.html").decode()
    # the job run again (its record says when): its report is made again, from the new run
    store.put(f"jobs/{job}.json", json.dumps({**record, "started": 1.5}).encode())
    _xsp(seaweed, "campaign", "report", uri)
    assert json.loads(store.get("reports/runs.json")) == {job: 1.5}
    assert set(store.listing()) == {*objects, *reports}


def test_a_run_the_store_refuses_is_the_jobs_failure_not_the_campaigns_and_a_rerun_redoes_it(
    seaweed: SeaweedS3, tmp_path: Path
) -> None:
    campaign_file = tmp_path / "c.toml"
    campaign_file.write_text(
        '[campaign]\nname = "refused"\ndevice = "cpu"\nbatch_sizes = [1, 2]\nlevel_sets = ["M"]\n'
        'iterations = 2\nwarmup = 0\n[models]\nnames = ["torchvision:squeezenet1_1"]\n'
    )
    jobs = [j.id for j in load(campaign_file).jobs()]
    uri = seaweed.uri("refused")
    refused = seaweed.records_only_env  # the same server, as the identity that stores no run
    done = _xsp(
        seaweed, "campaign", "run", str(campaign_file), "--out", uri, check=False, aws=refused
    )
    assert done.returncode == 1, done.stderr  # "jobs failed", not a store error that ended it
    assert "2 of 2 jobs failed" in done.stderr
    store = location.object_store(uri, seaweed.env)
    assert not store.listing("runs")  # no run, not even half of one
    for job in jobs:  # each job recorded, in the store, as the store's refusal
        record = json.loads(store.get(f"jobs/{job}.json"))
        assert (record["status"], record["reason"]) == ("failed", "unstored")
        assert record["error"].startswith("StoreError: cannot "), record["error"]
        assert f"{uri}/runs/{job}/" in record["error"]
        assert "summary" not in record
    # with a store that takes runs, the same command redoes both and publishes each
    again = _xsp(seaweed, "campaign", "run", str(campaign_file), "--out", uri)
    assert "2 jobs, 0 done, running 2" in again.stderr
    assert {f"runs/{job}/manifest.json" for job in jobs} <= set(store.listing())


def test_a_rewrite_replaces_the_stored_files_and_removes_the_deleted_ones(
    seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = seaweed.uri("rewrite")
    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)  # staged_write reads os.environ, as xsp does
    with location.staged_write(uri) as local:
        (local / "M").mkdir(parents=True)
        (local / "M" / "spans-00000.parquet").write_bytes(b"first")
        (local / "M" / "spans-00001.parquet").write_bytes(b"second")
        (local / "M" / "run.json.tmp").write_bytes(b"{")  # a temporary name: never an object
    store = location.object_store(uri, seaweed.env)
    assert store.listing() == {"M/spans-00000.parquet": 5, "M/spans-00001.parquet": 6}
    with location.staged_write(uri) as local:  # a re-run level set: its parts replaced
        assert (local / "M" / "spans-00001.parquet").read_bytes() == b"second"
        (local / "M" / "spans-00001.parquet").unlink()
        (local / "M" / "spans-00000.parquet").write_bytes(b"replaced")
    assert store.listing() == {"M/spans-00000.parquet": 8}
    assert store.get("M/spans-00000.parquet") == b"replaced"


def test_the_endpoint_and_region_come_from_the_aws_variables() -> None:
    options = location._s3_options
    assert options({}) == {}
    assert options({"AWS_ENDPOINT_URL": "http://127.0.0.1:8333/", "AWS_REGION": "eu-west-1"}) == {
        "endpoint_override": "127.0.0.1:8333",
        "scheme": "http",
        "region": "eu-west-1",
    }
    both = {"AWS_ENDPOINT_URL": "http://a:1", "AWS_ENDPOINT_URL_S3": "https://s3.b:2"}
    assert options(both) == {"endpoint_override": "s3.b:2", "scheme": "https"}
    assert options({"AWS_DEFAULT_REGION": "us-west-2"}) == {"region": "us-west-2"}
    keys = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_SESSION_TOKEN": "t"}
    assert options(keys) == {"access_key": "id", "secret_key": "secret", "session_token": "t"}
    assert options({"AWS_ACCESS_KEY_ID": "id"}) == {}  # half a pair: the SDK's chain decides


def test_xsp_run_stores_its_measurement_in_s3(seaweed: SeaweedS3) -> None:
    uri = seaweed.uri("run")
    model = ("--model", "torchvision:squeezenet1_1", "--batch-size", "1", "--device", "cpu")
    run = _xsp(seaweed, "run", *model, "--levels", "M,MF", "--iterations", "2", "--warmup", "0",
               "--out", uri)  # fmt: skip
    assert f"spans stored in {uri}" in run.stderr  # named by its URI, not the scratch copy
    objects = location.object_store(uri, seaweed.env).listing()
    for levels in ("M", "MF"):
        assert {f"{levels}/run.json", f"{levels}/spans-00000.parquet"} <= set(objects)
    manifest = json.loads(location.object_store(uri, seaweed.env).get("manifest.json"))
    assert [r["status"] for r in manifest["runs"]] == ["ok", "ok"]
    summary = _xsp(seaweed, "summary", uri)
    assert summary.stdout.startswith(f"xsp measurement {uri}")
    rows = [line.split("│")[1].strip() for line in summary.stdout.splitlines() if "│ ok" in line]
    assert rows == ["M", "MF"]


_WRITER = """
import sys
from pathlib import Path
from xsp.core.store import location
store = location.object_store(sys.argv[1])
print("uploading", flush=True)
store.upload(Path(sys.argv[2]))
print("done", flush=True)
"""


def test_a_writer_killed_mid_upload_leaves_each_object_whole_or_absent(
    seaweed: SeaweedS3, tmp_path: Path
) -> None:
    local = tmp_path / "parts"
    local.mkdir()
    digests = {}
    for index in range(40):  # 40 parts of 6 MB each: each a multipart upload of its own
        data = os.urandom(6 << 20)
        (local / f"spans-{index:05d}.parquet").write_bytes(data)
        digests[f"spans-{index:05d}.parquet"] = hashlib.sha256(data).hexdigest()
    uri = seaweed.uri("killed")
    store = location.object_store(uri, seaweed.env)
    writer = _killable(seaweed, _WRITER, uri, str(local))
    assert writer.stdout is not None and writer.stdout.readline() == "uploading\n"
    deadline = time.time() + 120
    while time.time() < deadline and not store.listing():
        time.sleep(0.01)
    os.killpg(writer.pid, signal.SIGKILL)
    writer.wait()
    listed = store.listing()
    assert 0 < len(listed) < len(digests)  # killed midway: some parts up, not all
    for name in listed:  # each object there is its file whole
        assert hashlib.sha256(store.get(name)).hexdigest() == digests[name], name
    assert set(listed) <= set(digests)  # nothing else: no piece of an unfinished upload


_PUBLISHER = """
import sys
from pathlib import Path
from xsp.core.store import location
store = location.object_store(sys.argv[1])
print("publishing", flush=True)
store.publish(Path(sys.argv[2]), "runs/j")
print("done", flush=True)
"""


def _killable(seaweed: SeaweedS3, script: str, *args: str) -> subprocess.Popen[str]:
    """``python -c script args`` against the store, in a session of its own (killed whole)."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env={**os.environ, **seaweed.env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _run_dir(path: Path, parts: dict[str, bytes]) -> dict[str, bytes]:
    """A run directory of ``parts`` (relative path: bytes) at ``path``; what it holds."""
    for relative, data in parts.items():
        (path / relative).parent.mkdir(parents=True, exist_ok=True)
        (path / relative).write_bytes(data)
    return parts


def _settled(store: location.ObjectStore, under: str, quiet_s: float = 3.0) -> dict[str, int]:
    """The listing under ``under`` once it has not changed for ``quiet_s``: a PUT whose body
    a killed writer had sent whole still completes at the server, up to seconds later on a
    loaded machine (a Ray retry comes only once the node has missed its health checks)."""
    listed, since, deadline = store.listing(under), time.time(), time.time() + 120
    while time.time() - since < quiet_s and time.time() < deadline:
        time.sleep(0.2)
        if (now := store.listing(under)) != listed:
            listed, since = now, time.time()
    return listed


def _read_committed(store: location.ObjectStore, local: Path) -> dict[str, bytes]:
    """What a campaign's reader copies of ``runs/j`` (``committed``: ``runs/*``)."""
    store.download(local, committed=("runs/*",))
    found = local / "runs" / "j"
    return {
        p.relative_to(found).as_posix(): p.read_bytes() for p in found.rglob("*") if p.is_file()
    }


def test_a_run_replaced_on_s3_is_absent_until_whole_and_keeps_no_stale_object(
    seaweed: SeaweedS3, tmp_path: Path
) -> None:
    uri = seaweed.uri("publish")
    store = location.object_store(uri, seaweed.env)
    first = _run_dir(
        tmp_path / "first",
        {
            "manifest.json": b'{"attempt": 1}',
            "M/run.json": b'{"attempt": 1}',
            **{f"M/spans-{i:05d}.parquet": b"first %d" % i for i in range(3)},
            "M/monitor.parquet": b"first monitor",
        },
    )
    assert store.publish(tmp_path / "first", "runs/j") == 6
    assert _read_committed(store, tmp_path / "read-1") == first
    # a second attempt of 40 parts of 6 MB, killed midway through its upload
    big = {f"M/spans-{i:05d}.parquet": os.urandom(6 << 20) for i in range(40)}
    _run_dir(tmp_path / "killed", {"manifest.json": b'{"attempt": 2}', **big})
    writer = _killable(seaweed, _PUBLISHER, uri, str(tmp_path / "killed"))
    assert writer.stdout is not None and writer.stdout.readline() == "publishing\n"
    deadline = time.time() + 120
    while time.time() < deadline and (6 << 20) not in store.listing("runs/j").values():
        time.sleep(0.01)
    os.killpg(writer.pid, signal.SIGKILL)
    writer.wait()
    left = _settled(store, "runs/j")
    assert "runs/j/manifest.json" not in left  # deleted first, and never written again
    assert "runs/j/M/monitor.parquet" not in left  # the first attempt's: not the second's
    assert 0 < sum(size == 6 << 20 for size in left.values()) < 40  # some parts up, not all
    assert _read_committed(store, tmp_path / "read-2") == {}  # no index: no run
    # a third attempt runs through: exactly its objects, the others' gone
    third = _run_dir(
        tmp_path / "third",
        {"manifest.json": b'{"attempt": 3}', "M/run.json": b"{}", "M/spans-00000.parquet": b"3"},
    )
    assert store.publish(tmp_path / "third", "runs/j") == 3
    assert store.listing("runs/j") == {f"runs/j/{r}": len(d) for r, d in third.items()}
    assert _read_committed(store, tmp_path / "read-3") == third
    # an attempt that wrote no index (its runner died first) publishes a run no reader takes
    _run_dir(tmp_path / "no-index", {"M/run.json": b"{}", "M/spans-00000.parquet": b"4"})
    store.publish(tmp_path / "no-index", "runs/j")
    assert _read_committed(store, tmp_path / "read-4") == {}


class _PublishingAfterListing(location.ObjectStore):
    """A reader's store (the real one) during whose first listing a whole publish of
    ``attempt`` ends: the moment between a reader's listing and its copy."""

    attempt: Path | None = None

    def listing(self, under: str = "") -> dict[str, int]:
        listed = super().listing(under)
        if self.attempt is not None:
            attempt, self.attempt = self.attempt, None
            writer = location.ObjectStore(uri=self.uri, fs=self.fs, base=self.base)
            writer.publish(attempt, "runs/j")
        return listed


def test_a_run_republished_between_a_readers_listing_and_its_copy_is_read_whole(
    seaweed: SeaweedS3, tmp_path: Path
) -> None:
    uri = seaweed.uri("relisted")
    store = location.object_store(uri, seaweed.env)
    one = {"manifest.json": b'{"attempt": "A"}', "M/spans-00000.parquet": b"a0"}
    _run_dir(tmp_path / "A", one)
    store.publish(tmp_path / "A", "runs/j")
    two = _run_dir(
        tmp_path / "B",
        {
            "manifest.json": b'{"attempt": "B"}',
            "M/spans-00000.parquet": b"b0",
            "M/spans-00001.parquet": b"b1",  # a part attempt A never had
        },
    )
    reader = _PublishingAfterListing(uri=store.uri, fs=store.fs, base=store.base)
    reader.attempt = tmp_path / "B"
    # B's index, both its parts: never B's index over A's list of names (one part missing)
    assert _read_committed(reader, tmp_path / "read") == two
    assert reader.attempt is None  # the publish did happen inside the read


def _on_seaweed(seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch, scratch: Path) -> None:
    """This process as a Ray worker on a node whose temporary directory is ``scratch``, with
    the AWS settings that reach ``seaweed``."""
    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)  # ObjectRuns opens its store from os.environ
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))


def test_a_ray_job_that_raises_after_staging_leaves_no_scratch_run_on_its_node(
    seaweed: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xsp.campaign import ray_executor

    _on_seaweed(seaweed, monkeypatch, tmp_path)
    spec = CampaignSpec("leak", ["torchvision:resnet18"], [1], device="cuda")
    # run outside a Ray task, the job gets no GPU from Ray: it raises after stage()
    with pytest.raises(ClusterError, match="Ray gave this job 0 GPUs"):
        ray_executor._remote_job(
            seaweed.uri("leak"),
            spec.to_dict(),
            ray_executor.JobArguments(model=spec.models[0], mode="infer", batch_size=1),
        )
    assert [p.name for p in tmp_path.iterdir()] == []


def test_staging_a_job_sweeps_the_scratch_runs_its_dead_attempts_left_on_this_host(
    seaweed: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _on_seaweed(seaweed, monkeypatch, tmp_path)
    (job,) = CampaignSpec("sweep", ["torchvision:resnet18"], [1], device="cpu").jobs()
    other = Job(model="torchvision:resnet18", mode="infer", batch_size=16)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead_pid, host = int(dead.stdout), socket.gethostname()
    left = {
        "dead": tmp_path / f"xsp-job-{job.id}-{host}-{dead_pid}-0a1b2c-x1",
        "live": tmp_path / f"xsp-job-{job.id}-{host}-{os.getpid()}-0a1b2c-x2",
        "other job": tmp_path / f"xsp-job-{other.id}-{host}-{dead_pid}-0a1b2c-x3",
        "other host": tmp_path / f"xsp-job-{job.id}-elsewhere-{dead_pid}-0a1b2c-x4",
    }
    for path in left.values():
        (path / "M").mkdir(parents=True)
        (path / "M" / "spans-00000.parquet").write_bytes(b"a measurement")
    runs = ObjectRuns(seaweed.uri("sweep"))
    staged = runs.stage(job, f"{host}-{os.getpid()}-abc123")
    kept = {name for name, path in left.items() if path.exists()}
    assert kept == {"live", "other job", "other host"}  # only the dead attempt of this job
    assert staged.parent == tmp_path and staged.is_dir()
    assert runs.attempts(job) == [f"staging/{job.id}/{host}-{os.getpid()}-abc123"]

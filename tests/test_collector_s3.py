"""``xsp collector serve --store s3://bucket/prefix`` against a real S3 server (SeaweedFS, as
tests/object_store.py starts it): two replicas on one object store, one killed with SIGKILL
mid-load and restarted, keep every acknowledged span on S3 exactly once, uploaded while they
run; an S3 outage keeps what was acknowledged in the spool until S3 is back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fixtures import fixture_table, free_ports, make_collector, write_run
from tests.object_store import SeaweedS3, seaweed
from tests.test_collector_faults import _poison, _small
from tests.test_collector_replicas import _sdk_load, _wait_http
from xsp.collector import writer
from xsp.collector.object_mirror import ObjectMirror, StoreTarget
from xsp.collector.store_worker import open_writer
from xsp.collector.writer import StoreWriter
from xsp.core import schema, store
from xsp.core.store import RunMeta, location

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["seaweed"]  # the fixture, used by name

Key = tuple[bytes, int]


class Replica:
    """``xsp collector serve --store s3://… --replica NAME --spool DIR``, on fixed ports (a
    restart takes the same ones and the same spool)."""

    def __init__(self, name: str, uri: str, server: SeaweedS3, work: Path) -> None:
        self.name, self.uri, self.server, self.work = name, uri, server, work
        self.grpc, self.http = free_ports(2)
        self.spool = work / f"local-{name}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Replica:
        log = self.work / f"{self.name}.log"
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "xsp", "collector", "serve", "--store", self.uri),
                *("--grpc", f"127.0.0.1:{self.grpc}", "--http", f"127.0.0.1:{self.http}"),
                *("--replica", self.name, "--spool", str(self.spool)),
            ],
            env={**os.environ, **self.server.env, "PYTHONPATH": str(ROOT)},
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
        )
        _wait_http(self.health_url, self.proc, self.name, log)
        return self

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.http}/healthz"

    def health(self) -> str:
        with urllib.request.urlopen(self.health_url, timeout=5) as response:
            return response.read().decode().strip()

    def segments(self) -> list[Path]:
        """The spool's segments that hold requests (the open one may be empty)."""
        spool = self.spool / f".spool-{self.name}"
        return [path for path in spool.glob("seg-*") if path.stat().st_size]

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)
        self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGTERM)


def _stored(server: SeaweedS3, uri: str) -> tuple[Counter[Key], dict[str, int]]:
    """Every (trace_id, span_id) that the span parts on S3 hold, with its count; and the
    objects there (name, size)."""
    objects = location.object_store(uri, server.env)
    listed = objects.listing()
    keys: Counter[Key] = Counter()
    for name in listed:
        if name.rsplit("/", 1)[-1].startswith("spans-"):
            table = pq.read_table(
                pa.BufferReader(objects.get(name)), columns=["trace_id", "span_id"]
            )
            keys.update(
                zip(table["trace_id"].to_pylist(), table["span_id"].to_pylist(), strict=True)
            )
    return keys, listed


def _pushed_run(root: Path, measurement: str) -> tuple[Path, set[Key]]:
    table = fixture_table("resnet18_train_cpu", "MF", measurement)
    resource = {
        schema.RES_SERVICE_NAME: "xsp",
        schema.RES_RUN_ID: measurement,
        schema.RES_MEASUREMENT_ID: measurement,
        schema.RES_LEVELS: "MF",
    }
    run = write_run(root / measurement, "MF", table, resource)
    return run, set(zip(table["trace_id"].to_pylist(), table["span_id"].to_pylist(), strict=True))


def _push(run: Path, replica: Replica) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "xsp",
            "push",
            str(run),
            "--endpoint",
            f"http://127.0.0.1:{replica.http}",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_stored(server: SeaweedS3, uri: str, wanted: set[Key]) -> Counter[Key]:
    deadline = time.time() + 90
    keys, _ = _stored(server, uri)
    while time.time() < deadline and not wanted <= set(keys):
        time.sleep(0.5)
        keys, _ = _stored(server, uri)
    return keys


@pytest.fixture
def replicas(seaweed: SeaweedS3, tmp_path: Path) -> Iterator[list[Replica]]:
    uri = seaweed.uri("collector")
    started = [Replica(name, uri, seaweed, tmp_path).start() for name in ("r1", "r2")]
    yield started
    for replica in started:
        replica.stop()


def test_two_replicas_on_s3_store_each_acknowledged_span_once_across_a_kill(
    seaweed: SeaweedS3, replicas: list[Replica], tmp_path: Path
) -> None:
    r1, r2 = replicas
    uri = r1.uri
    run, pushed_keys = _pushed_run(tmp_path / "pushed", "s3-push")
    acknowledged: set[Key] = set()
    started = threading.Event()
    load = threading.Thread(target=_sdk_load, args=(f"127.0.0.1:{r1.grpc}", acknowledged, started))
    load.start()
    push = _push(run, r2)  # the same run goes to r1 too, later: stored once across replicas
    assert started.wait(60)
    deadline = time.time() + 60  # r1's first parts reach S3 while it runs
    while time.time() < deadline and not any(
        n.endswith("-r1.parquet") for n in _stored(seaweed, uri)[1]
    ):
        time.sleep(0.2)
    r1.signal(signal.SIGKILL)  # mid-load: what it acknowledged is in its spool
    killed_at = len(acknowledged)
    before_kill = {n for n in _stored(seaweed, uri)[1] if n.endswith("-r1.parquet")}
    time.sleep(1.0)
    r1.start()  # same name and spool: replayed, uploaded
    load.join(timeout=120)
    output, _ = push.communicate(timeout=120)
    assert push.returncode == 0, output
    _wait_stored(seaweed, uri, pushed_keys)  # r2 acknowledged them from its spool: now on S3
    again = _push(run, r1)  # every span already on S3 from r2: r1 must leave them out
    output, _ = again.communicate(timeout=120)
    assert again.returncode == 0, output
    acknowledged |= pushed_keys  # `xsp push` exits 0 only once every batch was answered OK
    keys = _wait_stored(seaweed, uri, acknowledged)  # on S3 while both still run
    r1.stop()
    r2.stop()
    keys, listed = _stored(seaweed, uri)
    missing = acknowledged - set(keys)
    duplicated = {key: n for key, n in keys.items() if n > 1}
    print(
        f"acknowledged {len(acknowledged)} ({killed_at} before the kill), stored "
        f"{sum(keys.values())}, lost {len(missing)}, duplicated {len(duplicated)}"
    )
    assert killed_at > 0 and before_kill
    assert len(pushed_keys) > 1000 and len(acknowledged) > len(pushed_keys)
    assert not missing and not duplicated
    assert set(keys) == acknowledged  # nothing else either
    starts = {n.rsplit("/", 1)[1].split("-")[1] for n in listed if n.endswith("-r1.parquet")}
    assert len(starts) == 2  # r1 wrote parts before it was killed and after its restart
    assert not r1.segments() and not r2.segments()  # every segment was dropped once uploaded
    assert not [n for n in listed if "tmp" in n or ".spool" in n or ".quarantine" in n]
    pushed_parts = [n for n in listed if n.startswith("s3-push/MF/spans-")]
    assert {n.rsplit("-", 1)[1] for n in pushed_parts} == {"r2.parquet"}  # r1 stored none
    done = subprocess.run(
        [sys.executable, "-m", "xsp", "analyze", f"{uri}/s3-push", "--json"],
        env={**os.environ, **seaweed.env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert '"MF"' in done.stdout


@pytest.fixture
def outage_server(
    tmp_path_factory: pytest.TempPathFactory, seaweed: SeaweedS3
) -> Iterator[SeaweedS3]:
    """A server of its own, stopped and started again by the test (``seaweed`` only so that
    the test is skipped, or fails under CI, without the binary)."""
    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs-outage"))
    yield server
    if server.proc.poll() is None:
        server.kill()  # its data is thrown away: no need to wait for a clean stop


def test_an_s3_outage_keeps_acknowledged_spans_in_the_spool_until_s3_is_back(
    outage_server: SeaweedS3, tmp_path: Path
) -> None:
    uri = outage_server.uri("outage")
    replica = Replica("solo", uri, outage_server, tmp_path).start()
    try:
        first, first_keys = _pushed_run(tmp_path / "pushed", "before-outage")
        push = _push(first, replica)
        assert push.communicate(timeout=120)[0] is not None and push.returncode == 0
        assert _wait_stored(outage_server, uri, first_keys).total() == len(first_keys)
        assert replica.health() == "ok"
        outage_server.kill()
        during, during_keys = _pushed_run(tmp_path / "pushed", "during-outage")
        push = _push(during, replica)  # acknowledged from the spool, S3 down
        output, _ = push.communicate(timeout=120)
        assert push.returncode == 0, output
        deadline = time.time() + 60
        while time.time() < deadline and replica.health() == "ok":
            time.sleep(0.2)
        line = replica.health()
        print(line)
        assert line.startswith(f"ok, but storing into {uri} fails since ")
        assert "kept in the spool and retried" in line and "\n" not in line
        assert replica.segments()  # the acknowledged spans wait there
        outage_server.restart()
        keys = _wait_stored(outage_server, uri, first_keys | during_keys)
        deadline = time.time() + 60
        while time.time() < deadline and (replica.health() != "ok" or replica.segments()):
            time.sleep(0.2)
        assert replica.health() == "ok" and not replica.segments()
    finally:
        replica.stop()
    keys, _ = _stored(outage_server, uri)
    assert keys == Counter({key: 1 for key in first_keys | during_keys})
    log = (tmp_path / "solo.log").read_text()
    assert f"storing into {uri} again" in log


def test_a_quarantined_request_is_counted_in_the_run_json_on_s3(
    seaweed: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In one process (the flusher thread writes): a poison request set aside at flush time is
    counted in its run's run.json on S3, and the rest of its segment is stored there."""
    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)  # the collector reads the AWS variables, as xsp does
    uri = seaweed.uri("quarantine")
    c = make_collector(tmp_path, object_store=uri, flush_interval_s=60)
    c.spool.append(_small("a", 4).SerializeToString())
    c.spool.append(_poison("iteration").SerializeToString())  # got past ingest somehow
    c.spool.append(_small("b", 3).SerializeToString())
    c.flush()
    assert c.quarantined_requests == 1 and c.spool.pending_bytes == 0
    c.stop()
    keys, listed = _stored(seaweed, uri)
    assert sum(keys.values()) == 7 and len(keys) == 7
    assert {n.split("/")[0] for n in listed} == {"m-a", "m-b", "m-p"}  # no spool, no quarantine
    meta = json.loads(location.object_store(uri, seaweed.env).get("m-p/MF/run.json"))
    (item,) = (tmp_path / "store" / ".quarantine").iterdir()
    assert (meta["spans"], meta["quarantined_requests"], meta["quarantined"]) == (0, 1, [item.name])


def _aws(monkeypatch: pytest.MonkeyPatch, server: SeaweedS3) -> None:
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)  # the collector reads the AWS variables, as xsp does


def _meta(server: SeaweedS3, uri: str, run: str = "m-p/MF") -> dict[str, Any]:
    return cast(
        dict[str, Any], json.loads(location.object_store(uri, server.env).get(f"{run}/run.json"))
    )


def _written_by_r2(uri: str, work: Path, spans: int = 5) -> StoreWriter:
    """Replica r2's writer, having stored ``spans`` spans of run m-p/MF on S3."""
    r2 = open_writer(StoreTarget(work / "r2", uri, "r2"))
    assert r2.write(f"c{1:016x}-000001-r2", [writer.convert(_small("p", spans))]) == spans
    return r2


def test_a_request_quarantined_by_another_replica_keeps_the_run_json_on_s3(
    seaweed: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """r2 stored run m-p; r1, which never wrote it, sets aside a request of it: run.json on S3
    counts the request and still says what r2 stored (its spans, its resource)."""
    _aws(monkeypatch, seaweed)
    uri = seaweed.uri("quarantine-r2")
    _written_by_r2(uri, tmp_path)
    before = _meta(seaweed, uri)
    r1 = make_collector(tmp_path / "r1", object_store=uri, replica="r1", flush_interval_s=60)
    r1.spool.append(_poison("iteration").SerializeToString())
    r1.flush()
    r1.stop()
    meta = _meta(seaweed, uri)
    assert (before["spans"], meta["spans"]) == (5, 5)
    assert meta["resource"] == before["resource"] and meta["resource"]["xsp.run.id"] == "p"
    assert meta["resources_in_parts"] is True and meta["run_id"] == "p"
    assert (meta["quarantined_requests"], len(meta["quarantined"])) == (1, 1)


def test_pulling_run_json_keeps_this_replicas_counts_not_yet_uploaded(
    seaweed: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """r1's working copy counts a quarantined request and 2 duplicates of its own part whose
    upload failed; r2 wrote run.json on S3 since. r1's first pull takes r2's run.json and keeps
    r1's own counts in it."""
    _aws(monkeypatch, seaweed)
    uri = seaweed.uri("merge")
    _written_by_r2(uri, tmp_path)
    run_dir = tmp_path / "r1" / "m-p" / "MF"
    own = f"c{2:016x}-000001-r1"
    store.write_run_meta(
        run_dir / store.RUN_META,
        RunMeta(
            measurement_id="m-p",
            levels="MF",
            spans=0,
            duplicate_spans_skipped=2,
            duplicate_spans_skipped_by_part={own: 2, f"c{1:016x}-000001-r2": 9},
            quarantined_requests=1,
            quarantined=("q1.pb",),
        ),
    )
    mirror = ObjectMirror(uri, tmp_path / "r1", "r1", seaweed.env)
    assert mirror.pull(run_dir) == 1  # r2's part
    meta = store.read_run_meta(run_dir / store.RUN_META)
    assert meta.spans == 5 and meta.resource is not None  # r2's run.json
    assert (meta.quarantined_requests, meta.quarantined) == (1, ("q1.pb",))
    assert meta.duplicate_spans_skipped_by_part == {own: 2}  # r2's own count of its part: none
    assert meta.duplicate_spans_skipped == 2


def test_the_part_of_segment_one_million_goes_up_to_s3(
    seaweed: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start's millionth segment names its part ``c<start>-1000000-r1`` (seven digits): the
    writer uploads it, its resources and run.json, as any other."""
    _aws(monkeypatch, seaweed)
    uri = seaweed.uri("million")
    part = f"c{3:016x}-1000000-r1"
    r1 = open_writer(StoreTarget(tmp_path / "r1", uri, "r1"))
    assert r1.write(part, [writer.convert(_small("p", 4))]) == 4
    listed = location.object_store(uri, seaweed.env).listing()
    assert set(listed) == {
        f"m-p/MF/spans-{part}.parquet",
        f"m-p/MF/resources-{part}.parquet",
        "m-p/MF/run.json",
    }
    assert _stored(seaweed, uri)[0].total() == 4


def test_the_mirror_remembers_a_bounded_number_of_runs(seaweed: SeaweedS3, tmp_path: Path) -> None:
    """The runs whose run.json was fetched once are remembered, the most recent ``max_runs``
    of them: a run forgotten has its run.json fetched again on the next pull (the counts
    another replica added since come down), one remembered does not."""
    uri = seaweed.uri("bounded")
    objects = location.object_store(uri, seaweed.env)
    for run in ("a", "b", "c"):
        meta = RunMeta(measurement_id=run, levels="MF", spans=0, quarantined_requests=1)
        objects.put(f"{run}/MF/run.json", json.dumps(meta.to_json()).encode())
    mirror = ObjectMirror(uri, tmp_path / "r1", "r1", seaweed.env, max_runs=2)
    for run in ("a", "b", "c"):
        mirror.pull(tmp_path / "r1" / run / "MF")
    assert len(mirror._looked) == 2
    for run in ("a", "c"):  # another replica counts a second request in each
        meta = RunMeta(measurement_id=run, levels="MF", spans=0, quarantined_requests=2)
        objects.put(f"{run}/MF/run.json", json.dumps(meta.to_json()).encode())
        mirror.pull(tmp_path / "r1" / run / "MF")
    counts = {
        run: store.read_run_meta(tmp_path / "r1" / run / "MF" / "run.json").quarantined_requests
        for run in ("a", "c")
    }
    assert counts == {"a": 2, "c": 1}  # a was forgotten (b and c were pulled after it)

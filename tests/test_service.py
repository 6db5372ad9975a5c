"""Services that run until stopped (docs/serving.md): ``xsp run --iterations 0`` with a sampling
policy, batches stored while the program runs, and what is stored after a stop or a crash."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import xsp
from tests.test_cli import ROOT, _env
from tests.test_cli import xsp as xsp_cli
from xsp.core.errors import ConfigError
from xsp.core.store import open_run
from xsp.tracer.capture.hooks.context import OTEL_TRACE
from xsp.tracer.capture.sampling import SamplingPolicy
from xsp.tracer.export.batches import BatchExporter
from xsp.tracer.run.recover import recover_run

#: A service as people write one: it answers requests (one forward pass of a tiny model each)
#: until a flag file appears or it is stopped, and keeps how many it answered.
#: argv: the flag file, the count file, the pid file.
SERVICE = """
    import os, sys, time
    from pathlib import Path
    import torch

    stop, count = Path(sys.argv[1]), Path(sys.argv[2])
    Path(sys.argv[3]).write_text(str(os.getpid()))

    def save(served):  # whole at every moment: a SIGKILL may come at any point
        count.with_suffix(".tmp").write_text(str(served))
        os.replace(count.with_suffix(".tmp"), count)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model.eval()
    served = 0
    try:
        with torch.no_grad():
            while not stop.exists():
                model(torch.randn(1, 8))
                served += 1
                save(served)
                time.sleep(0.01)
    finally:
        save(served)
"""

WARMUP = 2
EVERY = 3


def _start(tmp_path: Path, *options: str) -> tuple[subprocess.Popen[str], dict[str, Path]]:
    script = tmp_path / "service.py"
    script.write_text(textwrap.dedent(SERVICE))
    files = {name: tmp_path / name for name in ("stop", "count", "pid")}
    files["out"] = tmp_path / "R"
    command = [
        sys.executable, "-m", "xsp", "run", "--levels", "MF", "--iterations", "0",
        "--warmup", str(WARMUP), "--export-every", "0.5", "--device", "cpu",
        "--out", str(files["out"]), *options, "--",
        "python", str(script), str(files["stop"]), str(files["count"]), str(files["pid"]),
    ]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return process, files


def _while_running(process: subprocess.Popen[str], run_dir: Path) -> dict[str, Any]:
    """run.json once two batches are stored, read while the service still runs."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        meta_path = run_dir / "run.json"
        if meta_path.exists():
            meta = json.loads(meta_path.read_text())  # whole at every moment (atomic rewrites)
            if meta.get("batches_stored", 0) >= 2:
                return meta
        time.sleep(0.1)
    raise AssertionError("no batch stored within 240 s")


def _steps_and_framework(run_dir: Path) -> tuple[dict[int, str | None], set[int]]:
    """The stored model spans (iteration -> status message) and the iterations with F spans."""
    rows = open_run(run_dir).spans().to_pylist()
    ids = [r["span_id"] for r in rows]
    assert len(ids) == len(set(ids))  # span ids go on from batch to batch
    steps = {r["iteration"]: r["status_message"] for r in rows if r["kind"] == "step"}
    assert len(steps) == sum(r["kind"] == "step" for r in rows)
    return steps, {r["iteration"] for r in rows if r["level"] == "framework"}


def test_a_service_profiled_until_it_stops_stores_batches_while_it_runs(tmp_path: Path) -> None:
    process, files = _start(tmp_path, "--sample-every", str(EVERY))
    run_dir = files["out"] / "MF"
    running = _while_running(process, run_dir)
    assert running["status"] == "running" and running["continuous"] is True
    parts = sorted(p.name for p in run_dir.glob("spans-*.parquet"))
    assert len(parts) >= 2 and set(running["files"]) <= set(parts)
    files["stop"].touch()
    _, err = process.communicate(timeout=240)
    assert process.returncode == 0, err
    served = int(files["count"].read_text())
    meta = open_run(run_dir).meta
    assert meta["status"] == "ok" and meta["iterations_requested"] == 0
    measured = served - WARMUP
    assert meta["iterations_measured"] == measured
    steps, framework = _steps_and_framework(run_dir)
    # M on every request; F on every third, from the first measured one
    assert sorted(steps) == list(range(measured))
    assert framework == set(range(0, measured, EVERY))
    assert meta["sampling"] == {
        "every": EVERY,
        "max_per_s": None,
        "run": 1,
        "sampled": len(framework),
    }
    assert meta["batches_stored"] == len(meta["files"]) >= 3
    assert sorted(meta["files"]) == sorted(p.name for p in run_dir.glob("spans-*.parquet"))
    assert not list(run_dir.glob("*.arena"))  # every batch stored: no raw records left


@pytest.mark.parametrize(
    ("target", "signum"), [("xsp", signal.SIGTERM), ("service", signal.SIGINT)]
)
def test_a_stopped_service_keeps_every_finished_iteration(
    tmp_path: Path, target: str, signum: int
) -> None:
    """SIGTERM to ``xsp run`` (a process manager's stop) or Ctrl-C's SIGINT to the service."""
    process, files = _start(tmp_path, "--sample-rate", "1000")
    run_dir = files["out"] / "MF"
    _while_running(process, run_dir)
    os.kill(process.pid if target == "xsp" else int(files["pid"].read_text()), signum)
    process.communicate(timeout=240)
    assert process.returncode == 130
    served = int(files["count"].read_text())
    meta = open_run(run_dir).meta
    assert meta["status"] == "interrupted"
    steps, framework = _steps_and_framework(run_dir)
    finished = [i for i, status in steps.items() if not status]
    # the request the signal cut short, if any, is kept and marked failed
    assert len(steps) - len(finished) <= 1
    # one more if Ctrl-C came between the forward pass's end and the service's count
    assert served - WARMUP <= len(finished) <= served - WARMUP + 1
    assert len(finished) == meta["iterations_measured"]
    assert framework <= set(steps) and framework  # at most 1000/s: each 10 ms request
    assert not list(run_dir.glob("*.arena"))


def test_a_crashed_service_loses_at_most_its_open_iteration(tmp_path: Path) -> None:
    """SIGKILL: the runner stores the batches drained but not yet stored and the open arena."""
    process, files = _start(tmp_path, "--sample-every", str(EVERY))
    run_dir = files["out"] / "MF"
    running = _while_running(process, run_dir)
    os.kill(int(files["pid"].read_text()), signal.SIGKILL)
    process.communicate(timeout=240)
    assert process.returncode == 128 + signal.SIGKILL
    served = int(files["count"].read_text())
    meta = open_run(run_dir).meta
    assert meta["status"] == "partial" and meta["recovered"] is True
    steps, framework = _steps_and_framework(run_dir)
    # every request the count file saw is stored; one more if the kill came between the
    # forward pass's end and the service's count
    assert sorted(steps) == list(range(len(steps)))
    assert served - WARMUP <= len(steps) <= served - WARMUP + 1
    assert meta["iterations_measured"] == len(steps) > running["iterations_measured"]
    assert framework == set(range(0, len(steps), EVERY))
    assert not list(run_dir.glob("*.arena"))


def test_a_service_measurement_needs_an_end_or_one_level_set(tmp_path: Path) -> None:
    script = tmp_path / "x.py"
    script.write_text("print('never runs')\n")
    base = ("run", "--iterations", "0", "--device", "cpu", "--out", str(tmp_path / "R"))
    done = xsp_cli(*base, "--levels", "M,MF", "--", "python", str(script))
    assert done.returncode == 2 and "one level set (--levels MF)" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "R").exists()
    done = xsp_cli("run", "--iterations", "5", "--sample-every", "10", "--", "python", str(script))
    assert done.returncode == 2 and "add --iterations 0 or a --duration" in done.stderr


def test_the_sampling_policy_every_nth_and_at_most_r_per_second() -> None:
    every = SamplingPolicy(every=4)
    assert [i for i in range(10) if every.sample(i)] == [0, 4, 8] and every.sampled == 3
    now = [0]
    rate = SamplingPolicy(rate=2.0, clock=lambda: now[0])  # at most one per 0.5 s
    picked = []
    for i in range(10):  # an iteration every 0.2 s: 0, 0.6, 1.2, 1.8 s are 0.5 s or more apart
        now[0] = i * 200_000_000
        if rate.sample(i):
            picked.append(i)
    assert picked == [0, 3, 6, 9]
    both = SamplingPolicy(every=2, rate=2.0, clock=lambda: now[0])
    picked = []
    for i in range(10):
        now[0] = i * 200_000_000
        if both.sample(i):
            picked.append(i)
    assert picked == [0, 4, 8]  # even ones, at least 0.5 s apart


def test_the_sampling_policy_in_runs_samples_as_many_in_all() -> None:
    runs = SamplingPolicy(every=4, run=3)  # 1 in 4, in runs of 3: a run every 12 iterations
    picked = [i for i in range(30) if runs.sample(i)]
    assert picked == [0, 1, 2, 12, 13, 14, 24, 25, 26]
    assert [runs.unsampled_from(i) for i in (0, 2, 3, 11, 12)] == [0, 0, 9, 1, 0]
    assert runs.describe() == {"every": 4, "max_per_s": None, "run": 3, "sampled": 9}
    now = [0]
    rate = SamplingPolicy(rate=2.0, run=2, clock=lambda: now[0])  # a run of 2 per 1 s at most
    picked = []
    for i in range(12):  # an iteration every 0.2 s: runs begin at 0, 1.0 and 2.0 s
        now[0] = i * 200_000_000
        if rate.sample(i):
            picked.append(i)
    assert picked == [0, 1, 5, 6, 10, 11]
    assert rate.describe()["max_per_s"] == 2.0


def test_a_session_with_a_duration_stops_measuring_and_the_program_runs_on(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 4)
    session = xsp.session(
        "M", iterations=0, warmup=0, duration_s=0.3, out=tmp_path / "M", device="cpu"
    )
    began = time.monotonic()
    calls = 0
    while time.monotonic() - began < 1.0:
        with xsp.iteration():
            model(torch.ones(1, 4))
        calls += 1
        time.sleep(0.01)
    assert session.done
    meta = session.close()
    assert meta is not None and meta["status"] == "ok" and meta["duration_s"] == 0.3
    steps = [r for r in open_run(tmp_path / "M").spans().to_pylist() if r["kind"] == "step"]
    assert 0 < len(steps) == meta["iterations_measured"] < calls
    last_end = max(r["start_ns"] + r["dur_ns"] for r in steps)
    first_start = min(r["start_ns"] for r in steps)
    assert last_end - first_start < 0.6e9  # the duration, and the iteration that ended past it


def test_sampling_without_an_end_is_refused_in_the_api() -> None:
    with pytest.raises(ConfigError, match="continuous session"):
        xsp.session("MF", iterations=3, sample_rate=5.0)


def test_recovery_stores_the_batches_not_yet_stored_and_the_open_arena(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that dies while its exporter is behind: two drained batches still wait as
    ``capture-<part>.arena`` beside the open arena. Its directory, copied as it was, is what the
    runner recovers: every finished iteration, each batch in its own part."""
    # the copy below copies the sparse files whole; the calibration when the levels come on
    # writes about 97k records (its probes with shapes and their lines, then without)
    monkeypatch.setenv("XSP_ARENA_MB", "8")
    held = threading.Event()
    store_batch = BatchExporter._store

    def behind(self: BatchExporter, batch: Any) -> None:
        held.wait()
        store_batch(self, batch)

    monkeypatch.setattr(BatchExporter, "_store", behind)
    live = tmp_path / "live" / "MF"
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    session = xsp.session(
        "MF", iterations=0, warmup=0, out=live, device="cpu", sample_every=2, export_every_s=1e6
    )
    for i in range(7):
        with xsp.iteration():
            net(torch.ones(1, 4))
        if i in (1, 3):  # batches 0 (iterations 0, 1) and 1 (2, 3); 4 to 6 stay in the arena
            session._continuous._rotate()
    dead = tmp_path / "dead" / "MF"
    shutil.copytree(live, dead)
    held.set()
    session.close()
    assert sorted(p.name for p in dead.glob("*.arena")) == [
        "capture-00000.arena",
        "capture-00001.arena",
        "capture.arena",
    ]
    assert json.loads((dead / "run.json").read_text())["status"] == "running"
    meta = recover_run(dead, "was killed by SIGKILL")
    assert meta is not None and meta.status == "partial" and meta.recovered is True
    assert meta.iterations_measured == 7
    assert meta.files == ("spans-00000.parquet", "spans-00001.parquet", "spans-00002.parquet")
    steps, framework = _steps_and_framework(dead)
    assert sorted(steps) == list(range(7)) and framework == {0, 2, 4, 6}
    assert not list(dead.glob("*.arena"))
    live_steps, live_framework = _steps_and_framework(live)  # the live one stored the same
    assert sorted(live_steps) == list(range(7)) and live_framework == {0, 2, 4, 6}


def test_each_batch_is_sent_over_otlp_while_the_service_runs(tmp_path: Path) -> None:
    """The collector acknowledges a batch's spans while the session runs, and holds every
    stored span in the end (level M on each of 9 iterations, F on 0, 3 and 6)."""
    from tests.fixtures import http_collector
    from xsp.core.otlp.transport import OtlpConfig, make_transport
    from xsp.tracer.export.sinks import OtlpSink

    collector = http_collector(tmp_path / "collector", flush_interval_s=0.05)
    try:
        config = OtlpConfig.from_env(f"http://127.0.0.1:{collector.http_port}")
        assert config is not None
        otlp = OtlpSink(make_transport(config))
        run_dir = tmp_path / "run" / "MF"
        net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        session = xsp.session(
            "MF", iterations=0, warmup=0, out=run_dir, device="cpu", sample_every=3,
            export_every_s=1e6, sinks=[otlp],
        )  # fmt: skip
        for i in range(9):
            with xsp.iteration():
                net(torch.ones(1, 4))
            if i == 3:
                session._continuous._rotate()  # batch 0: iterations 0 to 3
        deadline = time.monotonic() + 60
        while (
            time.monotonic() < deadline
            and json.loads((run_dir / "run.json").read_text()).get("batches_stored") != 1
        ):
            time.sleep(0.05)
        running = json.loads((run_dir / "run.json").read_text())
        assert running["status"] == "running" and running["iterations_measured"] == 4
        assert running["otlp_spans_sent"] == running["spans"] > 4  # steps 0-3, F of 0 and 3
        meta = session.close()
    finally:
        collector.stop()
    assert meta is not None and meta["status"] == "ok" and meta["batches_stored"] == 2
    assert meta["otlp_spans_sent"] == meta["spans"] == open_run(run_dir).spans().num_rows
    received = [open_run(p.parent) for p in (tmp_path / "collector").rglob("run.json")]
    rows = [r for run in received for r in run.spans().to_pylist()]
    assert len(rows) == meta["spans"]
    assert sorted(r["iteration"] for r in rows if r["kind"] == "step") == list(range(9))
    assert {r["iteration"] for r in rows if r["level"] == "framework"} == {0, 3, 6}


def test_onednn_calls_are_recorded_on_the_sampled_iterations_only(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Level L on CPU (oneDNN's verbose lines) follows the policy too, across a batch boundary,
    and the program's own output still reaches its stdout."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU())
    x = torch.randn(2, 3, 32, 32)
    session = xsp.session(
        "MFL", iterations=0, warmup=0, out=tmp_path / "MFL", device="cpu", sample_every=3,
        export_every_s=1e6,
    )  # fmt: skip
    for i in range(8):
        with xsp.iteration():
            net(x)
            print("served", i, flush=True)
        if i == 4:
            session._continuous._rotate()
    meta = session.close()
    assert meta is not None and meta["status"] == "ok" and meta["batches_stored"] == 2
    assert capfd.readouterr().out.count("served") == 8
    rows = open_run(tmp_path / "MFL").spans().to_pylist()
    convs = [r for r in rows if r["kind"] == "library_call" and r["name"] == "convolution"]
    assert sorted(r["iteration"] for r in convs) == [0, 3, 6]
    assert {r["iteration"] for r in rows if r["level"] == "framework"} == {0, 3, 6}


def _python_calls_per_request(model: torch.nn.Module, requests: int) -> float:
    """Python function calls per call of ``model``: any code's but OpenTelemetry's (where the
    program uses it, xsp reads its current span through one call, counted)."""
    calls = [0]

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and "opentelemetry" not in frame.f_code.co_filename:
            calls[0] += 1

    sys.setprofile(count)
    try:
        for _ in range(requests):
            model(torch.ones(1, 4))
    finally:
        sys.setprofile(None)
    return calls[0] / requests


def _service_session(tmp_path: Path, levels: str, sample_every: int) -> Any:
    return xsp.session(
        levels,
        iterations=0,
        warmup=2,
        out=tmp_path / levels,
        device="cpu",
        auto_iterations=True,
        sample_every=sample_every,
        export_every_s=600,
        monitor=False,
    )


@pytest.mark.parametrize("levels", ["M", "MF"])
def test_an_unsampled_request_runs_no_python_code_of_xsp(
    tmp_path: Path, levels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a service pays on every request is what runs in Python around its model call. The
    session lends the root module's native ``__call__`` its iterations that record level M's
    step alone (F sampled off, no application span to join), and it times and records them
    itself: no Python call of xsp's (six before, 1.1-1.4 µs of a 28 µs request on the dev
    machine; 29 before that). Every request's step is stored all the same."""
    monkeypatch.delitem(sys.modules, OTEL_TRACE, raising=False)  # as in a program without it
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    with torch.inference_mode():
        for _ in range(10):
            model(torch.ones(1, 4))
        untraced = _python_calls_per_request(model, 200)
    # the first measured request is sampled, the 200 after it are not
    session = _service_session(tmp_path, levels, sample_every=1000)
    with torch.inference_mode():
        for _ in range(10):
            model(torch.ones(1, 4))
        traced = _python_calls_per_request(model, 200)
    meta = session.close()
    assert meta is not None and meta["status"] == "ok", meta
    assert traced == untraced, (traced, untraced)
    assert meta["iteration_boundary"] == "root-module-call"
    rows = open_run(tmp_path / levels).spans().to_pylist()
    steps = sorted(r["iteration"] for r in rows if r["kind"] == "step")
    assert steps == list(range(10 - 2 + 200)) and meta["iterations_measured"] == 208
    assert {r["iteration"] for r in rows if r["level"] == "framework"} == (
        {0} if levels == "MF" else set()
    )


def test_a_program_using_opentelemetry_keeps_the_markers(tmp_path: Path) -> None:
    """Where the program has imported OpenTelemetry, a request may carry a span to join: each
    one goes through the Python markers, which read it (seven calls of xsp's)."""
    import opentelemetry.trace  # noqa: F401

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    with torch.inference_mode():
        for _ in range(10):
            model(torch.ones(1, 4))
        untraced = _python_calls_per_request(model, 100)
    session = _service_session(tmp_path, "M", sample_every=1)
    with torch.inference_mode():
        for _ in range(10):
            model(torch.ones(1, 4))
        traced = _python_calls_per_request(model, 100)
    meta = session.close()
    assert meta is not None and meta["iterations_measured"] == 108, meta
    assert traced - untraced == 7, (traced, untraced)


class _Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        if scale < 0:
            raise ValueError(f"a negative scale {scale}")
        return self.linear(x) * scale


def test_a_lent_request_answers_and_fails_as_the_program_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a lent iteration the model gets its keyword arguments and its answer is the same
    tensor; an exception reaches the program unchanged, its step is stored failed with the
    exception's text, and the requests after it are measured again."""
    monkeypatch.delitem(sys.modules, OTEL_TRACE, raising=False)
    model = _Scaled().eval()
    x = torch.ones(1, 4)
    with torch.inference_mode():
        expected = model(x, scale=2.0)
    session = _service_session(tmp_path, "MF", sample_every=50)
    answers, raised = [], []
    with torch.inference_mode():
        for request in range(30):
            try:
                answers.append(model(x, scale=-1.0 if request == 12 else 2.0))
            except ValueError as exc:
                raised.append(str(exc))
    meta = session.close()
    assert meta is not None, meta
    assert raised == ["a negative scale -1.0"] and len(answers) == 29
    assert all(torch.equal(answer, expected) for answer in answers)
    rows = open_run(tmp_path / "MF").spans().to_pylist()
    steps = {r["iteration"]: r["status_message"] for r in rows if r["kind"] == "step"}
    assert sorted(steps) == list(range(28))  # 30 requests less the 2 of the warm-up
    assert steps[10] == "ValueError: a negative scale -1.0"  # request 12
    assert [i for i, message in steps.items() if message] == [10]
    assert meta["iterations_measured"] == 27  # the failed one is not counted as measured


def test_sampling_switches_level_f_without_reassigning_module_call(tmp_path: Path) -> None:
    """Level F's sampling switch is a flag: ``nn.Module.__call__`` is wrapped once for the
    session, not reassigned at each switch (a type slot: Python then updates every module
    class, 23 µs each way on the dev machine, twice per sampled request). The sampled requests
    still get their layer spans, and torch's own is back after the session."""
    torch_call = torch.nn.Module.__call__
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    session = xsp.session(
        "MF", iterations=0, warmup=2, out=tmp_path / "MF", device="cpu", auto_iterations=True,
        sample_every=2, export_every_s=600, monitor=False,
    )  # fmt: skip
    seen = []
    with torch.inference_mode():
        for _ in range(12):
            model(torch.ones(1, 4))
            seen.append(torch.nn.Module.__dict__["__call__"])
    meta = session.close()
    assert meta is not None and meta["status"] == "ok", meta
    assert len({id(call) for call in seen[2:]}) == 1  # the measured requests': one wrapper
    assert torch.nn.Module.__call__ is torch_call
    rows = open_run(tmp_path / "MF").spans().to_pylist()
    layers = [r for r in rows if r["kind"] == "module"]
    assert {r["iteration"] for r in layers} == {0, 2, 4, 6, 8}
    assert len(layers) == 5 * 3  # the root and its two layers, on each sampled request


def test_the_requests_thread_hands_batches_over_and_the_exporter_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's hand-over on the request's thread is cheap: reading the batch's arena and
    draining it (3-4 ms a batch on the dev machine, inside a request) happen on the exporter's
    thread. Every batch is still stored whole and in order."""
    import xsp.core.arena as arena_module

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    session = xsp.session(
        "MF", iterations=0, warmup=2, out=tmp_path / "MF", device="cpu", auto_iterations=True,
        sample_every=3, export_every_s=0.02, monitor=False,
    )  # fmt: skip
    readers: list[threading.Thread] = []
    parse = arena_module._parse

    def reading(*args: Any) -> Any:
        readers.append(threading.current_thread())
        return parse(*args)

    with torch.inference_mode():
        for _ in range(4):  # the warm-up, and the levels' start (their calibration reads)
            model(torch.ones(1, 4))
        monkeypatch.setattr(arena_module, "_parse", reading)
        for _ in range(60):
            model(torch.ones(1, 4))
            time.sleep(0.002)
    meta = session.close()
    assert meta is not None and meta["status"] == "ok", meta
    # each batch read once (a last one without an iteration is read, and not stored)
    assert meta["batches_stored"] >= 3 and len(readers) >= meta["batches_stored"]
    assert threading.current_thread() not in readers
    assert {t.name for t in readers} == {"xsp-export"}
    steps, framework = _steps_and_framework(tmp_path / "MF")
    assert sorted(steps) == list(range(62))
    assert framework == set(range(0, 62, 3))


def test_the_request_after_a_batch_boundary_follows_the_sampling_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's hand-over leaves level F recording and the next request's policy undecided:
    that request goes through the markers, where the policy switches F off for the unsampled
    requests 4 and 5 and on again for 6. A batch falls due as sampled request 3 ends."""
    monkeypatch.delitem(sys.modules, OTEL_TRACE, raising=False)  # the root call may be lent
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    session = _service_session(tmp_path, "MF", sample_every=3)
    with torch.inference_mode():
        for request in range(2 + 9):
            model(torch.ones(1, 4))
            if request == 2 + 2:  # measured 2 ended (nothing lent: 3 is sampled)
                session._continuous.batches.started, session._continuous.due = -1e9, 0.0
    meta = session.close()
    assert meta is not None and meta["status"] == "ok", meta
    assert meta["batches_stored"] == 2
    steps, framework = _steps_and_framework(tmp_path / "MF")
    assert sorted(steps) == list(range(9))
    assert framework == {0, 3, 6}

"""Live capture on CPU with a tiny model: Sequential(Linear(8,16), ReLU, Linear(16,4))."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest
import torch

import xsp
from tests.conftest import reachable_from_root
from xsp.core.errors import ConfigError, DeviceError
from xsp.core.store import open_run
from xsp.tracer.capture.session import Session
from xsp.tracer.export.sinks import InMemorySink


def _mlp() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(3, 8)


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()


def _kind(table, kind: str) -> list[dict]:  # type: ignore[no-untyped-def]
    return table.filter(pc.equal(table.column("kind"), kind)).to_pylist()


def test_mf_training_session_records_layers_ops_backward_and_optimizer() -> None:
    model, opt, x = _mlp()
    sink = InMemorySink()
    with xsp.session("MF", iterations=3, warmup=1, sinks=[sink], workload="mlp", device="cpu") as s:
        for _ in range(4):
            with xsp.iteration():
                _train_step(model, opt, x)
    table = sink.table()
    assert s.result is not None and s.result["status"] == "ok"
    assert [r["iteration"] for r in _kind(table, "step")] == [0, 1, 2]
    assert reachable_from_root(table)
    modules = _kind(table, "module")
    assert len(modules) == 3 * 4
    assert {m["module_path"] for m in modules} == {n for n, _ in model.named_modules()}
    second = next(m for m in modules if m["module_path"] == "2")
    assert (second["input_shapes"], second["output_shapes"]) == ("[[3,16]]", "[[3,4]]")
    assert second["module_params"] == 16 * 4 + 4
    # the two Linear layers each produce one AddmmBackward0 per iteration, attributed to them
    addmm = [b for b in _kind(table, "backward") if b["name"].endswith("AddmmBackward0")]
    assert sorted(b["module_path"] for b in addmm) == ["0", "0", "0", "2", "2", "2"]
    assert len(_kind(table, "optimizer")) == 3 * 2  # zero_grad and step
    resource = sink.batches[0].resource
    assert (
        resource["xsp.levels"] == "MF"
        and resource["host.name"]
        and resource["xsp.workload"] == "mlp"
    )


def test_an_f_session_calibrates_op_and_module_records_apart(tmp_path: Path) -> None:
    """The calibration's probes (xsp.tracer.capture.calibrate): the chain of 16 Identity
    modules writes 17 module records and no op record a call; the small training step writes
    its 4 module calls' records and its ops'; an op record costs the step's added time less its
    module calls', per op record. F records the ops' shapes in the first measured iteration only,
    so the step is timed both ways: with the shapes (the first iteration's cost) and without
    (the later ones'), writing the same records. Each round times F off, then on: the program's
    iterations after it are recorded."""
    model, opt, x = _mlp()
    sink = InMemorySink()
    session = Session(
        "MF", iterations=2, warmup=1, out=tmp_path / "MF", sinks=[sink], device="cpu"
    ).start()
    for _ in range(3):
        with xsp.iteration():
            _train_step(model, opt, x)
    session.close()
    meta = json.loads((tmp_path / "MF" / "run.json").read_text())
    found = meta["calibration"]
    # the switch-on's parts (no GPU: no monitor) add up to the switch-on's own time
    parts = meta["switch_on_ms"]
    assert set(parts) == {"calibration, levels off", "level M", "level F", "calibration, levels on"}
    assert parts["calibration, levels off"] > 0 and parts["calibration, levels on"] > 0
    switch_on_ms = (meta["phases_ns"]["enabled"] - meta["phases_ns"]["levels_on"]) / 1e6
    assert sum(parts.values()) == pytest.approx(switch_on_ms, abs=0.05)
    chain, step = found["probes"]["modules"], found["probes"]["step"]
    assert chain["records"] == {"modules": 17.0, "ops": 0.0}
    assert step["records"]["modules"] == 4.0 and step["records"]["ops"] > 20
    plain = found["probes"]["step_without_shapes"]
    assert found["rounds"] == 5 and found["calls"] == 20 and found["paired"] is True
    assert plain["records"] == step["records"]
    module_ns = max(0.0, chain["on_ns"] - chain["off_ns"]) / 17
    assert found["module_ns_per_call"] == pytest.approx(module_ns, abs=0.1)
    for probe, key in (
        (step, "framework_ns_per_record_first_iteration"),
        (plain, "framework_ns_per_record"),
    ):
        added = probe["on_ns"] - probe["off_ns"] - 4 * module_ns
        assert found[key] == pytest.approx(max(0.0, added) / step["records"]["ops"], abs=0.2)
    assert found["device"] == "cpu"
    # F was left on: both measured iterations' module calls and ops were recorded
    table = sink.table()
    assert len(_kind(table, "module")) == 2 * 4
    ops = _kind(table, "op")
    assert {o["iteration"] for o in ops} == {0, 1}
    assert sum(o["iteration"] == 0 for o in ops) == sum(o["iteration"] == 1 for o in ops)


def test_step_marks_boundaries_and_warmup_is_not_recorded() -> None:
    model, opt, x = _mlp()
    sink = InMemorySink()
    session = xsp.session("M", iterations=2, warmup=2, sinks=[sink], device="cpu")
    for _ in range(6):  # the 5th call ends the last measured iteration; the rest are no-ops
        xsp.step()
        _train_step(model, opt, x)
    session.close()
    steps = _kind(sink.table(), "step")
    assert [s["iteration"] for s in steps] == [0, 1]
    assert all(s["dur_ns"] > 0 for s in steps)
    assert xsp.current_session() is None


def test_optimizer_steps_delimit_iterations_in_unmodified_loops() -> None:
    model, opt, x = _mlp()
    sink = InMemorySink()
    session = Session(
        "MF", iterations=3, warmup=1, sinks=[sink], device="cpu", auto_iterations=True
    ).start()
    for _ in range(5):
        _train_step(model, opt, x)
    session.close()
    table = sink.table()
    assert len(_kind(table, "step")) == 3
    assert reachable_from_root(table)
    # each iteration runs from the end of one optimizer.step() to the end of the next (the
    # first from the first module call), so the zero_grad between them is inside it
    assert len(_kind(table, "module")) == 3 * 4
    names = [o["name"] for o in _kind(table, "optimizer")]
    assert names.count("Optimizer.step#SGD.step") == 3
    assert names.count("Optimizer.zero_grad#SGD.zero_grad") == 3


def test_an_exception_marks_the_iteration_failed_and_keeps_what_was_recorded(
    tmp_path: Path,
) -> None:
    model, opt, x = _mlp()
    run_dir = tmp_path / "MF"
    with (
        pytest.raises(ValueError, match="boom"),
        xsp.session("MF", iterations=5, warmup=0, out=run_dir, device="cpu"),
    ):
        for i in range(5):
            with xsp.iteration():
                _train_step(model, opt, x)
                if i == 1:
                    raise ValueError("boom")
    run = open_run(run_dir)
    assert run.meta["status"] == "error" and run.meta["error"] == "ValueError: boom"
    assert run.meta["failed_iterations"] == {"1": "ValueError: boom"}
    steps = _kind(run.spans(), "step")
    assert [s["status_message"] for s in steps] == [None, "ValueError: boom"]
    assert json.loads((run_dir / "run.json").read_text())["spans"] == run.spans().num_rows


def test_the_reason_line_counts_only_the_iterations_the_summary_keeps(tmp_path: Path) -> None:
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.tables.summary import level_sets

    run_dir = tmp_path / "M"
    with (
        pytest.raises(ValueError, match="boom"),
        xsp.session("M", iterations=5, warmup=0, out=run_dir, device="cpu"),
    ):
        for i in range(5):
            with xsp.iteration():
                if i == 2:
                    raise ValueError("boom")  # iterations 0 and 1 measured, 2 failed
    meta = open_run(run_dir).meta
    assert meta["iterations_measured"] == 2
    assert "2 of 5 iterations measured" in meta["status_reasons"]
    (row,) = level_sets(MeasurementStore(run_dir)).to_pylist()
    assert row["iterations"] == 2


def test_framework_level_records_beside_a_running_torch_profiler(tmp_path: Path) -> None:
    model, opt, x = _mlp()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        session = Session("MF", iterations=1, warmup=0, out=tmp_path / "MF", device="cpu")
        session.start()
        with session.iteration():
            _train_step(model, opt, x)
        meta = session.close()
    # both see the ops: RecordFunction takes any number of global callbacks
    assert meta is not None and meta["status"] == "ok", meta
    ops = _kind(open_run(tmp_path / "MF").spans(), "op")
    assert any(o["name"] == "aten::addmm" for o in ops)
    assert any(e.name == "aten::addmm" for e in prof.events())
    # the allocators report to one profiler state per thread, and it is the profiler's
    assert not meta.get("memory_events")


def test_a_script_without_modules_gets_its_ops(tmp_path: Path) -> None:
    # functional code: ops and autograd nodes, no nn.Module call for the layer columns to use
    x = torch.ones(4, requires_grad=True)
    session = Session("MF", iterations=2, warmup=0, out=tmp_path / "MF", device="cpu").start()
    while not session.done:
        with session.iteration():
            torch.relu(x * 2).sum().backward()
    meta = session.close()
    assert meta is not None and meta["status"] == "ok", meta
    spans = open_run(tmp_path / "MF").spans()
    for iteration in (0, 1):
        ops = [o for o in _kind(spans, "op") if o["iteration"] == iteration]
        assert {"aten::mul", "aten::relu", "aten::sum"} <= {o["name"] for o in ops}
    assert not _kind(spans, "module")


def test_a_conversion_that_fails_keeps_the_raw_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xsp.core.arena import read_arena, step_records
    from xsp.tracer.export import finish

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a converter bug")

    monkeypatch.setattr(finish, "build_table", broken)
    model, opt, x = _mlp()
    session = Session("MF", iterations=2, warmup=0, out=tmp_path / "MF", device="cpu").start()
    while not session.done:
        with session.iteration():
            _train_step(model, opt, x)
    meta = session.close()
    assert meta is not None and meta["status"] == "error"
    arena = tmp_path / "MF" / "capture.arena"
    assert (
        f"RuntimeError: a converter bug (levels M and F's raw records are kept in {arena})"
        in (meta["error"])
    )
    steps = step_records(read_arena(arena))
    assert list(steps.iteration) == [0, 1]


def test_the_tail_after_the_last_step_is_kept_but_not_measured(tmp_path: Path) -> None:
    # an unmodified script that steps 3 times where 5 iterations were asked, then evaluates
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.tables.summary import level_sets

    model, opt, x = _mlp()
    session = Session(
        "M", iterations=5, warmup=0, out=tmp_path / "M", device="cpu", auto_iterations=True
    ).start()
    for _ in range(3):
        _train_step(model, opt, x)
    with torch.no_grad():
        for _ in range(50):
            model(x)  # the tail: not an iteration
    meta = session.close()
    assert meta is not None and meta["status"] == "partial"
    assert (
        meta["iterations_measured"] == 3 and "3 of 5 iterations measured" in meta["status_reasons"]
    )
    steps = _kind(open_run(tmp_path / "M").spans(), "step")
    assert [s["status_message"] for s in steps] == [None] * 3 + [
        "the session closed inside this iteration"
    ]
    (row,) = level_sets(MeasurementStore(tmp_path / "M")).to_pylist()
    complete = sorted(s["dur_ns"] / 1e6 for s in steps[:3])
    assert row["iterations"] == 3
    assert row["step_max_ms"] == pytest.approx(complete[-1])
    assert row["step_median_ms"] == pytest.approx(complete[1])


def test_a_session_that_measured_nothing_is_an_error_that_says_why(tmp_path: Path) -> None:
    x = torch.randn(3, 8)
    session = Session(
        "M", iterations=2, warmup=0, out=tmp_path / "M", device="cpu", auto_iterations=True
    ).start()
    for _ in range(5):
        torch.relu(x @ x.T)  # no module, no optimizer step, no marker
    meta = session.close()
    assert meta is not None and meta["status"] == "error"
    assert meta["error"] == (
        "0 of 2 iterations measured: the program called no nn.Module with parameters and no "
        "optimizer.step(); mark its iterations with xsp.step() or name a function with "
        "--iteration-fn"
    )
    assert meta["iteration_boundary"] is None


def test_markers_without_a_session_do_nothing() -> None:
    assert xsp.current_session() is None
    xsp.step()
    with xsp.iteration():
        pass


def test_bad_configuration_names_the_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'MX'"):
        Session("MX")
    with pytest.raises(ConfigError, match="iterations -1"):
        Session("M", iterations=-1)
    with pytest.raises(ConfigError, match="sample-every 0"):
        Session("M", iterations=0, sample_every=0)
    with pytest.raises(ConfigError, match="duration 0"):
        Session("M", duration_s=0)
    with pytest.raises(ConfigError, match="continuous session"):  # sampling needs no end
        Session("MF", iterations=5, sample_every=2)
    with pytest.raises(ConfigError, match="'tpu'"):
        Session("M", device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="cuda"):
            Session("M", device="cuda")


def test_close_is_idempotent_and_partial_runs_say_so(tmp_path: Path) -> None:
    session = Session("M", iterations=4, warmup=0, out=tmp_path / "M", device="cpu").start()
    with session.iteration():
        pass
    first = session.close()
    assert first is not None and first["status"] == "partial" and first["iterations_measured"] == 1
    assert session.close() is first


def test_a_rerun_replaces_the_earlier_run(tmp_path: Path) -> None:
    for _ in range(2):
        session = Session("M", iterations=2, warmup=0, out=tmp_path / "M", device="cpu").start()
        for _ in range(2):
            with session.iteration():
                pass
        session.close()
    run = open_run(tmp_path / "M")
    assert len(run.span_files) == 1 and run.spans().num_rows == 2


def test_mfl_on_cpu_puts_onednn_calls_under_aten_ops_and_keeps_user_output(
    capfd: pytest.CaptureFixture[str],
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten())
    x = torch.randn(2, 3, 32, 32)
    expected = model(x)
    sink = InMemorySink()
    with xsp.session("MFL", iterations=2, warmup=0, sinks=[sink], device="cpu") as s:
        while not s.done:
            with s.iteration():
                out = model(x)
                print("user line", flush=True)
    assert torch.equal(out, expected)  # tracing does not change the results
    assert capfd.readouterr().out.count("user line") == 2  # and the user's stdout comes back
    table = sink.table()
    assert reachable_from_root(table)
    rows = {r["span_id"]: r for r in table.to_pylist()}
    calls = [r for r in rows.values() if r["kind"] == "library_call"]
    convs = [r for r in calls if r["name"] == "convolution"]
    assert len(convs) == 2 and all(r["library"] == "oneDNN" for r in calls)
    for call in convs:
        op = rows[call["parent_span_id"]]
        assert op["level"] == "framework" and op["name"] == "aten::mkldnn_convolution"
        assert call["module_path"] == "0" and "forward" in call["library_detail"]
        assert op["start_ns"] <= call["start_ns"] <= op["start_ns"] + op["dur_ns"]


@pytest.mark.parametrize(("hold_s", "kept"), [(0.06, True), (1.0, False)])
def test_a_range_another_thread_still_has_open_at_the_end_is_waited_for_or_named(
    tmp_path: Path, hold_s: float, kept: bool
) -> None:
    """A backend's work thread (gloo's) ends its range just after the last step: the end of
    the run waits for it (up to OPEN_RANGE_WAIT_S, 0.2 s) rather than drop it as open; one
    that stays open longer is left out and said to be."""
    import threading
    import time

    model, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    session = Session("MF", iterations=2, warmup=0, out=tmp_path / "MF", device="cpu").start()

    def work() -> None:
        with torch.profiler.record_function("background_work"):
            time.sleep(hold_s)

    background = threading.Thread(target=work)
    for index in range(2):
        with session.iteration():
            model(x).sum().backward()
            if index == 1:
                background.start()
                time.sleep(0.01)
    meta = session.close()
    background.join()
    assert meta is not None
    names = [s["name"] for s in open_run(tmp_path / "MF").spans().to_pylist()]
    if kept:
        assert meta["status"] == "ok" and meta["ranges_left_open"] == 0
        assert names.count("background_work") == 1
    else:
        assert meta["status"] == "partial" and meta["ranges_left_open"] == 1
        assert (
            "1 ranges other threads still had open when the levels stopped were left out"
            in meta["status_reasons"]
        )
        assert "background_work" not in names


def test_the_calibration_leaves_the_programs_random_draws_and_runs_in_inference_mode(
    tmp_path: Path,
) -> None:
    """An inference loop under torch.inference_mode() draws the same random numbers with F on
    (whose calibration builds and trains a small model when the levels come on) as with M alone,
    and the calibration still measures there."""

    def draws(levels: str) -> list[float]:
        torch.manual_seed(7)
        model = torch.nn.Linear(4, 4)
        out: list[float] = []
        with torch.inference_mode():
            session = Session(levels, iterations=2, warmup=1, out=tmp_path / levels, device="cpu")
            session.start()
            for _ in range(3):
                with xsp.iteration():
                    out.append(float(model(torch.rand(1, 4)).sum()))
            session.close()
        return out

    assert draws("M") == draws("MF")
    found = json.loads((tmp_path / "MF" / "run.json").read_text())["calibration"]
    assert found["probes"]["modules"]["records"]["modules"] == 17.0

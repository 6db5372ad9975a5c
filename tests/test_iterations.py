"""How a session finds an unmodified script's iterations (xsp.tracer.capture.iterations), on
CPU with a tiny model: Sequential(Linear(8,16), ReLU, Linear(16,4)), 4 modules a forward."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from tests.conftest import reachable_from_root
from xsp.core.errors import ConfigError
from xsp.tracer.capture.session import Session
from xsp.tracer.export.sinks import InMemorySink


def _mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return model, torch.randn(3, 8)


def _kind(table: pa.Table, kind: str) -> list[dict]:  # type: ignore[type-arg]
    return table.filter(pc.equal(table.column("kind"), kind)).to_pylist()


def _session(sink: InMemorySink, **options: object) -> Session:
    defaults: dict[str, object] = {"iterations": 3, "warmup": 1, "device": "cpu"}
    return Session("MF", sinks=[sink], auto_iterations=True, **{**defaults, **options}).start()  # type: ignore[arg-type]


def _modules_under_steps(table: pa.Table) -> list[list[str]]:
    """For each step (by iteration), the module paths of its direct children, in time order."""
    steps = {s["span_id"]: s["iteration"] for s in _kind(table, "step")}
    children: dict[int, list[tuple[int, str]]] = {it: [] for it in steps.values()}
    for m in _kind(table, "module"):
        if m["parent_span_id"] in steps:
            children[steps[m["parent_span_id"]]].append((m["start_ns"], m["module_path"]))
    return [[path for _, path in sorted(children[it])] for it in sorted(children)]


def test_each_root_module_call_of_an_inference_loop_is_one_iteration() -> None:
    model, x = _mlp()
    transform = torch.nn.ReLU()  # called first, outside the model: not the root
    sink = InMemorySink()
    session = _session(sink)
    with torch.no_grad():
        for _ in range(6):
            model(transform(x))
    meta = session.close()
    assert meta is not None and meta["status"] == "ok", meta["status_reasons"]
    assert meta["iteration_boundary"] == "root-module-call" and meta["iterations_measured"] == 3
    table = sink.table()
    assert [s["iteration"] for s in _kind(table, "step")] == [0, 1, 2]
    assert reachable_from_root(table)
    # one model span a forward, right under the step, its three layers under it
    assert _modules_under_steps(table) == [[""]] * 3
    modules = _kind(table, "module")
    assert len(modules) == 3 * 4
    root_ids = {m["span_id"] for m in modules if m["module_path"] == ""}
    assert all(m["parent_span_id"] in root_ids for m in modules if m["module_path"] != "")


def test_without_warm_up_a_no_grad_forward_is_an_iteration_at_once() -> None:
    model, x = _mlp()
    sink = InMemorySink()
    session = _session(sink, warmup=0, iterations=2)
    with torch.no_grad():
        steps = []
        for _ in range(2):
            model(x)
            steps.append(session.done)
    meta = session.close()
    assert meta is not None and meta["status"] == "ok" and meta["iterations_measured"] == 2
    assert steps == [False, True]  # each forward ended its iteration when it returned
    assert _modules_under_steps(sink.table()) == [[""]] * 2


def test_optimizer_steps_seen_in_the_warm_up_make_the_training_boundary() -> None:
    model, x = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink = InMemorySink()
    session = _session(sink, warmup=2)
    for _ in range(6):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    meta = session.close()
    assert meta is not None and meta["status"] == "ok"
    assert meta["iteration_boundary"] == "optimizer-step"
    # an iteration runs from one step to the next: one forward and one optimizer step in each
    assert _modules_under_steps(sink.table()) == [[""]] * 3
    names = [o["name"] for o in _kind(sink.table(), "optimizer")]
    assert names.count("Optimizer.step#SGD.step") == 3


def test_an_optimizer_step_after_root_call_iterations_is_noted() -> None:
    model, x = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink = InMemorySink()
    session = _session(sink, warmup=1)
    for _ in range(2):  # gradient accumulation over more forwards than the warm-up has
        for _ in range(2):
            model(x).pow(2).mean().backward()
        opt.step()
    meta = session.close()
    assert meta is not None and meta["iteration_boundary"] == "root-module-call"
    assert any("raise --warmup past its forward passes" in e for e in meta["errors"])


def test_warm_up_steps_timed_before_the_first_optimizer_step_are_not_its_steps() -> None:
    """4 forward passes a step: the warm-up's first 4 iterations end at root-module calls until
    the first optimizer step decides the boundary; the untraced step (the replay's baseline,
    ``run.json``'s ``warmup_steps_ms``) is timed only from there on."""
    model, x = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink = InMemorySink()
    session = _session(sink, warmup=8, iterations=2)
    for _ in range(8):
        for _ in range(4):
            model(x).pow(2).mean().backward()
        opt.step()
    meta = session.close()
    assert meta is not None and meta["status"] == "ok", meta["status_reasons"]
    assert meta["iteration_boundary"] == "optimizer-step"
    assert meta["warmup_steps_dropped"] == 4  # the four forward passes before the first step
    # warm-up iterations 4..6 are optimizer steps (the 8th comes with the levels on): 3 timed
    assert len(meta["warmup_steps_ms"]) == 3
    assert _modules_under_steps(sink.table()) == [[""] * 4] * 2


def predict(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A whole request: three forward passes (the function --iteration-fn names below)."""
    with torch.no_grad():
        for _ in range(3):
            x = torch.cat([x[:, :4], model(x)], dim=1)
    return x


def test_each_call_of_the_named_function_is_one_iteration() -> None:
    model, x = _mlp()
    sink = InMemorySink()
    before = predict
    session = _session(sink, iteration_fn=f"{__name__}.predict")
    assert predict is not before  # wrapped while the session measures
    for _ in range(5):
        predict(model, x)
    assert predict is before  # and put back once it has measured
    meta = session.close()
    assert meta is not None and meta["status"] == "ok", meta["status_reasons"]
    assert meta["iteration_boundary"] == f"function:{__name__}.predict"
    assert _modules_under_steps(sink.table()) == [["", "", ""]] * 3


def test_a_named_function_that_is_never_called_says_so(tmp_path: Path) -> None:
    model, x = _mlp()
    session = Session(
        "M",
        iterations=2,
        warmup=0,
        out=tmp_path / "M",
        device="cpu",
        auto_iterations=True,
        iteration_fn=f"{__name__}.predict",
    ).start()
    model(x)
    meta = session.close()
    assert meta is not None and meta["status"] == "error"
    assert meta["error"] == f"0 of 2 iterations measured: {__name__}.predict was never called"


def test_a_warm_up_longer_than_the_program_says_so(tmp_path: Path) -> None:
    model, x = _mlp()
    session = Session(
        "M", iterations=2, warmup=3, out=tmp_path / "M", device="cpu", auto_iterations=True
    ).start()
    with torch.no_grad():
        model(x)
        model(x)
    meta = session.close()
    assert meta is not None and meta["error"] == (
        "0 of 2 iterations measured: the program ran 2 iteration(s) (root-module-call), all of "
        "them warm-up (--warmup 3)"
    )


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("predict", "give MODULE.QUALNAME"),
        ("no_such_module_xsp.f", "no module of it can be imported"),
        (f"{__name__}.missing", "has no attribute 'missing'"),
    ],
)
def test_a_bad_iteration_function_is_refused_naming_it(name: str, why: str) -> None:
    session = Session("M", device="cpu", auto_iterations=True, iteration_fn=name)
    with pytest.raises(ConfigError, match=why):
        session.start()
    session.close()

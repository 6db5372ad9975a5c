"""The native capture core: what it records, what survives a dead program, how it fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from tests.fixtures import fixture_table, load_records, train
from xsp.core import store
from xsp.core.arena import read_arena
from xsp.core.errors import StoreError
from xsp.tracer.capture.session import Session

ROOT = Path(__file__).resolve().parents[1]


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(4, 8)
        self.second = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


def _train(session: Session, model: torch.nn.Module) -> None:
    train(session, model, torch.randn(5, 4))


def test_ops_modules_and_backward_nodes_come_from_the_native_callback(tmp_path: Path) -> None:
    session = Session("MF", iterations=2, warmup=1, out=tmp_path / "MF", device="cpu").start()
    _train(session, TwoLayers())
    meta = session.close() or {}
    assert meta["status"] == "ok", meta["status_reasons"]
    assert meta["arena"]["dropped_records"] == 0 and meta["arena"]["callback_errors"] == 0
    assert not (tmp_path / "MF" / "capture.arena").exists()  # stored: the raw records went
    spans = store.open_run(tmp_path / "MF").spans().to_pylist()
    addmm = [s for s in spans if s["op_name"] == "aten::addmm" and s["phase"] == "forward"]
    # per iteration, one addmm per Linear: bias [8], input [5,4], weight^T [4,8] for the first
    assert len(addmm) == 4
    first = [s for s in addmm if s["module_path"] == "first"]
    assert {s["input_shapes"] for s in first} == {"[[8],[5,4],[4,8],[],[]]"}
    assert all(s["input_dtypes"].startswith("float,float,float") for s in first)
    layers = {
        (s["module_path"], s["input_shapes"], s["output_shapes"])
        for s in spans
        if s["kind"] == "module"
    }
    assert ("second", "[[5,8]]", "[[5,2]]") in layers
    # AddmmBackward0 of each Linear is attributed to that layer through its sequence number
    backward = [s for s in spans if s["kind"] == "backward" and "AddmmBackward0" in s["name"]]
    assert sorted(s["module_path"] for s in backward) == ["first", "first", "second", "second"]
    assert all(s["phase"] == "backward" for s in backward)


class Pair(torch.nn.Module):
    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> Any:
        return (x, [torch.zeros(3, 5)], {"scale": scale})


class CallsPair(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pair = Pair()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.pair(x, scale=torch.ones(7))  # a keyword argument
        self.pair((x, x))  # one argument that is a tuple of tensors
        return x


def test_module_shapes_reach_keyword_arguments_and_nested_outputs(tmp_path: Path) -> None:
    session = Session("MF", iterations=2, warmup=0, out=tmp_path / "MF", device="cpu").start()
    model = CallsPair()
    for _ in range(2):
        with session.iteration():
            model(torch.ones(2, 4))
    assert (session.close() or {})["status"] == "ok"
    calls = [
        (s["iteration"], s["input_shapes"], s["output_shapes"])
        for s in store.open_run(tmp_path / "MF").spans().to_pylist()
        if s["kind"] == "module" and s["module_path"] == "pair"
    ]
    # the second iteration takes the first's by position; a None in the dict is no tensor
    assert sorted(calls) == [
        (i, inputs, outputs)
        for i in (0, 1)
        for inputs, outputs in (
            ("[[2,4],[2,4]]", "[[2,4],[2,4],[3,5]]"),
            ("[[2,4],[7]]", "[[2,4],[3,5],[7]]"),
        )
    ]


def test_a_run_without_op_shapes_stores_its_spans_without_them(tmp_path: Path) -> None:
    out = tmp_path / "MF"
    session = Session("MF", iterations=2, warmup=1, out=out, device="cpu", op_shapes=False)
    _train(session.start(), TwoLayers())
    meta = session.close() or {}
    assert meta["status"] == "ok", meta["status_reasons"]
    spans = store.open_run(out).spans().to_pylist()
    addmm = [s for s in spans if s["op_name"] == "aten::addmm" and s["phase"] == "forward"]
    assert len(addmm) == 4 and {s["module_path"] for s in addmm} == {"first", "second"}
    assert all(s["input_shapes"] is None and s["output_shapes"] is None for s in spans)


class SecondStepDiffers(TwoLayers):
    """TwoLayers whose third call (the second measured iteration, after the traced warm-up)
    runs one op more."""

    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x * 2 if self.calls == 3 else x)


def test_op_shapes_come_from_the_first_iteration_and_reach_those_that_ran_its_ops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def first_layer_shapes(every: bool) -> tuple[list[Any], dict[str, Any]]:
        monkeypatch.setenv("XSP_OP_SHAPES", "every" if every else "first")
        out = tmp_path / ("every" if every else "first")
        session = Session("MF", iterations=3, warmup=1, out=out, device="cpu").start()
        _train(session, SecondStepDiffers())
        meta = session.close() or {}
        assert meta["status"] == "ok", meta["status_reasons"]
        spans = store.open_run(out).spans().to_pylist()
        first = [s for s in spans if s["module_path"] == "first" and s["phase"] == "forward"]
        addmm = {s["iteration"]: s["input_shapes"] for s in first if s["op_name"] == "aten::addmm"}
        calls = {s["iteration"]: s for s in first if s["kind"] == "module"}
        shapes = [(addmm[i], calls[i]["input_shapes"], calls[i]["output_shapes"]) for i in range(3)]
        return shapes, meta

    # the layer's addmm (bias, input, weight^T) and the call's argument and output; iteration 1
    # ran an extra aten::mul: nothing to copy from, so no shapes, and run.json says so;
    # iteration 2 ran iteration 0's ops and modules and has its shapes
    recorded = ("[[8],[5,4],[4,8],[],[]]", "[[5,4]]", "[[5,8]]")
    shapes, meta = first_layer_shapes(every=False)
    assert shapes == [recorded, (None, None, None), recorded]
    assert meta["iterations_without_op_shapes"] == 1
    shapes, meta = first_layer_shapes(every=True)
    assert shapes == [recorded] * 3
    assert "iterations_without_op_shapes" not in meta


def test_shapes_are_not_copied_to_an_iteration_whose_batch_differs_and_counters_do_not_matter(
    tmp_path: Path,
) -> None:
    # batches of 5, 5 and 3 rows, each iteration inside a range numbered like torch.profiler's
    # ProfilerStep#N: iteration 1 takes iteration 0's shapes (the number is not compared); the
    # last, smaller batch ran the same ops, but its root call's argument says [3,4]: it keeps none
    session = Session("MF", iterations=3, warmup=1, out=tmp_path / "MF", device="cpu").start()
    model = TwoLayers()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = iter([torch.randn(5, 4), torch.randn(5, 4), torch.randn(5, 4), torch.randn(3, 4)])
    step = 0
    while not session.done:
        with session.iteration(), torch.autograd.profiler.record_function(f"ProfilerStep#{step}"):
            optimizer.zero_grad()
            model(next(batches)).sum().backward()
            optimizer.step()
        step += 1
    meta = session.close() or {}
    assert meta["status"] == "ok", meta["status_reasons"]
    spans = store.open_run(tmp_path / "MF").spans().to_pylist()
    addmm = {
        s["iteration"]: s["input_shapes"]
        for s in spans
        if s["op_name"] == "aten::addmm" and s["module_path"] == "first" and s["phase"] == "forward"
    }
    assert addmm == {0: "[[8],[5,4],[4,8],[],[]]", 1: "[[8],[5,4],[4,8],[],[]]", 2: None}
    root = {
        s["iteration"]: s["input_shapes"]
        for s in spans
        if s["kind"] == "module" and s["module_path"] == ""
    }
    assert root == {0: "[[5,4]]", 1: "[[5,4]]", 2: "[[3,4]]"}  # recorded every iteration
    assert meta["iterations_without_op_shapes"] == 1


FINISHING_SCRIPT = """
import sys
import torch
from xsp.tracer.capture.session import Session
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
session = Session("MF", iterations=2, warmup=1, out=sys.argv[1], device="cpu").start()
while not session.done:
    with session.iteration():
        model(torch.randn(5, 4)).sum().backward()
assert session.close()["status"] == "ok"
print("pandas" in sys.modules)
"""


def test_the_finish_imports_no_pandas(tmp_path: Path) -> None:
    """pyarrow's pa.array, pa.scalar and to_numpy import pandas to ask whether their input is a
    pandas object: 0.35 s of the finish and 41 MB of the traced process on the dev machine."""
    pytest.importorskip("pandas", reason="pandas is not installed: nothing could import it")
    done = subprocess.run(
        [sys.executable, "-c", FINISHING_SCRIPT, str(tmp_path / "MF")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_trace_ids_hashed_natively_are_the_stored_ones() -> None:
    """A continuous session's exporter hashes one trace id a request in the native core, without
    the interpreter lock: the same BLAKE2b-128 ids as ``trace_id_for``, for run ids and levels
    whose text crosses BLAKE2b's 128-byte blocks."""
    from xsp.core import schema
    from xsp.tracer.native.build import load

    iterations = [0, 7, 10, 99_999, 2**40]
    for run_id in ("", "r" * 32, "r" * 120, "r" * 124, "r" * 125, "r" * 250, "r" * 300):
        hashed = load().trace_ids(f"{run_id}/MF/".encode(), np.array(iterations, np.int64))
        expected = b"".join(schema.trace_id_for(run_id, "MF", i) for i in iterations)
        assert hashed == expected, len(run_id)


def test_a_second_session_in_one_process_records_afresh(tmp_path: Path) -> None:
    for run in ("a", "b"):
        session = Session("MF", iterations=1, warmup=0, out=tmp_path / run, device="cpu").start()
        _train(session, TwoLayers())
        assert (session.close() or {})["status"] == "ok"
    counts = [
        sum(1 for s in store.open_run(tmp_path / r).spans().to_pylist() if s["kind"] == "module")
        for r in ("a", "b")
    ]
    assert counts == [3, 3]  # the model and its two layers, once each


DYING_SCRIPT = """
import os, signal, sys
import torch
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(5, 4)
for i in range(10):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    if i == 3:
        sys.stdout.flush()
        if sys.argv[1] == "exit":
            os._exit(7)
        os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize(("how", "ended"), [("exit", "exited with 7"), ("kill", "SIGKILL")])
def test_iterations_finished_before_the_program_died_are_stored(
    tmp_path: Path, how: str, ended: str
) -> None:
    script = tmp_path / "dies.py"
    script.write_text(textwrap.dedent(DYING_SCRIPT))
    out = tmp_path / "run"
    command = [sys.executable, "-m", "xsp", "run", "--levels", "MF", "--iterations", "8"]
    command.append("--no-interleave")  # every step a traced iteration: four before the death
    done = subprocess.run(
        [*command, "--warmup", "0", "--out", str(out), "--", "python", str(script), how],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode != 0
    for levels in ("MF",):
        meta = json.loads((out / levels / "run.json").read_text())
        assert meta["status"] == "partial" and meta["recovered"] is True
        assert any(ended in r for r in meta["status_reasons"]), meta["status_reasons"]
        # four optimizer steps happened, each ending an iteration (the first began at the first
        # module call); the fifth iteration never began
        assert meta["iterations_measured"] == 4
        spans = store.open_run(out / levels).spans().to_pylist()
        assert sorted(s["iteration"] for s in spans if s["kind"] == "step") == [0, 1, 2, 3]
        assert not (out / levels / "capture.arena").exists()
    framework = store.open_run(out / "MF").spans().to_pylist()
    assert sum(1 for s in framework if s["kind"] == "module" and s["module_path"] == "0") == 4
    # the allocator events of those iterations are kept too (the optimizer's state, the grads)
    memory = pq.read_table(out / "MF" / "memory.parquet").to_pylist()
    assert len(memory) == meta["memory_events"] > 0
    assert {e["iteration"] for e in memory} <= {0, 1, 2, 3}


def test_a_missing_compiler_is_one_line(tmp_path: Path) -> None:
    code = (
        "from xsp.tracer.native.build import load\n"
        "try:\n    load()\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    env = dict(os.environ, CXX="/nonexistent/c++", XSP_NATIVE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert done.stdout.strip() == (
        "NativeBuildError xsp's native capture needs a C++ compiler and none was found "
        "(/nonexistent/c++): install g++ or set CXX"
    )


def test_a_truncated_arena_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "capture.arena"
    bad.write_bytes(b"XSPARENA" + b"\0" * 20)
    with pytest.raises(StoreError, match="is truncated"):
        read_arena(bad)
    bad.write_bytes(b"NOTANARENA" * 100)
    with pytest.raises(StoreError, match="not an xsp capture arena"):
        read_arena(bad)


# -- real captures recorded with the native path on the H200 (tests/record_fixture.py) ----------


def test_native_cuda_capture_joins_every_api_call_to_its_op_by_id() -> None:
    records, _ = load_records("resnet18_train_mflg_cuda_native")
    api = records["L"]
    table, report = _convert("resnet18_train_mflg_cuda_native", "MFLG")
    assert report.api_ops_by_id / (report.api_ops_by_id + report.api_ops_by_time) >= 0.999
    # every API call outside a cuBLAS/cuDNN range hangs under its op by id, none by time
    assert (report.api_ops_by_id, report.api_ops_by_time) == (90, 0)
    assert len(np.nonzero(np.asarray(api.external_id))[0]) >= report.api_ops_by_id
    rows = {r["span_id"]: r for r in table.to_pylist()}
    kernels = [r for r in rows.values() if r["kind"] == "kernel"]
    recorded = [k for k in records["G"].kind if k == 0]
    assert len(kernels) == len(recorded) == 324  # every kernel CUPTI recorded in the iteration

    def ancestors(span: dict) -> list[str]:
        kinds = []
        while span["parent_span_id"]:
            span = rows[span["parent_span_id"]]
            kinds.append(span["kind"])
        return kinds

    chains = [ancestors(k) for k in kernels]
    assert all(c[0] in ("runtime", "driver") for c in chains)  # under its launch call
    assert all({"op", "backward", "optimizer"} & set(c) for c in chains)  # and under its op


def test_native_capture_attributes_backward_nodes_to_forward_layers() -> None:
    table = fixture_table("resnet18_train_mf_cuda_native", "MF")
    backward = [
        r
        for r in table.to_pylist()
        if r["kind"] == "backward" and "AccumulateGrad" not in r["name"]
    ]
    assert len(backward) > 50
    # all but the loss's two nodes (cross-entropy runs outside the model) reach their layer
    outside = sorted(r["name"].rsplit(" ", 1)[-1] for r in backward if r["module_path"] is None)
    assert outside == ["LogSoftmaxBackward0", "NllLossBackward0"]
    convs = [r for r in backward if "ConvolutionBackward0" in r["name"]]
    assert len(convs) == 20 and all(r["module_type"] == "Conv2d" for r in convs)


def _convert(scenario: str, levels: str):  # type: ignore[no-untyped-def]
    from xsp.tracer.convert.spans import build_table

    records, _ = load_records(scenario)
    return build_table("run-n", levels, records)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the H200)")
def test_gpu_kernel_counts_equal_cuptis_own(tmp_path: Path) -> None:
    from tests.fixtures import plain_cupti_kernels
    from xsp.tracer.workloads import zoo

    workload = zoo.build("torchvision:resnet18", 4, "train", "cuda")
    for _ in range(3):  # as tests/test_gpu_checks.py: cuDNN has chosen its algorithms by then
        workload.step()
    reference = plain_cupti_kernels(workload, 2)
    session = Session("MFLG", iterations=2, warmup=1, out=tmp_path / "g", device="cuda").start()
    while not session.done:
        with session.iteration():
            workload.step()
    meta = session.close() or {}
    assert meta["status"] == "ok", meta["status_reasons"]
    spans = store.open_run(tmp_path / "g").spans().to_pylist()
    per_iteration = [
        sum(1 for s in spans if s["kind"] == "kernel" and s["iteration"] == i) for i in (0, 1)
    ]
    # xsp puts a kernel in its launch call's iteration; the reference splits CUPTI's kernels by
    # time, which on the H200 moved 17 of ResNet-18 b4's 690 kernels across the boundary
    # ([328, 361] against xsp's [345, 345]): the totals, every kernel CUPTI saw, must agree
    assert per_iteration[0] == per_iteration[1] and sum(per_iteration) == sum(reference)
    assert meta["api_ops"]["by_correlation_id_pct"] >= 99.9


def test_each_layer_allocations_come_from_the_allocator(tmp_path: Path) -> None:
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.tables import memory

    session = Session("MF", iterations=2, warmup=1, out=tmp_path / "MF", device="cpu").start()
    _train(session, TwoLayers())
    meta = session.close() or {}
    assert meta["memory_events"] > 0
    rows = {r["layer"]: r for r in memory.layer_memory(MeasurementStore(tmp_path)).to_pylist()}
    first = rows["first"]
    # forward: the [5,8] output; backward (AddmmBackward0, attributed to the layer): the weight's
    # [8,4] and the bias's [8] gradients; float32 throughout
    assert first["layer_type"] == "Linear" and first["device"] == "cpu"
    assert first["allocations_per_iteration"] == 3
    assert first["allocated_bytes_per_iteration"] == 4 * (5 * 8 + 8 * 4 + 8)
    by_type = {
        r["layer_type"]: r for r in memory.layer_type_memory(MeasurementStore(tmp_path)).to_pylist()
    }
    linear = by_type["Linear"]["allocated_bytes_per_iteration"]
    assert (
        linear
        == first["allocated_bytes_per_iteration"] + rows["second"]["allocated_bytes_per_iteration"]
    )


def test_loader_workers_record_nothing_and_batches_say_their_settings(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 2))
    session = Session("MF", iterations=3, warmup=0, out=tmp_path / "MF", device="cpu").start()
    model = TwoLayers()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = iter(DataLoader(data, batch_size=4, num_workers=2, pin_memory=True))
    while not session.done:
        with session.iteration():
            x, y = next(batches)  # the workers are forked children: they must not write
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            loss.item()  # a sync after the step
    meta = session.close() or {}
    assert meta["status"] == "ok" and meta["arena"]["callback_errors"] == 0
    spans = store.open_run(tmp_path / "MF").spans().to_pylist()
    loading = [s for s in spans if s["kind"] == "data_loading"]
    assert len(loading) == 3
    # pin_memory=True pins nothing without an accelerator; the span says what happened
    memory = "pinned" if torch.cuda.is_available() else "pageable"
    assert {(s["data_workers"], s["data_memory"]) for s in loading} == {(2, memory)}
    assert all(
        s["name"] == "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
        for s in loading
    )


def test_host_work_around_the_layers_and_the_step_is_phase_host(tmp_path: Path) -> None:
    session = Session("MF", iterations=2, warmup=1, out=tmp_path / "MF", device="cpu").start()
    model = TwoLayers()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = torch.randn(5, 4, dtype=torch.float64)
    while not session.done:
        with session.iteration():
            x = batch.float()  # before the first layer call: the batch's conversion
            optimizer.zero_grad()
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
            loss.item()  # after the step: a sync
    assert (session.close() or {})["status"] == "ok"
    spans = store.open_run(tmp_path / "MF").spans().to_pylist()
    top = {s["span_id"] for s in spans if s["kind"] == "step"}
    phases = {(s["op_name"], s["phase"]) for s in spans if s["parent_span_id"] in top}
    assert ("aten::_to_copy", "host") in phases or ("aten::to", "host") in phases
    assert ("aten::item", "host") in phases
    assert ("aten::sum", "forward") in phases  # between the layers and the step: forward


def test_torch_compile_gets_no_graph_break_or_recompile_from_f(tmp_path: Path) -> None:
    from tests.fixtures import dynamo_counts

    torch._dynamo.reset()
    model = torch.compile(TwoLayers(), backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 4)

    def step() -> None:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    for _ in range(3):
        step()
    before = dynamo_counts()
    session = Session("MF", iterations=3, warmup=0, out=tmp_path / "MF", device="cpu").start()
    while not session.done:
        with session.iteration():
            step()
    assert (session.close() or {})["status"] == "ok"
    after = dynamo_counts()
    assert after == before  # no graph break, graph, frame or recompile added by level F
    names = {s["name"] for s in store.open_run(tmp_path / "MF").spans().to_pylist()}
    assert "Torch-Compiled Region: 0/0" in names  # the compiled region is a span

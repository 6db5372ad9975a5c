"""CUDA graphs: a kernel a graph replays takes the layer and phase of the op that made its node.

A small CNN trained with its forward and backward captured by ``torch.cuda.make_graphed_callables``
must show the same kernels per layer and phase as the same CNN trained eagerly. The CPU tests
convert two H200 recordings, made with the levels on at the capture (``python
tests/record_fixture.py --cuda-graphs graphed|eager --iterations 2 --out
tests/data/small_cnn_<graphed|eager>_mflg_cuda/raw.json``); the GPU test runs both through a
session, whose levels come on when the program begins its capture (before its loop).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.fixtures import fixture_table, in_fresh_process

ROOT = Path(__file__).resolve().parents[1]
ITERATIONS = 2


class SmallCnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean(dim=(2, 3)))


def layer_kernels(rows: list[dict[str, Any]]) -> dict[str, list[tuple[str, int]]]:
    """Per "<layer> <phase>", the kernels (name, count) of the layers' own modules."""
    per: dict[str, Counter[str]] = {}
    for row in rows:
        if row["kind"] == "kernel" and row["module_path"]:
            per.setdefault(f"{row['module_path']} {row['phase']}", Counter())[row["name"]] += 1
    return {key: sorted(counter.items()) for key, counter in sorted(per.items())}


def _rows(scenario: str) -> list[dict[str, Any]]:
    return list(fixture_table(scenario, "MFLG").to_pylist())


def test_replayed_kernels_take_their_nodes_layers_and_phases() -> None:
    graphed = _rows("small_cnn_graphed_mflg_cuda")
    eager = _rows("small_cnn_eager_mflg_cuda")
    by_layer = layer_kernels(graphed)
    assert by_layer == layer_kernels(eager)
    # each of the five layers, forward and backward (conv1's backward computes no input grad)
    assert {key.split()[0] for key in by_layer} == {"conv1", "bn1", "conv2", "bn2", "fc"}
    assert {key.split()[1] for key in by_layer} == {"forward", "backward"}


def test_every_replayed_kernel_names_its_node_and_the_op_that_made_it() -> None:
    rows = _rows("small_cnn_graphed_mflg_cuda")
    by_id = {row["span_id"]: row for row in rows}
    replayed = [row for row in rows if row["graph_node"] is not None]
    launched = [row for row in rows if row["kind"] == "kernel" and row["graph_node"] is None]
    assert replayed and all(row["kind"] == "kernel" for row in replayed)
    assert len(replayed) % ITERATIONS == 0  # the same graphs replay each iteration
    assert all(row["graph_op"] for row in replayed)
    # they hang under the graph launch that replayed them
    assert {by_id[row["parent_span_id"]]["name"] for row in replayed} == {"cudaGraphLaunch"}
    # the optimizer's kernels are launched, not replayed: make_graphed_callables graphs the model
    assert {row["phase"] for row in launched if row["module_path"] is None} >= {"optimizer"}


def test_eager_kernels_have_no_graph_node() -> None:
    rows = _rows("small_cnn_eager_mflg_cuda")
    assert all(row["graph_node"] is None and row["graph_op"] is None for row in rows)


def graph_session_check(graphed: bool) -> dict[str, Any]:
    """The CNN trained in a session (MFLG, 3 warm-up iterations) that is started before the
    program captures its graphs; the kernels per layer and the run's counts."""
    from xsp.tracer.capture.hooks.cupti import nvtx_environment

    os.environ.update(nvtx_environment())
    from xsp.tracer.capture.session import Session
    from xsp.tracer.export.sinks import InMemorySink

    torch.manual_seed(0)
    model = SmallCnn().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 3, 16, 16, device="cuda")
    # a contiguous output gradient, as the graphed backward's static one is (``.sum().backward()``
    # would give an expanded one, which cuBLAS multiplies with other kernels after a copy)
    grad = torch.ones(8, 10, device="cuda")
    sink = InMemorySink()
    session = Session("MFLG", iterations=ITERATIONS, warmup=3, sinks=[sink], device="cuda")
    session.start()
    if graphed:
        model = torch.cuda.make_graphed_callables(model, (x,))
    while not session.done:
        with session.iteration():
            optimizer.zero_grad(set_to_none=True)
            model(x).backward(grad)
            optimizer.step()
    meta = session.close() or {}
    return {
        "layers": layer_kernels(sink.table().to_pylist()),
        "status": meta.get("status"),
        "errors": meta.get("errors"),
        "graph_kernels": meta.get("graph_kernels"),
        "levels_on_early": meta.get("levels_on_early"),
    }


def _fresh(graphed: bool) -> dict[str, Any]:
    return dict(in_fresh_process("tests.test_cuda_graphs", "graph_session_check", graphed=graphed))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the H200)")
def test_a_graphed_model_in_a_session_shows_the_kernels_of_the_eager_one() -> None:
    graphed, eager = _fresh(True), _fresh(False)
    print(json.dumps({"graphed": graphed, "eager": eager}))
    assert graphed["status"] == "ok", graphed["errors"]
    assert "CUDA graph capture" in (graphed["levels_on_early"] or "")
    counts = graphed["graph_kernels"]
    assert counts["replayed"] > 0
    assert counts["attributed_to_their_node"] == counts["replayed"]
    assert graphed["layers"] == eager["layers"]
    assert eager["graph_kernels"] is None


def test_nodes_made_by_a_compiled_graphs_library_calls_take_those_calls_modules() -> None:
    """A captured compiled graph runs no module calls: its wrapper's aten::convolution (nodes
    11 and 12: a cuDNN kernel and its reformat) and aten::addmm (node 13) made nodes with the
    compiled root's module (0) or none. In capture 1 the calls run in the compiled graph's
    order and take its modules by position; node 14 (made by aten::zero_, no extern call) is
    left to its own attribution."""
    from xsp.core.records import ExternGraph, GraphNodes
    from xsp.tracer.convert.graphs import extern_modules

    capture = 1 << 32
    nodes = GraphNodes()
    for node, op, call, instance, module in [
        (11, "aten::cudnn_convolution", "aten::convolution", capture | 1, -1),
        (12, "aten::cudnn_convolution", "aten::convolution", capture | 1, -1),
        (13, "aten::addmm", "aten::addmm", capture | 3, 0),
        (14, "aten::zero_", "aten::zero_", capture | 2, -1),
    ]:
        nodes.op[node], nodes.call[node], nodes.instance[node] = op, call, instance
        nodes.module[node], nodes.phase[node] = module, "forward"
    graphs = [
        ExternGraph("0/0", "forward", [("aten::convolution", ["conv1"]), ("aten::addmm", ["fc"])]),
        ExternGraph("1/0", "backward", [("aten::convolution_backward", ["conv1"])]),
    ]
    assert extern_modules(nodes, graphs) == {11: "conv1", 12: "conv1", 13: "fc"}
    assert extern_modules(nodes, []) == {}


def test_a_compiled_graph_captured_whole_shows_the_layers_of_its_launched_run() -> None:
    """The small CNN compiled for inference, ``reduce-overhead`` (inductor's CUDA graph trees
    capture the graph; every kernel is replayed) against ``default`` (launched): the same
    kernels on the same modules. The library kernels (conv1's cuDNN convolution, fc's cuBLAS
    GEMM) reach their layers through the compiled graph's extern calls, which the capture's
    aten::convolution and aten::addmm made their nodes in."""

    def by_module(scenario: str, replayed: bool) -> Counter[tuple[str, str]]:
        return Counter(
            (row["module_path"], row["name"])
            for row in _rows(scenario)
            if row["kind"] == "kernel" and (row["graph_node"] is not None) == replayed
        )

    captured = by_module("small_cnn_compiled_reduce_overhead_mflg_cuda", replayed=True)
    launched = by_module("small_cnn_compiled_default_mflg_cuda", replayed=False)
    assert captured == launched and sum(captured.values()) == 9 * ITERATIONS
    layers = {path for path, name in captured if not name.startswith("triton_")}
    assert layers == {"_orig_mod.conv1", "_orig_mod", "_orig_mod.fc"}  # fc's GEMM, convs'
    assert all(path for path, _ in captured)  # no replayed kernel without a layer

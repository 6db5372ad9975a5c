"""Compiled models: generated kernels are attributed to the modules inductor built them from."""

from __future__ import annotations

import sys
import tempfile
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from tests.fixtures import train
from xsp.core import store
from xsp.core.records import ExternGraph
from xsp.core.store import open_measurement
from xsp.tracer.capture.hooks.inductor import module_path, resolve
from xsp.tracer.capture.session import Session
from xsp.tracer.convert.compiled import attribute, attribute_calls, common_module, pass_down
from xsp.tracer.run.environment import COMPILE_CACHE_ENV
from xsp.tracer.run.runner import LeveledSpec, run_leveled
from xsp.tracer.spec import ProfileSpec

ROOT = Path(__file__).resolve().parents[1]


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.act = torch.nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.lin(x)))


def test_dynamo_module_paths_read_as_named_modules_spells_them() -> None:
    assert module_path("L['self'].layer1[0]._modules['conv1']") == "layer1.0.conv1"
    assert module_path("L['fn'].1.norm") == "1.norm"
    assert module_path("L['self']") == ""
    assert resolve("1.norm", ["", "_orig_mod", "_orig_mod.1.norm", "x._orig_mod.1.norm"]) == (
        "_orig_mod.1.norm"
    )
    assert common_module(["a.0.norm", "a.0.act"]) == "a.0"
    assert common_module(["a.0.norm", "b"]) == ""


def test_a_reused_kernel_takes_its_definitions_in_launch_order_when_counts_agree() -> None:
    sources = {
        "forward k_0": [["m.0.norm", "m.0.act"], ["m.1.norm"]],
        "backward k_1": [["m.0"], ["m.1"]],
    }
    names = ["k_0", "k_0", "k_1", "other", "k_0"]
    phases = ["forward", "forward", "backward", "forward", "forward"]
    regions = np.array([7, 7, 8, 7, 9])  # row 4 ran alone in another region run
    start = np.array([20, 10, 30, 40, 50])
    paths = pa.array(["m", "m", "m", "m", "m"]).dictionary_encode()
    out = attribute(paths, names, phases, regions, start, sources).cast(pa.string()).to_pylist()
    # rows 1 then 0 by start; the backward one and row 4 do not match their counts: the union
    assert out == ["m.1.norm", "m.0", "m", "m", "m"]


def test_compiled_cpu_kernels_are_spans_of_their_source_modules(tmp_path: Path) -> None:
    torch.manual_seed(0)
    session = Session("MF", iterations=2, warmup=1, out=tmp_path / "MF", device="cpu").start()
    train(session, torch.compile(torch.nn.Sequential(Block(), Block())), torch.randn(4, 16))
    meta = session.close() or {}
    assert meta["status"] == "ok", meta["status_reasons"]
    spans = store.open_run(tmp_path / "MF").spans().to_pylist()
    kernels = [s for s in spans if s["iteration"] == 0 and s["name"].startswith("graph_")]
    forward = [s["module_path"] for s in kernels if s["phase"] == "forward"]
    # one fused layer-norm + GELU kernel, reused by both blocks, each launch to its own block
    assert sorted(forward) == ["_orig_mod.0", "_orig_mod.1"]
    backward = {s["module_path"] for s in kernels if s["phase"] == "backward"}
    assert "_orig_mod.0.lin" in backward  # the first Linear's bias gradient (a sum)
    # the compiled region itself still runs in the model's layer
    region = [s for s in spans if s["iteration"] == 0 and s["name"] == "CompiledFunction"]
    assert [s["module_path"] for s in region] == [""]


def test_extern_ops_take_the_calls_of_the_graph_that_makes_them_else_match_by_name() -> None:
    graphs = [
        ExternGraph("0/0", "forward", [("aten::mm", ["a.fc"]), ("aten::addmm", ["a.out"])]),
        ExternGraph("1/0", "forward", [("aten::addmm", ["b.fc"]), ("aten::mm", ["b.out"])]),
        ExternGraph("1/0", "backward", [("aten::mm", ["a.fc"]), ("aten::mm", ["a.out"])]),
        ExternGraph("2/0", "backward", [("aten::mm", ["c.fc"])]),
        ExternGraph("3/0", "backward", [("aten::mm", ["d.fc"])]),
    ]
    names = ["region", "aten::mm", "aten::addmm", "aten::mm", "aten::addmm", "aten::mm",
             "aten::mm", "aten::mm", "aten::mm", "aten::mm"]  # fmt: skip
    phases = ["forward"] * 5 + ["backward"] * 2 + ["forward"] * 2 + ["backward"]
    # runs of a region: rows 1-2 (graph 0's calls, its frame unknown), 3-4 (frame 1/0's:
    # row 4 first), 5-6 (frame 3/0's backward, not what the ops match by name), 7-8 (two mm
    # in no graph's order, frame unknown: the two forward mm by name), 9 (one backward mm,
    # frame unknown: two graphs make just that, so the module holding both, the root); row 10
    # is an eager mm outside every region
    names.append("aten::mm")
    phases.append("forward")
    parent = np.array([-1, 0, 0, 20, 20, 30, 30, 40, 40, 50, 60])
    in_region = np.array([False] + [True] * 9 + [False])
    frames = [None, None, None, "1/0", "1/0", "3/0", "3/0", None, None, None, None]
    start = np.arange(11)
    start[3], start[4] = 5, 4
    paths = pa.array(["m"] * 11).dictionary_encode()
    out = attribute_calls(paths, names, phases, parent, in_region, frames, start, graphs)
    assert out.cast(pa.string()).to_pylist() == [
        "m", "a.fc", "a.out", "b.out", "b.fc", "d.fc", "d.fc", "a.fc", "b.out", "m", "m"
    ]  # fmt: skip


def test_what_ran_inside_a_reattributed_op_follows_it() -> None:
    # 0 region > 1 op > 2 child > 3 grandchild; 4 a module range of its own under 1
    before = pa.array(["", "", "", "", "x"]).dictionary_encode()
    after = pa.array(["", "fc1", "", "", "x"]).dictionary_encode()
    out = pass_down(before, after, np.array([-1, 0, 1, 2, 1]))
    assert out.cast(pa.string()).to_pylist() == ["", "fc1", "fc1", "fc1", "x"]


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 4, 3)
        self.fc1 = torch.nn.Linear(4 * 6 * 6, 8)
        self.fc2 = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def test_compiled_library_ops_are_spans_of_their_layers_forward_and_backward(
    tmp_path: Path,
) -> None:
    """Inductor calls the matmuls and convolutions of a compiled model as aten ops (oneDNN, MKL
    on CPU; cuBLAS, cuDNN on GPU): each lands on its layer, with what ran inside it."""
    torch.manual_seed(0)
    session = Session("MF", iterations=1, warmup=1, out=tmp_path / "MF", device="cpu").start()
    model = torch.nn.Sequential(torch.compile(ConvNet()), torch.nn.Linear(2, 2))  # eager head
    train(session, model, torch.randn(2, 3, 8, 8))
    meta = session.close() or {}
    assert meta["status"] == "ok", meta["status_reasons"]
    spans = [s for s in store.open_run(tmp_path / "MF").spans().to_pylist() if s["iteration"] == 0]
    regions = {s["span_id"] for s in spans if s["name"].startswith("CompiledFunction")}
    called = [
        s
        for s in spans
        if s["parent_span_id"] in regions and s["kind"] == "op" and s["name"].startswith("aten::")
    ]
    placed = Counter((s["module_path"], s["phase"], s["name"]) for s in called)
    root = "0._orig_mod"
    # a layer's forward is one op; a Linear's backward two mm (input and weight gradients), the
    # convolution's one (its input needs no gradient)
    assert {k: n for k, n in placed.items() if k[0].startswith(root + ".")} == {
        (f"{root}.conv1", "forward", "aten::convolution"): 1,
        (f"{root}.fc1", "forward", "aten::addmm"): 1,
        (f"{root}.fc2", "forward", "aten::addmm"): 1,
        (f"{root}.conv1", "backward", "aten::convolution_backward"): 1,
        (f"{root}.fc1", "backward", "aten::mm"): 2,
        (f"{root}.fc2", "backward", "aten::mm"): 2,
    }
    # what stays at the compiled model's layer is the wrapper's own buffer work
    assert {k[2] for k in placed if not k[0].startswith(root + ".")} <= {
        "aten::empty_strided",
        "aten::copy_",
    }
    # oneDNN's convolution inside aten::convolution follows it; the eager head keeps its layer
    assert {s["module_path"] for s in spans if s["name"] == "aten::mkldnn_convolution"} == {
        f"{root}.conv1"
    }
    assert {s["module_path"] for s in spans if s["name"] == "aten::addmm"} == {
        f"{root}.fc1",
        f"{root}.fc2",
        "1",
    }


class Broken(torch.nn.Module):
    """Two Linear layers that dynamo compiles as two frames, each graph with one addmm."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 8)
        self.fc2 = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x))
        torch._dynamo.graph_break()
        return self.fc2(x)


def test_graphs_of_a_graph_break_are_told_apart_by_their_frames(tmp_path: Path) -> None:
    """Each graph's calls are the same (one addmm forward): the compiled frame each run is in
    (its forward's, for a backward run) says which graph it runs."""
    session = Session("MF", iterations=1, warmup=1, out=tmp_path / "MF", device="cpu").start()
    train(session, torch.compile(Broken()), torch.randn(2, 8))
    meta = session.close() or {}
    assert meta["status"] == "ok", meta["status_reasons"]
    spans = [s for s in store.open_run(tmp_path / "MF").spans().to_pylist() if s["iteration"] == 0]
    placed = Counter((s["module_path"], s["phase"], s["name"]) for s in spans)
    assert {k: n for k, n in placed.items() if k[2] in ("aten::addmm", "aten::mm")} == {
        ("_orig_mod.fc1", "forward", "aten::addmm"): 1,
        ("_orig_mod.fc2", "forward", "aten::addmm"): 1,
        ("_orig_mod.fc1", "backward", "aten::mm"): 1,  # its input needs no gradient
        ("_orig_mod.fc2", "backward", "aten::mm"): 2,
    }


TRAINS_TWO_BLOCKS = """
    import sys
    sys.path.insert(0, {root!r})
    import torch
    from tests.test_compiled import Block

    torch.manual_seed(0)
    model = torch.compile(torch.nn.Sequential(Block(), Block()))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16)
    for _ in range(3):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
"""


def test_a_later_level_set_loads_the_compiled_graphs_and_their_provenance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first level set compiles and saves to the measurement's own inductor cache; the next
    one loads both graphs (forward and backward) from there, and its kernels land on the same
    modules as a fresh compile's (test_compiled_cpu_kernels_are_spans_of_their_source_modules)."""
    monkeypatch.delenv(COMPILE_CACHE_ENV, raising=False)  # set by an earlier compile here
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the runner makes its own
    script = tmp_path / "two_blocks.py"
    script.write_text(textwrap.dedent(TRAINS_TWO_BLOCKS.format(root=str(ROOT))))
    spec = LeveledSpec(
        out=tmp_path / "R",
        profile=ProfileSpec(
            iterations=1, warmup=1, device="cpu", command=(sys.executable, str(script))
        ),
        level_sets=("M", "MF"),
    )
    result = run_leveled(spec)
    assert result.ok, result.failure
    runs = {run.levels: run for run in open_measurement(spec.out)}
    assert runs["M"].meta["inductor_cache"] == {"saved": 2, "loaded": 0}
    # the MF process runs an untraced iteration (F switched off) before its traced one: dynamo
    # never read F's switch, so nothing is compiled or loaded again for it
    assert runs["MF"].meta["inductor_cache"] == {"saved": 0, "loaded": 2}
    assert not list(tmp_path.glob("xsp-compile-*"))  # the measurement's cache is removed
    spans = [s for s in runs["MF"].spans().to_pylist() if s["iteration"] == 0]
    kernels = [s for s in spans if s["name"].startswith("graph_")]
    assert sorted(s["module_path"] for s in kernels if s["phase"] == "forward") == [
        "_orig_mod.0",
        "_orig_mod.1",
    ]
    assert "_orig_mod.0.lin" in {s["module_path"] for s in kernels if s["phase"] == "backward"}
    placed = Counter((s["module_path"], s["phase"]) for s in spans if s["name"] == "aten::addmm")
    assert placed == {("_orig_mod.0.lin", "forward"): 1, ("_orig_mod.1.lin", "forward"): 1}


class Twins(torch.nn.Module):
    """Two blocks of one code in two frames: dynamo compiles the same graph for each, which
    inductor's and AOTAutograd's own cache keys do not tell apart (their nodes' modules are
    metadata, left out of the keys)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Block()
        self.b = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        torch._dynamo.graph_break()
        return self.b(x)


def test_a_graph_of_the_same_code_from_other_modules_is_compiled_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loaded from the cache, the second block's graph would carry the first one's provenance:
    the keys xsp computes cover the modules, so it compiles, and each Linear keeps its ops."""
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path / "cache"))
    session = Session("MF", iterations=1, warmup=1, out=tmp_path / "MF", device="cpu").start()
    x = torch.randn(4, 16, requires_grad=True)  # both blocks' inputs need a gradient: one code
    train(session, torch.compile(Twins()), x)
    meta = session.close() or {}
    assert meta["status"] == "ok", meta["status_reasons"]
    spans = [s for s in store.open_run(tmp_path / "MF").spans().to_pylist() if s["iteration"] == 0]
    placed = Counter(
        (s["module_path"], s["phase"], s["name"])
        for s in spans
        if s["name"] in ("aten::addmm", "aten::mm")
    )
    assert placed == {
        ("_orig_mod.a.lin", "forward", "aten::addmm"): 1,
        ("_orig_mod.b.lin", "forward", "aten::addmm"): 1,
        ("_orig_mod.a.lin", "backward", "aten::mm"): 2,
        ("_orig_mod.b.lin", "backward", "aten::mm"): 2,
    }
    assert meta["inductor_cache"] == {"saved": 4, "loaded": 0}  # forward and backward, twice

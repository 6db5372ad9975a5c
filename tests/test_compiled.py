"""Compiled models: generated kernels are attributed to the modules inductor built them from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from tests.fixtures import train
from xsp.tracer import store
from xsp.tracer.capture.inductor import module_path, resolve
from xsp.tracer.capture.session import Session
from xsp.tracer.convert.compiled import attribute, common_module


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

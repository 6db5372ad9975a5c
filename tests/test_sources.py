"""Python source per op (issue 30): level F records each op's calling line (the innermost frame
outside torch and xsp) with the ops' shapes in the deepest level set with F, the later
iterations take it from the first, and the analyses rank the program's lines and name the line
of a host sync."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
import torch

from xsp.core.store import open_run

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """\
    import sys

    import torch


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 16)
            self.out = torch.nn.Linear(16, 1)

        def forward(self, x):
            h = torch.relu(self.fc(x))
            return self.out(h)


    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    model = Net().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8, device=device)
    for _ in range(8):  # 2 warm-up, then 3 untraced and 3 traced in the F process
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        seen = loss.item()
    """
)
#: Lines of SCRIPT (1-based): the two layer calls in forward, the loss, backward, the sync.
FC_LINE, OUT_LINE, LOSS_LINE, BACKWARD_LINE, ITEM_LINE = 13, 14, 22, 23, 26


def _path() -> str:
    """The checkout first, then the path the tests run with (the device machine's wheels)."""
    return os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])


def _measure(work: Path, levels: str, *script_args: str) -> Path:
    (work / "train.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": _path(), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "xsp", "run", "--levels", levels, "--iterations", "3",
         "--warmup", "2", "--out", "R", "--", "python", "train.py", *script_args],
        cwd=work, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return work / "R"


def _analyses(measured: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": _path()}
    done = subprocess.run(
        [sys.executable, "-m", "xsp", "analyze", str(measured), "--json"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["analyses"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _measure(tmp_path_factory.mktemp("sources"), "M,MF")


def test_each_op_carries_the_line_that_called_it(measured: Path) -> None:
    spans = open_run(measured / "MF").spans()
    ops = spans.filter(pc.equal(spans.column("kind").cast("string"), "op"))
    source = ops.column("source").cast("string").to_pylist()
    name = ops.column("op_name").cast("string").to_pylist()
    iteration = ops.column("iteration").to_pylist()
    first = [(n, s) for n, s, i in zip(name, source, iteration, strict=True) if i == 0]
    linear = [s for n, s in first if n == "aten::linear"]
    assert linear == [f"train.py:{FC_LINE} Net.forward", f"train.py:{OUT_LINE} Net.forward"]
    assert ("aten::relu", f"train.py:{FC_LINE} Net.forward") in first
    assert ("aten::square", f"train.py:{LOSS_LINE} <module>") in first
    assert ("aten::_local_scalar_dense", f"train.py:{ITEM_LINE} <module>") in first
    # the CPU's backward runs on the thread that called backward(): its line
    assert ("aten::mm", f"train.py:{BACKWARD_LINE} <module>") in first
    # every op of the later iterations took its line from the first (the same ops ran)
    later = [s for s, i in zip(source, iteration, strict=True) if i > 0]
    assert later == [s for s, i in zip(source, iteration, strict=True) if i == 0] * 2
    assert all(s is not None for s in source)


def test_analyze_ranks_the_programs_lines_and_names_the_sync(measured: Path) -> None:
    analyses = _analyses(measured)
    rows = {r["source"]: r for r in analyses["source_lines"]["rows"]}
    spans = open_run(measured / "MF").spans()
    ops = spans.filter(pc.equal(spans.column("kind").cast("string"), "op"))
    source = np.asarray(ops.column("source").cast("string").to_pylist(), dtype=object)
    for line in (FC_LINE, OUT_LINE, BACKWARD_LINE, ITEM_LINE):
        key = f"train.py:{line} " + ("Net.forward" if line < LOSS_LINE else "<module>")
        assert rows[key]["ops_per_iteration"] == np.count_nonzero(source == key) / 3
        assert rows[key]["host_ms"] > 0 and rows[key]["gpu_ms"] == 0
    syncs = [s for s in analyses["suggestions"]["rows"] if s["rule"] == "host-syncs"]
    assert syncs and syncs[0]["evidence"].endswith(f"at train.py:{ITEM_LINE} <module>")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the device machine)")
def test_a_lines_gpu_time_is_its_ops_kernels_on_the_gpu(tmp_path: Path) -> None:
    """On the GPU the forward ops' kernels count to the line that called them: the first
    layer's line holds the G durations of the kernels launched under its ops (worked out here
    from the MFLG run's parents); backward runs on autograd's device thread, without Python."""
    measured = _measure(tmp_path, "M,MF,MFLG", "cuda")
    rows = {r["source"]: r for r in _analyses(measured)["source_lines"]["rows"]}
    spans = open_run(measured / "MFLG").spans().to_pylist()
    by_id = {s["span_id"]: s for s in spans}

    def line(span: dict) -> str | None:
        while span is not None:
            if span["kind"] == "op" and span["source"]:
                return span["source"]
            if span["kind"] in ("module", "step"):
                return None
            span = by_id.get(span["parent_span_id"])
        return None

    key = f"train.py:{FC_LINE} Net.forward"
    kernels = [s for s in spans if s["level"] == "gpu" and line(s) == key]
    assert kernels and {s["phase"] for s in kernels} == {"forward"}
    assert rows[key]["gpu_ms"] > 0
    per_iteration = sum(s["dur_ns"] for s in kernels) / 3 / 1e6
    assert rows[key]["gpu_ms"] == pytest.approx(per_iteration, rel=0.5)  # G's own durations

"""GPU-only checks, run on the device machine; they skip cleanly without a GPU."""

from __future__ import annotations

import pyarrow.compute as pc

from tests.conftest import reachable_from_root
from tracer import zoo
from tracer.session import Session
from tracer.sinks import InMemorySink


def test_mf_training_on_cuda_nests_and_attributes_backward(cuda_device: str) -> None:
    workload = zoo.build("torchvision:resnet18", 4, "train", cuda_device)
    sink = InMemorySink()
    session = Session("MF", iterations=2, warmup=1, sinks=[sink], device=cuda_device).start()
    while not session.done:
        with session.iteration():
            workload.step()
    meta = session.close()
    table = sink.table()
    assert meta is not None and meta["status"] == "ok"
    assert pc.sum(pc.equal(table.column("kind"), "step")).as_py() == 2
    assert reachable_from_root(table)
    names = {n for n, _ in workload.model.named_modules()}
    paths = {p for p in table.column("module_path").to_pylist() if p is not None}
    assert paths <= names
    backward = table.filter(pc.equal(table.column("kind"), "backward"))
    attributed = backward.filter(pc.is_valid(backward.column("module_path")))
    # every conv and linear layer's gradient node is attributed to its layer
    assert {"conv1", "fc", "layer4.1.conv2"} <= set(attributed.column("module_path").to_pylist())


def test_mlg_training_hangs_every_kernel_under_its_launch(cuda_device: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A fresh process, as xsp run uses: CUPTI must not have met the PyTorch profiler before.
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tracer.store import open_measurement

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "xsp",
            "run",
            "--model",
            "torchvision:resnet18",
            "--batch-size",
            "4",
            "--mode",
            "train",
            "--levels",
            "MLG",
            "--iterations",
            "2",
            "--warmup",
            "1",
            "--device",
            cuda_device,
            "--out",
            str(tmp_path / "R"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    assert done.returncode == 0, done.stderr
    (run,) = open_measurement(tmp_path / "R")
    table = run.spans()
    assert reachable_from_root(table)
    rows = {r["span_id"]: r for r in table.to_pylist()}
    kernels = [r for r in rows.values() if r["kind"] == "kernel"]
    steps = {r["iteration"]: r for r in rows.values() if r["kind"] == "step"}
    assert kernels and len(steps) == 2
    for kernel in kernels:
        api = rows[kernel["parent_span_id"]]
        assert api["level"] == "library" and api["correlation_id"] == kernel["correlation_id"]
        step = steps[kernel["iteration"]]
        assert step["start_ns"] <= kernel["start_ns"] <= step["start_ns"] + step["dur_ns"]
    assert all(k["grid"] and k["registers_per_thread"] for k in kernels)


def test_levels_l_and_g_refuse_to_share_cupti_with_the_framework_level(cuda_device: str) -> None:
    import pytest

    from tracer.errors import ConfigError

    with pytest.raises(ConfigError, match="cannot run with level F"):
        Session("MFLG", device=cuda_device)

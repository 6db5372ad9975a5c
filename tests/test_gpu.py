"""GPU-only checks, run on the device machine; they skip cleanly without a GPU."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.conftest import ancestors, reachable_from_root
from xsp.tracer.capture.session import Session
from xsp.tracer.export.sinks import InMemorySink
from xsp.tracer.workloads import zoo

pytestmark = pytest.mark.gpu


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


def _xsp_run(levels: str, device: str, out) -> pa.Table:  # type: ignore[no-untyped-def]
    """``xsp run`` of ResNet-18 training in a fresh process (as users run it), its spans."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from xsp.core.store import open_measurement

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
            levels,
            "--iterations",
            "2",
            "--warmup",
            "1",
            "--device",
            device,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    assert done.returncode == 0, done.stderr
    (run,) = open_measurement(out)
    assert run.meta["status"] == "ok", run.meta
    return run.spans()


def test_mlg_training_hangs_every_kernel_under_its_launch(cuda_device: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = _xsp_run("MLG", cuda_device, tmp_path / "R")
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


def test_mflg_training_hangs_kernels_under_library_op_and_layer(cuda_device: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = _xsp_run("MFLG", cuda_device, tmp_path / "R")
    assert reachable_from_root(table)
    rows = {r["span_id"]: r for r in table.to_pylist()}
    kernels = [r for r in rows.values() if r["kind"] == "kernel"]
    chains = [[s["kind"] for s in ancestors(rows, k)] for k in kernels]
    assert all(c[0] in ("runtime", "driver") for c in chains)
    # every kernel of the step reaches an op; forward kernels reach their layer
    assert all({"op", "backward", "optimizer"} & set(c) for c in chains)
    # forward kernels reach their layer, except the loss's (computed outside the model)
    forward = [c for k, c in zip(kernels, chains, strict=True) if k["phase"] == "forward"]
    assert forward and sum("module" in c for c in forward) >= 0.9 * len(forward)
    # backward kernels are attributed to the layer whose gradient they compute
    backward = [k for k in kernels if k["phase"] == "backward"]
    assert sum(k["module_path"] is not None for k in backward) >= 0.9 * len(backward)
    libraries = {r["library"] for r in rows.values() if r["kind"] == "library_call"}
    assert "cuDNN" in libraries and libraries & {"cuBLAS", "cuBLASLt"}
    conv_kernels = [c for c in chains if "library_call" in c]
    assert len(conv_kernels) > len(kernels) // 10


def test_the_replay_matches_cuda_event_truth_on_known_layers(cuda_device: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The known-duration workload (benchmarks/workloads/known_layers.py), measured at M, MF and
    MFLG: the replayed step within 2% of M's, and every layer of 0.3 ms or more within 1.5% of
    the CUDA events around it."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.replay import critical_path, replay

    root = Path(__file__).resolve().parents[1]
    script = root / "benchmarks" / "workloads" / "known_layers.py"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    truth_path = tmp_path / "truth.json"
    subprocess.run(
        [sys.executable, str(script), "--truth", str(truth_path), "--steps", "60"],
        check=True, env=env, timeout=300,
    )  # fmt: skip
    out = tmp_path / "known"
    subprocess.run(
        [sys.executable, "-m", "xsp", "run", "--levels", "M,MF,MFLG", "--iterations", "20",
         "--warmup", "5", "--device", cuda_device, "--out", str(out), "--", sys.executable,
         str(script), "--steps", "50"],  # the MF process: 5 + 2 x 20 steps
        check=True, env=env, timeout=600,
    )  # fmt: skip
    store = MeasurementStore(out)
    found = replay(store).summary()
    assert abs(found["error_pct"]) < 2.0, found
    truth = json.loads(truth_path.read_text())["layer_ms"]
    by_layer = {int(r["layer"]): r["gpu_ms"] for r in critical_path.layers(store).to_pylist()}
    for index, ms in enumerate(truth):
        if ms >= 0.3:
            assert abs(by_layer[index] - ms) <= 0.015 * ms, (index, by_layer[index], ms)
    assert critical_path.layers(store, 1).column("layer")[0].as_py() == "2"


SAMPLED_SERVICE = """
import sys, torch, xsp
net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
net = net.to("cuda").eval()
session = xsp.session(
    "MFLG", iterations=0, warmup=2, out=sys.argv[1], device="cuda", auto_iterations=True,
    sample_every=3, sample_run=int(sys.argv[2]), export_every_s=1e6, monitor=False,
)
with torch.inference_mode():
    for request in range(14):  # 2 warm-up, then measured 0..11; a batch boundary after 5
        net(torch.ones(1, 256, device="cuda"))
        if request == 7:
            session._continuous._rotate()
meta = session.close()
print(meta["status"], meta["batches_stored"])
"""


@pytest.mark.parametrize(("run", "sampled"), [(1, [0, 3, 6, 9]), (2, [0, 1, 6, 7])])
def test_a_service_samples_levels_l_and_g_on_cuda_across_batches(
    cuda_device: str, tmp_path, run: int, sampled: list[int]
) -> None:  # type: ignore[no-untyped-def]
    """Levels L and G in a continuous session: CUPTI's kinds are on for the sampled requests
    only (1 in 3: alone, CUPTI paused between them, or in runs of 2, CUPTI finalized between
    runs), each batch's records are flushed and decoded at its boundary, and every kernel hangs
    under its launch, its op and its request's step, in both batches."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from xsp.core.store import open_run

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", SAMPLED_SERVICE, str(tmp_path / "S"), str(run)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["ok", "2"], done.stdout
    run = open_run(tmp_path / "S")
    assert run.meta["status"] == "ok", run.meta
    table = run.spans()
    assert reachable_from_root(table)
    rows = {r["span_id"]: r for r in table.to_pylist()}
    steps = sorted(r["iteration"] for r in rows.values() if r["kind"] == "step")
    assert steps == list(range(12))
    kernels = [r for r in rows.values() if r["kind"] == "kernel"]
    steps_at = {r["iteration"]: r for r in rows.values() if r["kind"] == "step"}
    where = {}  # each sampled request: its first launch's and kernel's start after its step's
    for kind in ("runtime", "kernel"):
        for r in rows.values():
            if r["kind"] == kind:
                step = steps_at[r["iteration"]]
                key = (r["iteration"], kind)
                where[key] = min(where.get(key, 1 << 62), r["start_ns"] - step["start_ns"])
    per_request: dict[int, int] = {}
    for kernel in kernels:
        per_request[kernel["iteration"]] = per_request.get(kernel["iteration"], 0) + 1
        chain = ancestors(rows, kernel)
        launch = chain[0]
        assert launch["level"] == "library" and launch["correlation_id"] == kernel["correlation_id"]
        assert "op" in [s["kind"] for s in chain]
        (step,) = [s for s in chain if s["kind"] == "step"]
        assert step["iteration"] == kernel["iteration"]
        inside = step["start_ns"] <= kernel["start_ns"] <= step["start_ns"] + step["dur_ns"]
        assert inside, sorted(where.items())
    # the sampled requests, in both batches, each with the same kernels (2 linear + relu)
    assert sorted(per_request) == sampled
    assert len(set(per_request.values())) == 1 and per_request[0] >= 3
    api = [r for r in rows.values() if r["level"] == "library"]
    assert {r["iteration"] for r in api} == set(sampled)

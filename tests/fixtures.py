"""Recording and loading of raw-capture fixtures (tests/data/<scenario>/raw.json).

A fixture holds exactly what the levels drained (M's steps, F's profiler events and module
tables, L's API calls, G's GPU activities), as plain JSON lists, so conversion and nesting run on
real data without a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from xsp.core.levelset import LevelSet
from xsp.core.records import (
    ApiRecords,
    ExternGraph,
    FrameworkRecords,
    GpuRecords,
    GraphNodes,
    Interned,
    ModuleInfo,
    StepRecords,
)

DATA = Path(__file__).parent / "data"
SECTIONS = {"M": "steps", "F": "framework", "L": "api", "G": "gpu"}


def capture_raw(
    model: str, mode: str, batch_size: int, device: str, iterations: int, levels: str = "MF"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run a zoo workload with ``levels`` driven by hand; return (drained records, meta)."""
    import os

    import torch

    from xsp.tracer.capture.levels import LevelContext, level_environment
    from xsp.tracer.workloads import zoo

    level_set = LevelSet(levels)
    os.environ.update(level_environment(LevelContext(device, level_set)))  # before libraries start
    workload = zoo.build(model, batch_size, mode, device)
    workload.step()  # warm-up: allocator, cuDNN/cuBLAS handles
    drained = drive_levels(LevelContext(device, level_set), level_set, iterations, workload.step)
    meta = {
        "model": model,
        "mode": mode,
        "batch_size": batch_size,
        "device": device,
        "torch": torch.__version__,
        "levels": levels,
        "named_modules": [name for name, _ in workload.model.named_modules()],
    }
    return drained, meta


def drive_levels(
    context: Any,
    level_set: LevelSet,
    iterations: int,
    step: Any,
    before_measuring: Any = None,
) -> dict[str, Any]:
    """``iterations`` calls of ``step`` with ``level_set``'s levels driven by hand, as a session
    drives them; ``before_measuring`` runs once the levels are on. Returns what each drained."""
    from xsp.tracer.capture.levels import build_levels

    built = build_levels(level_set, context)
    for level in built:
        level.enable()
    if before_measuring is not None:
        before_measuring()
    for i in range(iterations):
        for level in built:
            level.begin_iteration(i)
        step()
        for level in reversed(built):
            level.end_iteration(i)
    for level in reversed(built):
        level.disable()
    drained = {level.letter: level.drain() for level in built}
    context.discard_arena()
    context.uninstall_provenance()
    return drained


def capture_graphed_raw(graphed: bool, iterations: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """tests/test_cuda_graphs.py's small CNN trained at MFLG with levels driven by hand, its
    forward and backward captured in CUDA graphs (``graphed``) or run eagerly; the capture
    happens with the levels on, as a session turns them on at a capture."""
    import os

    import torch

    from tests.test_cuda_graphs import SmallCnn
    from xsp.tracer.capture.levels import LevelContext, level_environment

    level_set = LevelSet("MFLG")
    os.environ.update(level_environment(LevelContext("cuda", level_set)))
    torch.manual_seed(0)
    model = SmallCnn().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 3, 16, 16, device="cuda")
    # a contiguous output gradient, as the graphed backward's static one is (``.sum().backward()``
    # would give an expanded one, which cuBLAS multiplies with other kernels after a copy)
    grad = torch.ones(8, 10, device="cuda")

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(x).backward(grad)
        optimizer.step()

    def capture() -> None:
        nonlocal model
        if graphed:
            model = torch.cuda.make_graphed_callables(model, (x,))

    for _ in range(3):  # cuDNN chooses its algorithms: the graph captures the chosen ones
        step()
    drained = drive_levels(LevelContext("cuda", level_set), level_set, iterations, step, capture)
    meta = {"model": "tests.test_cuda_graphs.SmallCnn", "graphed": graphed, "levels": "MFLG"}
    meta |= {"device": "cuda", "torch": torch.__version__, "mode": "train", "batch_size": 8}
    return drained, meta


def capture_compiled_raw(mode: str, iterations: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """tests/test_cuda_graphs.py's small CNN, batch 8 inference, ``torch.compile``d in ``mode``
    (``reduce-overhead``: inductor's CUDA graph trees capture the compiled graph; ``default``:
    its kernels are launched) at MFLG, levels driven by hand and on from the compile (a session
    turns them on at a capture), so that inductor's provenance and the capture are recorded."""
    import os

    import torch

    from tests.test_cuda_graphs import SmallCnn
    from xsp.tracer.capture.levels import LevelContext, level_environment

    level_set = LevelSet("MFLG")
    os.environ.update(level_environment(LevelContext("cuda", level_set)))
    torch.manual_seed(0)
    model = SmallCnn().cuda().eval()
    x = torch.randn(8, 3, 16, 16, device="cuda")
    compiled: Any = None

    def step() -> None:
        with torch.no_grad():
            compiled(x)

    def compile_and_capture() -> None:
        nonlocal compiled
        compiled = torch.compile(model, mode=mode)
        for _ in range(3):  # compile, then (reduce-overhead) a warm-up run and the capture
            step()

    drained = drive_levels(
        LevelContext("cuda", level_set), level_set, iterations, step, compile_and_capture
    )
    meta = {"model": "tests.test_cuda_graphs.SmallCnn", "compile_mode": mode, "levels": "MFLG"}
    meta |= {"device": "cuda", "torch": torch.__version__, "mode": "infer", "batch_size": 8}
    return drained, meta


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, (type, ModuleInfo)):
        return to_json(value)
    if isinstance(value, Interned):
        return value.to_list()
    if isinstance(value, array):
        return list(value)
    if isinstance(value, ModuleInfo):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def to_json(records: Any) -> dict[str, Any]:
    return {f.name: _plain(getattr(records, f.name)) for f in dataclasses.fields(records)}


def _restore(cls: type, data: dict[str, Any]) -> Any:
    template = cls()
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        raw, default = data[f.name], getattr(template, f.name)
        if dataclasses.is_dataclass(default):
            values[f.name] = _restore(type(default), raw)
        elif isinstance(default, Interned):
            values[f.name] = Interned(raw)
        elif isinstance(default, array):
            values[f.name] = array(default.typecode, raw)
        else:
            values[f.name] = raw
    return cls(**values)


def from_json(data: dict[str, Any]) -> dict[str, Any]:
    """The drained records of a fixture, by level letter."""
    out: dict[str, Any] = {"M": _restore(StepRecords, data["steps"])}
    if "framework" in data:
        fw = _restore(FrameworkRecords, data["framework"])
        fw.modules = [ModuleInfo(**m) for m in data["framework"]["modules"]]
        fw.call_input_shapes = [_shape_text(shapes) for shapes in fw.call_input_shapes]
        fw.call_output_shapes = {int(k): _shape_text(v) for k, v in fw.call_output_shapes.items()}
        nodes = data["framework"].get("graph_nodes", {})  # JSON keys are strings
        fw.graph_nodes = GraphNodes(
            **{name: {int(k): v for k, v in nodes.get(name, {}).items()} for name in nodes}
        )
        fw.extern_calls = [  # JSON lists back into the named tuples
            ExternGraph(frame, phase, [(op, list(modules)) for op, modules in calls])
            for frame, phase, calls in data["framework"].get("extern_calls", [])
        ]
        out["F"] = fw
    if "api" in data:
        out["L"] = _restore(ApiRecords, data["api"])
    if "gpu" in data:
        out["G"] = _restore(GpuRecords, data["gpu"])
    return out


def _shape_text(shapes: Any) -> str:
    """Shapes as the native capture writes them (``[[2,3],[4]]``); older fixtures hold lists."""
    return shapes if isinstance(shapes, str) else str(shapes).replace(" ", "")


def load_json(scenario: str) -> dict[str, Any]:
    return dict(json.loads((DATA / scenario / "raw.json").read_text()))


def load_raw(scenario: str) -> tuple[StepRecords, FrameworkRecords, dict[str, Any]]:
    data = load_json(scenario)
    records = from_json(data)
    return records["M"], records["F"], data["meta"]


def load_records(scenario: str) -> tuple[dict[str, Any], dict[str, Any]]:
    data = load_json(scenario)
    return from_json(data), data["meta"]


def fixture_table(scenario: str, levels: str, run_id: str = "run-f") -> Any:
    """The span table that conversion makes of a recorded scenario, at ``levels``."""
    from xsp.tracer.convert.spans import build_table

    records, _ = load_records(scenario)
    level_set = LevelSet(levels)
    return build_table(
        run_id,
        level_set,
        {
            letter: level_records
            for letter, level_records in records.items()
            if letter in level_set.letters
        },
    )[0]


def write_run(root: Path, levels: str, table: Any, resource: dict[str, Any] | None = None) -> Path:
    """Store ``table`` as the run ``root/levels`` (span part and run.json); returns its path."""
    from xsp.core import store

    return store.write_run(root / levels, table, levels, resource or {})


def in_fresh_process(module: str, function: str, timeout: float = 600, **arguments: Any) -> Any:
    """``module.function(**arguments)`` in a fresh Python process, as a user's run is: the
    libraries' NVTX routing set before they load, dynamo's counters at zero, no CUPTI or profiler
    state of another test. Arguments and result travel as JSON; a failure raises RuntimeError
    with the process's stderr."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    code = (
        "import json, sys\n"
        f"from {module} import {function}\n"
        f"print('RESULT', json.dumps({function}(**json.loads(sys.argv[1]))))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(arguments)],
        capture_output=True, text=True, timeout=timeout, cwd=root, env=env,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or len(lines) != 1:
        raise RuntimeError(done.stderr[-6000:])
    return json.loads(lines[0].removeprefix("RESULT "))


def free_ports(count: int) -> list[int]:
    """Loopback ports nothing listens on (held together, so they differ)."""
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def http_collector(store: Path, **options: Any) -> Any:
    """An in-process collector, started, taking OTLP/HTTP on a free loopback port (no gRPC);
    ``options`` are the rest of its CollectorConfig."""
    from xsp.collector.server import Collector, CollectorConfig

    config = CollectorConfig(store=store, grpc_address=None, http_address="127.0.0.1:0", **options)
    return Collector(config).start()


def start_collector(store_dir: Path, port: int, grpc_port: int | None = None) -> Any:
    """``xsp collector serve`` (HTTP, and gRPC on ``grpc_port``) in its own process, returned
    once it answers."""
    import os
    import subprocess
    import sys
    import time
    import urllib.request

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "xsp",
            "collector",
            "serve",
            "--store",
            str(store_dir),
            "--grpc",
            f"127.0.0.1:{grpc_port}" if grpc_port else "",
            "--http",
            f"127.0.0.1:{port}",
        ],
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"collector did not start: {proc.stderr.read() if proc.stderr else ''}")


def make_collector(tmp_path: Path, **options: Any) -> Any:
    """An in-process collector on free loopback ports (both receivers), flushing every 50 ms,
    not yet started; ``options`` override CollectorConfig's fields."""
    from xsp.collector.server import Collector, CollectorConfig

    config: dict[str, Any] = {
        "store": tmp_path / "store",
        "grpc_address": "127.0.0.1:0",
        "http_address": "127.0.0.1:0",
        "flush_interval_s": 0.05,
        **options,
    }
    return Collector(CollectorConfig(**config))


def train(session: Any, model: Any, x: Any) -> None:
    """Run ``session``'s iterations as SGD steps of ``model`` on ``x`` (loss: the output's sum)."""
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    while not session.done:
        with session.iteration():
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()


def plain_cupti_kernels(workload: Any, iterations: int) -> list[int]:
    """Kernels per iteration of ``workload.step()`` as CUPTI alone counts them (no xsp level
    active), through the native core's CUPTI buffers, split by time (GPU only)."""
    import time

    import numpy as np
    import torch

    from xsp.tracer.native.build import load

    native = load()
    offset = time.time_ns() - native.cupti_timestamp()
    native.cupti_start(["CONCURRENT_KERNEL"], 256 * 1024 * 1024, 1, [])
    bounds = []
    for _ in range(iterations):
        torch.cuda.synchronize()
        t0 = time.time_ns()
        workload.step()
        torch.cuda.synchronize()
        bounds.append((t0, time.time_ns()))
    native.cupti_stop()
    starts = np.frombuffer(native.cupti_decode()["gpu"]["start_ns"], dtype=np.int64) + offset
    native.cupti_finalize()
    # each kernel goes to the last iteration that began before it: none is lost to a clock
    # offset that moves the first or last kernels out of the windows
    slot = np.searchsorted(np.array([t0 for t0, _ in bounds]), starts, side="right") - 1
    return np.bincount(np.clip(slot, 0, iterations - 1), minlength=iterations).tolist()


def dynamo_counts() -> dict[str, int]:
    """torch.compile's counters that level F must leave alone: graph breaks, graphs, frames
    compiled and recompiles, since the process started."""
    from torch._dynamo.utils import counters

    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "frames_compiled": int(counters["frames"]["ok"]),
        "recompiles": sum(counters["recompiles"].values()),
    }


def _with_values(table: Any, name: str, rows: dict[int, object]) -> Any:
    import pyarrow as pa

    values = table.column(name).to_pylist()
    for row, value in rows.items():
        values[row] = value
    at = table.column_names.index(name)
    return table.set_column(at, name, pa.array(values, table.schema.field(name).type))


def varied_xsp_table() -> Any:
    """A ResNet-18 step at MF, with what xsp's own spans may also carry: an application's span
    above the step, an error, a reconstruction's link, a float, a long string, a negative int."""
    table = fixture_table("resnet18_train_cpu", "MF").slice(0, 400)
    kinds = table.column("kind").to_pylist()
    step = kinds.index("step")
    op = kinds.index("op")
    table = _with_values(table, "remote_parent_span_id", {step: 0xABCDEF0123456789})
    table = _with_values(table, "status_message", {op: "CUDA error: out of memory"})
    table = _with_values(table, "link_trace_id", {op + 1: b"\x07" * 16})
    table = _with_values(table, "link_span_id", {op + 1: 0x1122334455667788})
    table = _with_values(table, "gpu_utilization_pct", {step: 87.5})
    shapes = "[" + ", ".join(["[64, 3, 224, 224]"] * 20) + "]"
    table = _with_values(table, "input_shapes", {op: shapes})
    return _with_values(table, "thread_id", {op: -5})


def damaged(rng: random.Random, data: bytes, times: int = 1) -> bytes:
    """``data`` damaged ``times`` times at random places: a byte flipped (60%), the rest cut off
    (20%) or a byte inserted (20%); a cut to nothing leaves one tag byte."""
    body = bytearray(data)
    for _ in range(times):
        where = rng.randrange(len(body))
        how = rng.random()
        if how < 0.6:
            body[where] = rng.randrange(256)
        elif how < 0.8:
            del body[where:]
            if not body:
                body = bytearray(b"\x0a")
        else:
            body[where:where] = bytes([rng.randrange(256)])
    return bytes(body)


#: The kinds of small filesystem ``small_filesystem`` mounts.
FILESYSTEMS = ("tmpfs", "ext4")


@contextlib.contextmanager
def small_filesystem(directory: Path, size_bytes: int, kind: str = "tmpfs") -> Iterator[Path]:
    """A real filesystem of ``size_bytes`` mounted on ``directory`` (made here): a tmpfs, or
    ext4 in a loop-mounted file beside it. Skips the test, with the reason, where this machine
    cannot mount one (not root, or the mount refused)."""
    import os
    import subprocess

    import pytest

    directory.mkdir()
    if os.geteuid() != 0:
        pytest.skip(f"mounting a {size_bytes:,}-byte {kind} needs root")
    if kind == "tmpfs":
        mount = ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(directory)]
    else:
        image = directory.with_name(directory.name + ".img")
        with open(image, "wb") as handle:
            handle.truncate(size_bytes)
        made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"cannot make an ext4 filesystem here: {made.stderr.strip()}")
        mount = ["mount", "-o", "loop", str(image), str(directory)]
    done = subprocess.run(mount, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {kind} here: {done.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=True)

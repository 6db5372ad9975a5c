"""The GPU correctness checks of levels F, L and G and of torch.compile'd models (until issue 26
the scripts benchmarks/gpu_check.py, compile_check.py and compiled_attribution.py, whose H200
outputs are in benchmarks/results/). Each check runs in a fresh process, as a user's run does:
the libraries' NVTX routing must be set before they load, dynamo's counters start at zero, and
no CUPTI or profiler state of another test reaches it. The GPU ones skip cleanly without a GPU;
run them on the device machine with ``bash benchmarks/device.sh gpu-tests``. The kernel check's
parent chains also run here, on a recorded H200 capture.

The CPU side of compiled attribution is tests/test_compiled.py (a small compiled model, since
ResNet-18 under inductor takes about 50 s to compile on the 2-core dev machine); the CPU side of
"level F adds no graph break or recompile" is tests/test_native.py.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import in_fresh_process

ROOT = Path(__file__).resolve().parents[1]

#: The outermost ops of the kernels that run outside every layer of a zoo model's training step:
#: its loss (cross-entropy, computed outside the model), the gradient seed of ``loss.backward()``,
#: the loss's backward nodes, and the optimizer step.
OUTSIDE_THE_LAYERS = (
    "aten::cross_entropy_loss",
    "aten::ones_like",
    "autograd::engine::evaluate_function: NllLossBackward0",
    "autograd::engine::evaluate_function: LogSoftmaxBackward0",
)


def _fresh(check: str, **arguments: Any) -> dict[str, Any]:
    """``check(**arguments)`` of this module in a fresh Python process; its result."""
    return dict(in_fresh_process("tests.test_gpu_checks", check, **arguments))


def kernel_check(model: str, batch_size: int, iterations: int, levels: str) -> dict[str, Any]:
    """A training run of ``model`` at ``levels`` (in this process), against CUPTI's own kernel
    count for uninstrumented iterations, with the chain of parents of every kernel."""
    from xsp.tracer.capture.hooks.cupti import nvtx_environment

    os.environ.update(nvtx_environment())  # before cuBLAS, cuDNN and PyTorch first use NVTX
    from tests.fixtures import plain_cupti_kernels
    from xsp.tracer.capture.session import Session
    from xsp.tracer.export.sinks import InMemorySink
    from xsp.tracer.workloads import zoo

    workload = zoo.build(model, batch_size, "train", "cuda")
    for _ in range(3):  # cuDNN has chosen its algorithms by then
        workload.step()
    reference = plain_cupti_kernels(workload, iterations)
    sink = InMemorySink()
    session = Session(levels, iterations=iterations, warmup=1, sinks=[sink], device="cuda").start()
    while not session.done:
        with session.iteration():
            workload.step()
    meta = session.close() or {}
    rows = {r["span_id"]: r for r in sink.table().to_pylist()}
    return {
        "status": meta.get("status"),
        "errors": meta.get("errors"),
        "api_ops": meta.get("api_ops"),
        "cupti": meta.get("cupti"),
        "arena": meta.get("arena"),
        "kernels_per_iteration_plain_cupti": reference,
        **kernel_parents(rows, iterations),
    }


def kernel_parents(rows: dict[int, dict[str, Any]], iterations: int) -> dict[str, Any]:
    """What the kernels of a span table (``rows``: span id to span row) hang under: their launch
    call, an op, a library call, a layer; the outermost op of each kernel outside the layers."""
    from tests.conftest import ancestors

    kernels = [r for r in rows.values() if r["kind"] == "kernel"]
    chains = [ancestors(rows, k) for k in kernels]
    per_iteration = Counter(k["iteration"] for k in kernels)
    outside: Counter[str] = Counter()
    for kernel, chain in zip(kernels, chains, strict=True):
        if kernel["module_path"] is None:
            ops = [s for s in chain if s["kind"] in ("op", "backward", "optimizer")]
            top = ops[-1] if ops else {"kind": None, "op_name": None, "name": "(no op)"}
            name = "optimizer" if top["kind"] == "optimizer" else top["op_name"] or top["name"]
            outside[name] += 1
    return {
        "kernels": len(kernels),
        "kernels_per_iteration_xsp": [per_iteration[i] for i in range(iterations)],
        "kernels_under_their_launch": sum(
            1
            for k, c in zip(kernels, chains, strict=True)
            if c
            and c[0]["kind"] in ("runtime", "driver")
            and c[0]["correlation_id"] == k["correlation_id"]
        ),
        "kernels_under_op": sum(
            1 for c in chains if {"op", "backward", "optimizer"} & {s["kind"] for s in c}
        ),
        "kernels_under_library_call": sum(
            1 for c in chains if any(s["kind"] == "library_call" for s in c)
        ),
        "kernels_with_layer": sum(1 for k in kernels if k["module_path"] is not None),
        "kernels_outside_the_layers_by_op": dict(outside),
        "libraries": sorted({r["library"] for r in rows.values() if r["kind"] == "library_call"}),
    }


def _assert_kernel_parents(found: dict[str, Any]) -> None:
    kernels = found["kernels"]
    assert kernels > 0
    assert found["kernels_under_their_launch"] == kernels
    assert found["kernels_under_op"] == kernels
    assert "cuDNN" in found["libraries"] and {"cuBLAS", "cuBLASLt"} & set(found["libraries"])
    assert found["kernels_under_library_call"] > kernels // 2
    # every kernel outside a layer is the loss's, its backward's or the optimizer's
    outside = found["kernels_outside_the_layers_by_op"]
    assert set(outside) <= {*OUTSIDE_THE_LAYERS, "optimizer"}, outside
    assert found["kernels_with_layer"] >= 0.95 * kernels


def compile_check(model: str, batch_size: int, iterations: int, backend: str) -> dict[str, Any]:
    """A torch.compile'd training step under level F: dynamo's graph breaks, graphs and
    recompiles before and after the levels come on, and the spans of the compiled regions."""
    import tempfile

    import torch

    from tests.fixtures import dynamo_counts
    from xsp.core import store
    from xsp.tracer.capture.session import Session
    from xsp.tracer.workloads import zoo

    workload = zoo.build(model, batch_size, "train", "cuda")
    workload.model = torch.compile(workload.model, backend=backend)  # type: ignore[assignment]
    for _ in range(iterations + 3):
        workload.step()
    torch.cuda.synchronize()
    before = dynamo_counts()
    with tempfile.TemporaryDirectory() as tmp:
        session = Session(
            "MF", iterations=iterations, warmup=0, out=Path(tmp) / "MF", device="cuda"
        )
        session.start()
        while not session.done:
            with session.iteration():
                workload.step()
        meta = session.close() or {}
        spans = store.open_run(Path(tmp) / "MF").spans().to_pylist()
    return {
        "status": meta.get("status"),
        "status_reasons": meta.get("status_reasons"),
        "dynamo_before_F": before,
        "dynamo_after_F": dynamo_counts(),
        "steps": sum(1 for s in spans if s["kind"] == "step"),
        "compiled_region_spans": sorted(
            {s["name"] for s in spans if "Compiled" in (s["name"] or "")}
        ),
    }


def compiled_attribution(
    model: str, batch_size: int, iterations: int, device: str = "cuda"
) -> dict[str, Any]:
    """How far inductor's provenance attributes a compiled training step's work to the modules
    it came from, in the first measured iteration: its generated kernels (Triton on CUDA, C++
    ranges on CPU), the ops its wrapper code calls directly (the extern calls: matmuls and
    convolutions, and the wrapper's own buffer work) and, on CUDA, the library kernels (cuBLAS,
    cuDNN) under them. MFLG on CUDA, MF on CPU, the session made before the model is compiled
    (as under ``xsp run``)."""
    import tempfile

    import torch

    from xsp.core import store
    from xsp.tracer.capture.session import Session
    from xsp.tracer.workloads import zoo

    levels = "MFLG" if device == "cuda" else "MF"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / levels
        session = Session(levels, iterations=iterations, warmup=2, out=out, device=device)
        workload = zoo.build(model, batch_size, "train", device)
        workload.model = torch.compile(workload.model)  # type: ignore[assignment]
        session.start()
        while not session.done:
            with session.iteration():
                workload.step()
        meta = session.close() or {}
        spans = [s for s in store.open_run(out).spans().to_pylist() if s["iteration"] == 0]
    root = "_orig_mod."
    by_id = {s["span_id"]: s for s in spans}

    def in_region(span: dict[str, Any]) -> bool:
        while (span := by_id.get(span["parent_span_id"])) is not None:  # type: ignore[assignment]
            if span["name"].startswith("CompiledFunction"):
                return True
        return False

    def below(found: list[dict[str, Any]]) -> list[str]:
        return [s["module_path"] for s in found if (s["module_path"] or "").startswith(root)]

    def is_generated(span: dict[str, Any]) -> bool:
        if device == "cuda":
            return bool(span["kind"] == "kernel" and span["name"].startswith("triton"))
        return bool(span["kind"] == "op" and span["name"].startswith("graph_"))

    generated = [s for s in spans if is_generated(s)]
    regions = {s["span_id"] for s in spans if s["name"].startswith("CompiledFunction")}
    called = [
        s
        for s in spans
        if s["parent_span_id"] in regions and s["kind"] == "op" and not is_generated(s)
    ]
    library = [s for s in spans if s["kind"] == "kernel" and not is_generated(s) and in_region(s)]
    by_name: dict[str, list[int]] = {}  # name: [below the root, all, distinct modules]
    for name in sorted({s["name"] for s in called}):
        ops = [s for s in called if s["name"] == name]
        by_name[name] = [len(below(ops)), len(ops), len(set(below(ops)))]
    modules = below(generated) + below(called) + below(library)
    return {
        "status": meta.get("status"),
        "status_reasons": meta.get("status_reasons"),
        "generated_kernels": len(generated),
        "below_root": len(below(generated)),
        "region_ops": len(called),
        "region_ops_below_root": len(below(called)),
        "region_ops_by_name": by_name,
        "library_kernels": len(library),
        "library_kernels_below_root": len(below(library)),
        "modules_below_root": sorted(set(modules)),
        "top_modules": sorted({path.removeprefix(root).split(".")[0] for path in modules}),
        "named_modules": [name for name, _ in workload.model.named_modules()],
    }


@pytest.mark.gpu
def test_mflg_kernels_match_cuptis_own_count_and_reach_launch_op_and_layer(
    cuda_device: str,
) -> None:
    """ResNet-50 b32 training at MFLG, 3 iterations. On the H200 (benchmarks/results/
    native17-h200-gpu-check.json): 725 kernels in each iteration, as CUPTI alone counts; all
    2,175 under their launch call and an op, 1,563 under a cuDNN or cuBLAS call, 2,130 in a
    layer; 612 of 612 API calls joined to their op by id; nothing dropped."""
    found = _fresh("kernel_check", model="torchvision:resnet50", batch_size=32, iterations=3,
                   levels="MFLG")  # fmt: skip
    assert found["status"] == "ok" and not found["errors"], found
    assert found["cupti"]["dropped_records"] == 0 and found["cupti"]["undecodable_records"] == 0
    arena = found["arena"]
    assert arena["dropped_records"] == arena["dropped_strings"] == arena["callback_errors"] == 0
    # xsp puts a kernel in its launch call's iteration and the reference splits CUPTI's kernels
    # by time: every iteration the same, and every kernel CUPTI saw, no more
    per_iteration = found["kernels_per_iteration_xsp"]
    assert len(set(per_iteration)) == 1 and per_iteration[0] > 0, found
    assert sum(per_iteration) == sum(found["kernels_per_iteration_plain_cupti"]), found
    assert found["api_ops"]["by_correlation_id"] > 0 and found["api_ops"]["by_time"] == 0
    _assert_kernel_parents(found)


def test_the_kernel_check_holds_on_the_recorded_h200_resnet18_capture() -> None:
    """The kernel check's parent chains on a real H200 capture without a GPU: ResNet-18 b4
    training at MFLG with the native core (tests/data/resnet18_train_mflg_cuda_native)."""
    from tests.fixtures import fixture_table

    table = fixture_table("resnet18_train_mflg_cuda_native", "MFLG")
    found = kernel_parents({r["span_id"]: r for r in table.to_pylist()}, 1)
    assert found["kernels_per_iteration_xsp"] == [found["kernels"]] == [324]
    _assert_kernel_parents(found)
    assert sum(found["kernels_outside_the_layers_by_op"].values()) == 9


@pytest.mark.gpu
def test_torch_compile_under_f_gets_no_graph_break_graph_or_recompile_on_cuda(
    cuda_device: str,
) -> None:
    """ResNet-18 b32 training compiled by inductor, 10 iterations at MF after 13 untraced.
    On the H200 (benchmarks/results/compile-check-h200.json): F added no graph break, graph or
    recompile; the compiled regions are spans."""
    found = _fresh("compile_check", model="torchvision:resnet18", batch_size=32, iterations=10,
                   backend="inductor")  # fmt: skip
    assert found["status"] == "ok", found["status_reasons"]
    assert found["steps"] == 10
    before, after = found["dynamo_before_F"], found["dynamo_after_F"]
    assert before["unique_graphs"] > 0
    for counter in ("graph_breaks", "unique_graphs", "recompiles"):
        assert after[counter] == before[counter], (counter, before, after)
    regions = set(found["compiled_region_spans"])
    assert {"Torch-Compiled Region: 0/0", "CompiledFunction", "CompiledFunctionBackward"} <= regions


@pytest.mark.gpu
def test_compiled_kernels_are_attributed_to_their_source_modules(cuda_device: str) -> None:
    """ResNet-18 b32 training under torch.compile at MFLG. On the H200 (benchmarks/results/
    native5-h200-compiled-attribution.json): 151 of an iteration's 185 Triton kernels sit in a
    module below the compiled root, 33 distinct ones; the rest mix blocks (the batch-norm
    statistics of all layers in one kernel, gradients across a residual add). The matmuls and
    convolutions inductor leaves to cuBLAS and cuDNN land on their layers by its extern calls:
    each of the 20 convolutions forward and backward, and the kernels under them."""
    found = _fresh("compiled_attribution", model="torchvision:resnet18", batch_size=32,
                   iterations=3)  # fmt: skip
    assert found["status"] == "ok", found["status_reasons"]
    assert found["generated_kernels"] > 0
    assert found["below_root"] >= 0.75 * found["generated_kernels"], found
    # each is a module of the compiled model, and they spread over its blocks
    assert set(found["modules_below_root"]) <= set(found["named_modules"])
    assert {"layer1", "layer2", "layer3", "layer4"} <= set(found["top_modules"])
    assert len(found["modules_below_root"]) >= 20
    ops = found["region_ops_by_name"]
    assert ops["aten::convolution"] == ops["aten::convolution_backward"] == [20, 20, 20], ops
    assert found["library_kernels"] > 0
    assert found["library_kernels_below_root"] >= 0.9 * found["library_kernels"], found

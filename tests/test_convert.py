"""Conversion of real recorded captures (tests/data/*/raw.json) into spans.

Expected numbers are worked out from ResNet-18 itself: 68 named modules, of which 76 module calls
per forward (each of the 8 BasicBlocks calls its ReLU twice: 1 + 8*2 = 17 ReLU calls, against 9
ReLU modules); 20 Conv2d and 20 BatchNorm2d layers; one Linear layer fc with 512*1000 + 1000
parameters. The CUDA captures ran backward on the autograd device thread (Kineto's thread 2; in the
MFLG capture, where F comes from NVTX ranges, an OS thread id other than the forward thread's).
"""

from __future__ import annotations

from collections import Counter

import pyarrow.compute as pc
import pytest

from tests.conftest import ancestors, reachable_from_root
from tests.fixtures import load_raw
from xsp.core import schema
from xsp.tracer.convert.spans import build_table

SCENARIOS = ["resnet18_train_cpu", "resnet18_train_cuda", "resnet18_train_mflg_cuda"]


def _convert(scenario: str):  # type: ignore[no-untyped-def]
    steps, framework, meta = load_raw(scenario)
    table, report = build_table("run-1", "MF", {"M": steps, "F": framework})
    return table, report, framework, meta


def _rows(table, kind: str) -> list[dict]:  # type: ignore[no-untyped-def]
    return table.filter(pc.equal(table.column("kind"), kind)).to_pylist()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_span_reaches_the_single_model_root(scenario: str) -> None:
    table, report, framework, _ = _convert(scenario)
    assert reachable_from_root(table)
    roots = _rows(table, "step")
    assert len(roots) == 1 and roots[0]["parent_span_id"] == 0 and roots[0]["level"] == "model"
    assert table.column("level").unique().to_pylist() == ["model", "framework"]
    # every profiler event is a span, except the step range, which the model span replaces (on
    # CUDA the profiler's own records of CUDA API calls are left to level L at drain time)
    assert report.events_outside_iterations == 0
    assert table.num_rows == len(framework.name) - 1 + 1
    assert not any(name.startswith("cuda") for name in framework.name.values)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_module_spans_follow_named_modules(scenario: str) -> None:
    table, _, _, meta = _convert(scenario)
    modules = _rows(table, "module")
    assert len(modules) == 76
    assert {m["module_path"] for m in modules} == set(meta["named_modules"])
    calls = Counter(m["module_type"] for m in modules)
    assert calls["Conv2d"] == 20 and calls["BatchNorm2d"] == 20 and calls["ReLU"] == 17
    by_path = {m["module_path"]: m for m in modules}
    assert by_path["conv1"]["input_shapes"] == "[[2,3,224,224]]"
    assert by_path["conv1"]["output_shapes"] == "[[2,64,112,112]]"
    assert by_path["fc"]["module_params"] == 512 * 1000 + 1000
    assert by_path[""]["name"] == "ResNet" and by_path["layer1.0.conv1"]["name"] == "layer1.0.conv1"
    assert by_path["fc"]["source"].endswith(".py:" + by_path["fc"]["source"].rsplit(":", 1)[1])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ops_nest_under_their_module_with_shapes(scenario: str) -> None:
    table, _, _, _ = _convert(scenario)
    ids = dict(zip(table.column("span_id").to_pylist(), table.to_pylist(), strict=False))
    convs = [r for r in ids.values() if r["op_name"] == "aten::conv2d" and r["phase"] == "forward"]
    assert len(convs) == 20
    for op in convs:
        parent = ids[op["parent_span_id"]]
        assert parent["kind"] == "module" and parent["module_type"] == "Conv2d"
        assert op["module_path"] == parent["module_path"]
        if "mflg" not in scenario:  # NVTX op ranges carry shapes, not dtypes
            assert op["input_dtypes"].startswith("float,float")
    first = min(convs, key=lambda r: r["start_ns"])
    assert first["input_shapes"].startswith("[[2,3,224,224],[64,3,7,7]")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_backward_nodes_are_attributed_to_their_forward_layer(scenario: str) -> None:
    table, _, _, _ = _convert(scenario)
    backward = _rows(table, "backward")
    by_node = Counter((b["name"].split(": ", 1)[1], b["module_type"]) for b in backward)
    assert by_node[("ConvolutionBackward0", "Conv2d")] == 20
    assert by_node[("AddmmBackward0", "Linear")] == 1
    bn = "CudnnBatchNormBackward0" if scenario.endswith("cuda") else "NativeBatchNormBackward0"
    assert by_node[(bn, "BatchNorm2d")] == 20
    # the loss is computed outside any module, so its gradient nodes have no layer
    assert by_node[("NllLossBackward0", None)] == 1
    conv_paths = {b["module_path"] for b in backward if b["name"].endswith("ConvolutionBackward0")}
    assert len(conv_paths) == 20 and "layer4.1.conv2" in conv_paths
    assert all(b["phase"] == "backward" for b in backward)
    if scenario == "resnet18_train_cuda":  # Kineto's thread numbers
        assert {b["thread_id"] for b in backward} == {2}
    if scenario == "resnet18_train_mflg_cuda":  # OS thread ids: not the forward thread's
        forward = {r["thread_id"] for r in _rows(table, "module")}
        assert len({b["thread_id"] for b in backward}) == 1 and not forward & {
            b["thread_id"] for b in backward
        }


def test_optimizer_step_is_its_own_span_under_the_root() -> None:
    table, _, _, _ = _convert("resnet18_train_cuda")
    optimizer = _rows(table, "optimizer")
    assert sorted(o["name"] for o in optimizer) == [
        "Optimizer.step#SGD.step",
        "Optimizer.zero_grad#SGD.zero_grad",
    ]
    assert all(o["parent_span_id"] == 1 and o["phase"] == "optimizer" for o in optimizer)


def test_failed_iteration_carries_its_error_and_ids_are_stable() -> None:
    steps, framework, _ = load_raw("resnet18_train_cpu")
    table, _ = build_table(
        "run-1", "MF", {"M": steps, "F": framework}, failures={0: "ValueError: boom"}
    )
    step = _rows(table, "step")[0]
    assert step["status_message"] == "ValueError: boom"
    assert set(table.column("trace_id").to_pylist()) == {schema.trace_id_for("run-1", "MF", 0)}
    assert table.schema == schema.SPAN_SCHEMA


def test_model_level_alone_gives_one_span_per_iteration() -> None:
    from xsp.core.records import StepRecords

    steps = StepRecords(iteration=[0, 1], start_ns=[100, 300], end_ns=[250, 420])
    table, report = build_table("run-2", "M", {"M": steps})
    assert table.column("dur_ns").to_pylist() == [150, 120]
    assert table.column("parent_span_id").to_pylist() == [0, 0]
    assert len(set(table.column("trace_id").to_pylist())) == 2
    assert report.spans == 2


def test_every_span_level_has_one_registered_conversion_in_stack_order() -> None:
    """Conversion asks the registry: one entry per level that makes spans, in the order span
    ids are given, and the levels whose records a dead process's arena keeps (M and F)."""
    from xsp.tracer.convert.spans import CONVERSIONS, ROOT_LEVEL

    assert "".join(CONVERSIONS) == schema.LEVEL_ORDER == "".join(schema.LEVEL_BY_LETTER)
    assert next(iter(CONVERSIONS)) == ROOT_LEVEL
    assert [k for k, c in CONVERSIONS.items() if c.from_arena is not None] == ["M", "F"]


def test_a_level_without_spans_or_records_is_skipped_and_level_m_is_required() -> None:
    from xsp.core.records import StepRecords

    steps = StepRecords(iteration=[0], start_ns=[100], end_ns=[250])
    table, report = build_table("run-h", "MH", {"M": steps, "H": None, "F": None})
    assert table.num_rows == report.spans == 1 and report.counts_by_level == {"model": 1}
    with pytest.raises(ValueError, match="no records of level M"):
        build_table("run-h", "MF", {"F": None})


def test_mlg_capture_hangs_kernels_under_their_launch_and_launches_under_the_step() -> None:
    """The H200 capture of one ResNet-18 training step at level set MLG (no framework level):
    every GPU activity finds its API call by correlation id; every API call of the step lies
    inside the model span; the clock offset put CUPTI's stamps on the Unix clock."""
    from tests.fixtures import load_records

    records, _ = load_records("resnet18_train_mlg_cuda")
    table, report = build_table("run-g", "MLG", {k: records[k] for k in "MLG"})
    assert reachable_from_root(table)
    rows = {r["span_id"]: r for r in table.to_pylist()}
    step = next(r for r in rows.values() if r["kind"] == "step")
    gpu = [r for r in rows.values() if r["level"] == "gpu"]
    api = [r for r in rows.values() if r["level"] == "library"]
    kinds = Counter(r["kind"] for r in gpu)
    assert kinds == {"kernel": 324, "memset": 15}  # every GPU activity of the step
    assert all(rows[r["parent_span_id"]]["correlation_id"] == r["correlation_id"] for r in gpu)
    assert all(r["parent_span_id"] == step["span_id"] for r in api)
    assert all(
        step["start_ns"] <= r["start_ns"] <= step["start_ns"] + step["dur_ns"] for r in api + gpu
    )
    launches = Counter(rows[r["parent_span_id"]]["name"] for r in gpu)
    assert set(launches) <= {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cudaMemsetAsync",
    }
    kernel = next(r for r in gpu if r["kind"] == "kernel")
    assert kernel["grid"].startswith("[") and kernel["registers_per_thread"] > 0
    # demangled, except two cuDNN cutlass kernels that libstdc++'s demangler refuses (kept as is)
    assert sum(r["name"].startswith("_Z") for r in gpu) <= 0.05 * len(gpu)
    assert any(r["name"].startswith("void cudnn::") for r in gpu)
    assert report.events_outside_iterations == len(records["L"].start_ns) - len(api)


def test_gpu_work_without_api_calls_hangs_under_the_step() -> None:
    from tests.fixtures import load_records

    records, _ = load_records("resnet18_train_mlg_cuda")
    table, _ = build_table("run-g", "MG", {k: records[k] for k in "MG"})
    assert reachable_from_root(table)
    gpu = _rows(table, "kernel") + _rows(table, "memset")
    assert len(gpu) == 339 and {r["parent_span_id"] for r in gpu} == {1}


def test_mflg_capture_nests_kernel_launch_library_call_op_and_layer() -> None:
    """The H200 capture of one ResNet-18 training step at MFLG: F from PyTorch's NVTX ranges,
    L from CUDA API records and cuDNN/cuBLAS NVTX ranges, G from kernel records, all taken by one
    CUPTI session. Every kernel hangs under its launch, the launch under a library call or an
    op; cuDNN's convolution calls sit under aten::cudnn_convolution inside a Conv2d layer."""
    from tests.fixtures import load_records

    records, _ = load_records("resnet18_train_mflg_cuda")
    table, report = build_table("run-a", "MFLG", {k: records[k] for k in "MFLG"})
    assert reachable_from_root(table)
    rows = {r["span_id"]: r for r in table.to_pylist()}
    kernels = [r for r in rows.values() if r["kind"] == "kernel"]
    assert len(kernels) == 324
    chains = [ancestors(rows, k) for k in kernels]
    assert all(c[0]["kind"] in ("runtime", "driver") for c in chains)
    assert all(any(s["level"] == "framework" for s in c) for c in chains)
    calls = [r for r in rows.values() if r["kind"] == "library_call"]
    assert {r["library"] for r in calls} == {"cuDNN", "cuBLAS"}
    convs = [r for r in calls if r["name"] == "cudnnBackendExecute" and r["phase"] == "forward"]
    assert len(convs) == 20
    for call in convs:
        op = rows[call["parent_span_id"]]
        assert op["name"] == "aten::cudnn_convolution"
        assert rows[op["parent_span_id"]]["name"] == "aten::_convolution"
        assert any(s["module_type"] == "Conv2d" for s in ancestors(rows, op))
        assert call["module_path"] == op["module_path"] and call["module_path"]
    # cuBLASLt GEMMs run for aten::addmm/mm, and inside cuDNN's own convolution calls too
    gemm = Counter(
        rows[r["parent_span_id"]]["name"] for r in calls if r["name"] == "cublasLtMatmul"
    )
    assert set(gemm) == {"aten::addmm", "cudnnBackendExecute"}
    # the launches inside a cuDNN call hang under it, and their kernels inherit its layer
    under_calls = [
        k for k, c in zip(kernels, chains, strict=True) if c[1]["kind"] == "library_call"
    ]
    assert len(under_calls) > 100
    assert all(
        k["module_path"] == c[1]["module_path"]
        for k, c in zip(kernels, chains, strict=True)
        if c[1]["kind"] == "library_call"
    )
    assert report.counts_by_level["gpu"] == 339


def test_onednn_verbose_lines_become_timed_library_calls() -> None:
    from xsp.tracer.capture.levels.onednn import parse_verbose_line

    line = (
        "onednn_verbose,v1,1796009213936.961914,primitive,exec,cpu,convolution,jit:avx512_core,"
        "forward_training,src:f32:a:blocked:abcd::f0 wei:f32:ap:blocked:Acdb16a::f0,"
        "attr-scratchpad:user,alg:convolution_direct,"
        "mb2_ic3oc8_ih32oh30kh3sh1dh0ph0_iw32ow30kw3sw1dw0pw0,0.296143\n"
    )
    start, end, primitive, detail = parse_verbose_line(line)  # type: ignore[misc]
    assert primitive == "convolution"
    assert abs(start - 1796009213936961914) < 1000 and abs((end - start) - 296143) < 1000
    assert detail.startswith("jit:avx512_core forward_training alg:convolution_direct mb2_ic3oc8")
    assert parse_verbose_line("onednn_verbose,v1,info,oneDNN v3.13.3\n") is None
    untimed = "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src dst,,,8x3,0.01\n"
    assert parse_verbose_line(untimed) is None


def test_backward_nodes_get_their_sequence_number_and_forward_thread() -> None:
    from xsp.core.arena import link_backward_nodes
    from xsp.core.records import FrameworkRecords

    records = FrameworkRecords()
    for name, start, end, thread, seq in (
        ("aten::mm", 0, 5, 11, 5),
        ("autograd::engine::evaluate_function: MmBackward0", 10, 20, 22, -1),
        ("MmBackward0", 11, 19, 22, 5),
        ("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 21, 22, 22, -1),
    ):
        records.name.append(name)
        records.start_ns.append(start)
        records.end_ns.append(end)
        records.thread.append(thread)
        records.fwd_thread.append(-1)
        records.seq_nr.append(seq)
    link_backward_nodes(records)
    assert list(records.seq_nr) == [5, 5, 5, -1]
    assert list(records.fwd_thread) == [-1, 11, -1, -1]


def test_arrow_columns_round_trip_numbers_strings_and_nulls() -> None:
    import numpy as np
    import pyarrow as pa

    from xsp.core.columns import arrow, numbers, scalar

    ints = arrow(np.array([5, 6, 7, 8]), pa.int32(), mask=np.array([False, True, False, False]))
    assert ints.type == pa.int32() and ints.to_pylist() == [5, None, 7, 8]
    assert numbers(ints.slice(1), null=-1).tolist() == [-1, 7, 8]  # an offset slice
    assert arrow(["a", None, "ccc"], pa.string()).to_pylist() == ["a", None, "ccc"]
    assert arrow([b"\x01" * 16, None], pa.binary(16)).to_pylist() == [b"\x01" * 16, None]
    flags = arrow(np.array([True, False, True]))
    assert flags.type == pa.bool_() and numbers(flags.slice(1)).tolist() == [False, True]
    assert scalar("x", pa.string()).as_py() == "x" and scalar(3, pa.int64()).as_py() == 3
    with pytest.raises(ValueError, match="has nulls"):
        numbers(ints)


def test_string_columns_from_codes_equal_those_spelled_out_row_by_row() -> None:
    """A service's exporter builds its span names and kinds from one code a row (``dictionary``)
    instead of one encoded copy a row; the columns must be the same, nulls and masks included."""
    import numpy as np
    import pyarrow as pa

    from xsp.core.columns import arrow, dictionary, repeated

    names = ["model", "conv", None, "model", "relu", "conv"] * 20
    mask = np.zeros(len(names), dtype=bool)
    mask[4] = True
    spelled = pa.array(names, pa.string()).to_pylist()
    assert arrow(names, pa.string()).to_pylist() == spelled  # 120 rows: the coded path
    masked = arrow(names, pa.string(), mask=mask).to_pylist()
    assert masked[4] is None and masked[:4] + masked[5:] == spelled[:4] + spelled[5:]
    coded = dictionary(names)
    assert coded is not None
    assert coded.equals(pa.array(names, pa.string()).dictionary_encode())
    assert dictionary([1, True, "x"] * 30) is None  # 1 and True are one key; spelled out instead
    assert arrow([1, True, "x"] * 30, pa.string()).to_pylist()[:3] == ["1", "True", "x"]
    assert repeated("model", 3).dictionary_decode().to_pylist() == ["model"] * 3


def test_equals_finds_a_value_in_dictionary_and_plain_string_columns() -> None:
    import pyarrow as pa

    from xsp.core.columns import equals

    # two chunks with their own dictionaries (as a table read back from parts has), a null, and
    # a sliced chunk whose indices start at an offset
    first = pa.array(["framework", "gpu", None, "framework"]).dictionary_encode()
    second = pa.array(["gpu", "gpu", "framework"]).dictionary_encode().slice(1)
    column = pa.chunked_array([first, second])
    assert equals(column, "framework").tolist() == [True, False, False, True, False, True]
    plain = pa.array(["a", None, "b", "a"])
    assert equals(plain, "a").tolist() == [True, False, False, True]
    assert equals(pa.chunked_array([], pa.string()), "a").tolist() == []


def test_empty_columns_share_one_buffer_and_store_as_nulls_of_their_types(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pyarrow as pa
    import pyarrow.parquet as pq

    from xsp.core import store
    from xsp.core.columns import NullColumns

    empty = NullColumns(1000)
    columns = [empty(f.type) for f in schema.SPAN_SCHEMA]
    for field_, column in zip(schema.SPAN_SCHEMA, columns, strict=True):
        column.validate(full=True)
        assert column.type == field_.type and column.null_count == len(column) == 1000
    # the fixed-width ones hold no memory of their own: one zeroed buffer serves all of them
    fixed = [c for c in columns if pa.types.is_integer(c.type) or pa.types.is_floating(c.type)]
    assert len(fixed) > 20 and len({c.buffers()[1].address for c in fixed}) == 1
    table = pa.Table.from_arrays(columns, schema=schema.SPAN_SCHEMA)
    path = store.write_span_part(tmp_path, table)
    back = pq.read_table(path, schema=schema.SPAN_SCHEMA)
    assert back.num_rows == 1000
    assert all(back[f.name].null_count == 1000 for f in schema.SPAN_SCHEMA)

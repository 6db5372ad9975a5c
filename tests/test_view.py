"""The layout sent to trace viewers (xsp.tracer.export.view): short kernel names, one service per
level, each layer's backward under a span of its own, all undone by the decoder; and ``xsp push``
with its progress and its Jaeger link."""

from __future__ import annotations

import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner

from tests.fixtures import fixture_table, http_collector, write_run
from xsp.collector import writer
from xsp.core import otlp, schema, store
from xsp.tracer.export import otlp_layout
from xsp.tracer.export.kernel_names import short_kernel_name
from xsp.tracer.export.sinks import OtlpSink, SpanBatch
from xsp.tracer.export.view import ADDED_COLUMN, with_backward_layers

ROOT = Path(__file__).resolve().parents[1]
MEASUREMENT = ROOT / "benchmarks/data/replay-h200/r50-b64-train"
RESOURCE = {
    schema.RES_SERVICE_NAME: "xsp",
    schema.RES_HOST_NAME: "view-host",
    schema.RES_RUN_ID: "view-MF",
    schema.RES_MEASUREMENT_ID: "view",
    schema.RES_LEVELS: "MF",
    schema.RES_WORKLOAD: "torchvision:resnet18",
}


@pytest.mark.parametrize(
    ("name", "short"),
    [
        (
            "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float, "
            "cudnnTensorStruct, float const*, float*, float const*, float)",
            "bn_bw_1C11_kernel_new",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>,"
            " std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, "
            "std::array<char*, 3ul>)",
            "vectorized_elementwise_kernel<CUDAFunctor_add>",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)"
            "::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, "
            "at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::"
            "operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, "
            "{lambda(float)#1}, std::array<char*, 2ul>)",
            "vectorized_elementwise_kernel<launch_clamp_scalar>",
        ),
        (
            "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, "
            "(cudnnKernelDataType_t)0>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, "
            "float const*, float*)",
            "nchwToNhwcKernel",
        ),
        (
            "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_tn_align4>("
            "cutlass_80_tensorop_s1688gemm_128x128_32x3_tn_align4::Params)",
            "Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_tn_align4>",
        ),
        (
            "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true, "
            "false>(float*, float const*, int, int, int, bool const*, int, bool)",
            "softmax_warp_forward",
        ),
        (
            "_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11thread"
            "block22ImplicitGemmMultistageINS_4gemm9GemmShapeILi64ELi128ELi16EEEEEEEEvNT_6ParamsE",
            "Kernel<ImplicitGemmConvolution>",
        ),
        # plain C names are their configuration: kept whole
        (
            "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1_execute"
            "_segment_k_off_kernel__5x_cublas",
            "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1_execute"
            "_segment_k_off_kernel__5x_cublas",
        ),
        ("Memset", "Memset"),
    ],
)
def test_kernel_names_are_shortened_to_their_function(name: str, short: str) -> None:
    assert short_kernel_name(name) == short


@pytest.fixture(scope="module")
def rebuilt() -> pa.Table:
    """The committed H200 measurement's reconstruction (ResNet-50 training, batch 64, 20
    iterations of 737 kernels each)."""
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.reconstruction.reconstruct import reconstruct

    return reconstruct(MeasurementStore(MEASUREMENT))[0]


def _kernels_under_a_layer(table: pa.Table) -> int:
    rows = table.select(["trace_id", "span_id", "parent_span_id", "kind"]).to_pylist()
    by_id = {(r["trace_id"], r["span_id"]): r for r in rows}
    count = 0
    for row in rows:
        if row["kind"] != schema.KIND_KERNEL:
            continue
        above = by_id.get((row["trace_id"], row["parent_span_id"]))
        while above is not None and above["kind"] != schema.KIND_MODULE:
            above = by_id.get((above["trace_id"], above["parent_span_id"]))
        count += above is not None
    return count


def test_backward_kernels_move_under_their_layers(rebuilt: pa.Table) -> None:
    """Of 737 kernels an iteration, 302 (the forward's) have a layer above them as stored; with
    each layer's backward span, 722 do: the rest are the loss's, the optimizer's and the
    gradient accumulation's, which autograd attributes to no layer."""
    viewed = with_backward_layers(rebuilt)
    assert _kernels_under_a_layer(rebuilt) == 302 * 20
    assert _kernels_under_a_layer(viewed) == 722 * 20
    added = viewed.filter(pc.fill_null(viewed.column(ADDED_COLUMN), False)).to_pylist()
    assert len(added) == 182 * 20  # ResNet-50's 183 layer calls less the model's own
    first = [s for s in added if s["iteration"] == 0]
    names = Counter(s["name"] for s in first)
    # a Bottleneck's ReLU runs three times: three backward spans, as three forward calls
    assert names["layer4.2.relu (backward)"] == 3 and names["fc (backward)"] == 1
    assert {s["kind"] for s in first} == {"module"} and {s["phase"] for s in first} == {"backward"}
    rows = {(r["trace_id"], r["span_id"]): r for r in viewed.to_pylist() if r["iteration"] == 0}
    layer = next(s for s in first if s["name"] == "layer4.2.conv2 (backward)")
    assert layer["module_type"] == "Conv2d"
    assert rows[(layer["trace_id"], layer["parent_span_id"])]["name"] == "layer4.2 (backward)"
    children = [r for r in rows.values() if r["parent_span_id"] == layer["span_id"]]
    assert children and all(r["kind"] == "backward" for r in children)
    for child in children:  # a layer's span covers its nodes
        assert layer["start_ns"] <= child["start_ns"]
        assert child["start_ns"] + child["dur_ns"] <= layer["start_ns"] + layer["dur_ns"]


def test_gradient_accumulation_is_gathered_under_one_span_a_step(rebuilt: pa.Table) -> None:
    """ResNet-50's 161 parameters each have an ``AccumulateGrad`` node at the root of the step:
    with the layers' backward spans, 161 of the step's 180 children. They move under one span
    "gradient accumulation" a step, which covers them; the step keeps 20 children."""
    from xsp.tracer.export.view import GRADIENT_ACCUMULATION, for_viewer

    laid_out = for_viewer(rebuilt)
    added = laid_out.filter(pc.fill_null(laid_out.column(ADDED_COLUMN), False))
    assert added.num_rows == (182 + 1) * 20
    rows = [r for r in laid_out.to_pylist() if r["iteration"] == 0]
    by_id = {r["span_id"]: r for r in rows}
    (step,) = [r for r in rows if r["kind"] == "step"]
    children = [r for r in rows if r["parent_span_id"] == step["span_id"]]
    assert len(children) == 20
    (gathered,) = [r for r in children if r["name"] == GRADIENT_ACCUMULATION]
    assert (gathered["kind"], gathered["phase"], gathered["level"]) == (
        "backward",
        "backward",
        "framework",
    )
    nodes = [r for r in rows if r["parent_span_id"] == gathered["span_id"]]
    assert len(nodes) == 161
    assert all(r["name"].endswith("torch::autograd::AccumulateGrad") for r in nodes)
    assert {r["view_stored_parent"] for r in nodes} == {f"{step['span_id']:016x}"}
    assert gathered["start_ns"] == min(r["start_ns"] for r in nodes)
    assert gathered["start_ns"] + gathered["dur_ns"] == max(
        r["start_ns"] + r["dur_ns"] for r in nodes
    )
    assert all(by_id[r["parent_span_id"]] is gathered for r in nodes)


def test_the_collector_stores_the_laid_out_step_as_the_tracer_did(rebuilt: pa.Table) -> None:
    """The round trip: one replayed ResNet-50 step sent laid out (backward layers, gradient
    accumulation gathered) and decoded by the collector is the stored step, parents included."""
    step = rebuilt.filter(pc.equal(rebuilt.column("iteration"), 0))
    transport = _Collecting()
    resource = {**RESOURCE, schema.RES_LEVELS: "reconstructed"}
    sink = OtlpSink(transport)
    sink.export(SpanBatch.of(resource, step))
    assert sink.view_spans_sent == 182 + 1
    sent = [
        span
        for request in transport.requests
        for rs in request.resource_spans
        for span in rs.scope_spans[0].spans
    ]
    assert sum(span.name == "gradient accumulation" for span in sent) == 1
    back = pa.concat_tables(
        [table for request in transport.requests for _, _, table in writer.convert(request)]
    )
    columns = ["span_id", "parent_span_id", "name", "start_ns", "dur_ns", "kind"]
    assert back.num_rows == step.num_rows
    assert sorted(back.select(columns).cast(_plain(back, columns)).to_pylist(), key=_key) == sorted(
        step.select(columns).cast(_plain(step, columns)).to_pylist(), key=_key
    )


class _Collecting:
    """A transport that keeps the requests."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    def send(self, request: Any) -> None:
        self.requests.append(request)

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def mf_table() -> pa.Table:
    return fixture_table("resnet18_train_cpu", "MF", "view-MF")


def test_each_level_is_a_service_and_the_decoder_restores_the_stored_spans(
    mf_table: pa.Table,
) -> None:
    transport = _Collecting()
    sent: list[int] = []
    sink = OtlpSink(transport, max_spans_per_request=500, on_sent=sent.append)
    sink.export(SpanBatch.of(RESOURCE, mf_table))
    assert sum(sent) == sink.spans_sent == mf_table.num_rows
    assert sink.view_spans_sent > 0 and len(transport.requests) == sink.requests_sent > 1
    services: Counter[str] = Counter()
    spans: dict[bytes, dict[bytes, Any]] = {}
    for request in transport.requests:
        for resource_spans in request.resource_spans:
            resource = {kv.key: kv.value for kv in resource_spans.resource.attributes}
            service = resource["service.name"].string_value
            assert resource[schema.RES_SERVICE_BASE].string_value == "xsp"
            assert resource["ip"].string_value == "view-host"  # one host key: no clock skew
            for span in resource_spans.scope_spans[0].spans:
                level = next(
                    kv.value.string_value for kv in span.attributes if kv.key == "xsp.level"
                )
                assert service == f"xsp.{level}"
                services[service] += 1
                spans.setdefault(span.trace_id, {})[span.span_id] = span
    assert set(services) == {"xsp.model", "xsp.framework"}
    assert services["xsp.model"] == 1  # resnet18_train_cpu holds one iteration
    for trace in spans.values():  # parents resolve within the trace, across the services
        assert all(s.parent_span_id in trace for s in trace.values() if s.parent_span_id)
    # the collector stores one run, spans as the tracer stored them
    converted = [item for request in transport.requests for item in writer.convert(request)]
    assert {key for key, _, _ in converted} == {("view", "MF")}
    senders = [sender for _, run_senders, _ in converted for sender in run_senders]
    assert all(sender.attributes == {**RESOURCE, "ip": "view-host"} for sender in senders)
    back = pa.concat_tables([table for _, _, table in converted])
    columns = ["span_id", "parent_span_id", "name", "start_ns", "dur_ns", "kind", "phase"]
    assert back.num_rows == mf_table.num_rows
    assert sorted(back.select(columns).cast(_plain(back, columns)).to_pylist(), key=_key) == sorted(
        mf_table.select(columns).cast(_plain(mf_table, columns)).to_pylist(), key=_key
    )


def _plain(table: pa.Table, columns: list[str]) -> pa.Schema:
    return pa.schema(
        [
            pa.field(c, pa.string() if pa.types.is_dictionary(table.schema.field(c).type) else
                     table.schema.field(c).type)
            for c in columns
        ]
    )  # fmt: skip


def _key(row: dict[str, Any]) -> int:
    return int(row["span_id"])


def test_a_shortened_kernel_keeps_its_name_as_an_attribute() -> None:
    full = "void cudnn::bn_fw_tr_1C11_singleread<float, 512, true, 1, 2, 0>(cudnn::args<float>)"
    table = pa.Table.from_pylist(
        [
            {"trace_id": b"\1" * 16, "span_id": 1, "parent_span_id": 0, "name": "step",
             "start_ns": 10, "dur_ns": 50, "level": "model", "kind": "step", "iteration": 0},
            {"trace_id": b"\1" * 16, "span_id": 2, "parent_span_id": 1, "name": full,
             "start_ns": 20, "dur_ns": 5, "level": "gpu", "kind": "kernel", "iteration": 0},
        ],
        schema=schema.SPAN_SCHEMA,
    )  # fmt: skip
    request = otlp_layout.encode_request(RESOURCE, table, view=True)
    json_request = otlp_layout.encode_request_json(RESOURCE, table, view=True)
    assert otlp.request_to_json(request) == json_request
    (gpu,) = [rs for rs in request.resource_spans if rs.resource.attributes[0].value.string_value
              == "xsp.gpu"]  # fmt: skip
    kernel = gpu.scope_spans[0].spans[0]
    assert kernel.name == "bn_fw_tr_1C11_singleread"
    assert {kv.key: kv.value.string_value for kv in kernel.attributes}["xsp.kernel.name"] == full
    ((_, _, stored),) = writer.convert(request)  # the levels' services: one run, one table
    assert full in stored.column("name").to_pylist()
    plain = otlp_layout.encode_request(RESOURCE, table)  # as stored: one service, the full name
    assert (
        len(plain.resource_spans) == 1
        and plain.resource_spans[0].scope_spans[0].spans[1].name == full
    )


def test_push_to_the_collector_shows_progress_and_prints_no_jaeger_link(
    mf_table: pa.Table, tmp_path: Path
) -> None:
    """The xsp collector is no Jaeger: ``xsp push`` asks the UI's API and prints no link, neither
    at the default UI (the endpoint's host, port 16686) nor at a ``--ui`` that is no Jaeger."""
    from xsp.cli import main as cli_main

    write_run(tmp_path / "run", "MF", mf_table, RESOURCE)
    collector = http_collector(tmp_path / "collected", flush_interval_s=0.1)
    try:
        endpoint = f"http://127.0.0.1:{collector.http_port}"
        pushed = CliRunner().invoke(
            cli_main,
            ["push", str(tmp_path / "run" / "MF"), "--endpoint", endpoint, "--ui", endpoint],
        )
    finally:
        collector.stop()
    assert pushed.exit_code == 0, pushed.output
    assert f"sent {mf_table.num_rows} spans and " in pushed.stderr
    assert "open in Jaeger" not in pushed.stdout and pushed.stdout == ""
    assert f"no link: no Jaeger UI answers at {endpoint} (--ui URL names one)" in pushed.stderr
    (run,) = store.open_measurement(tmp_path / "collected" / "view")
    assert run.spans().num_rows == mf_table.num_rows  # as stored
    assert run.resource[schema.RES_SERVICE_NAME] == "xsp"


def test_the_search_link_asks_for_the_roots_within_a_span_budget(mf_table: pa.Table) -> None:
    """The link searches the model service for the pushed level set's root operation over the
    run's time range (microseconds), and lists as many traces as keep the search within
    ``SEARCH_SPAN_BUDGET`` spans."""
    from xsp.cli.jaeger_link import SEARCH_SPAN_BUDGET, default_ui, search_link

    assert default_ui("http://10.0.0.5:4318") == "http://10.0.0.5:16686"
    assert default_ui("grpc://[::1]:4317") == "http://[::1]:16686"
    batch = SpanBatch.of(RESOURCE, mf_table)
    link = search_link("http://jaeger:80/", [batch], True, 8192)
    assert link is not None
    url = urllib.parse.urlsplit(link.url)
    assert url.netloc == "jaeger:80" and url.path == "/search"
    query = dict(urllib.parse.parse_qsl(url.query))
    start = pc.min(mf_table.column("start_ns")).as_py()
    end = pc.max(pc.add(mf_table.column("start_ns"), mf_table.column("dur_ns"))).as_py()
    assert query["service"] == "xsp.model" and query["lookback"] == "custom"
    assert query["operation"] == "torchvision:resnet18 · MF (traced)"
    assert int(query["start"]) == start // 1000 and int(query["end"]) == -(-end // 1000)
    per_trace = Counter(mf_table.column("trace_id").to_pylist())
    assert link.traces == len(per_trace) == 1
    assert int(query["limit"]) == link.limit == 1  # all of them: within the budget
    # a run of 20 iterations of 5,000 spans each: one of them
    many = pa.concat_tables(
        [_retraced(mf_table.slice(0, 1).take([0] * 5_000), bytes([i + 1]) * 16) for i in range(20)]
    )
    link = search_link("http://jaeger:80", [SpanBatch.of(RESOURCE, many)], True, 8192)
    assert link is not None and link.traces == 20
    assert link.limit == SEARCH_SPAN_BUDGET // 5_000 == 1
    assert "limit=1" in link.url
    # a folded trace holds at most --max-spans-per-trace spans
    folded = search_link("http://jaeger:80", [SpanBatch.of(RESOURCE, many)], True, 1_000)
    assert folded is not None and folded.limit == SEARCH_SPAN_BUDGET // 1_000 == 8


def _retraced(table: pa.Table, trace_id: bytes) -> pa.Table:
    at = table.schema.get_field_index("trace_id")
    return table.set_column(at, "trace_id", pa.array([trace_id] * table.num_rows, pa.binary(16)))


def test_a_moved_span_without_a_valid_stored_parent_is_refused_at_the_door(
    mf_table: pa.Table,
) -> None:
    from xsp.collector import ingest_view

    transport = _Collecting()
    OtlpSink(transport).export(SpanBatch.of(RESOURCE, mf_table))
    (request,) = transport.requests
    moved = next(
        kv
        for rs in request.resource_spans
        for span in rs.scope_spans[0].spans
        for kv in span.attributes
        if kv.key == schema.ATTR_VIEW_STORED_PARENT
    )
    assert otlp.validate(request) > mf_table.num_rows
    moved.value.string_value = "not-a-span-id"
    message = "xsp.view.stored_parent 'not-a-span-id' is not a span id of 16 hex digits"
    with pytest.raises(otlp.DecodeError, match=message):
        otlp.validate(request)
    with pytest.raises(otlp.DecodeError, match=message):
        ingest_view.check(request.SerializeToString())

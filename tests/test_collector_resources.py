"""A collected run's senders' resources live in ``resources-<part>.parquet`` beside each span
part, so run.json stays small however many senders a run has (issue 51); a store an older
collector wrote, with them all in run.json's "resources", still reads and grows."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from tests.test_collector import _resource, _table
from xsp.collector import writer
from xsp.collector.writer import StoreWriter
from xsp.core.store import RUN_META, RunMeta, open_run, read_json, read_run_meta, write_run_meta
from xsp.tracer.export import otlp_layout
from xsp.tracer.export.formats.base import by_sender


def _request(host: str, trace: int) -> writer.Converted:
    base = _table("r").slice(0, 20)
    ids = pa.array([trace.to_bytes(16, "big")] * base.num_rows, pa.binary(16))
    resource = {**_resource("r"), "host.name": host}
    return writer.convert(otlp_layout.encode_request(resource, base.set_column(0, "trace_id", ids)))


def test_many_senders_keep_run_json_small_and_come_back_by_id(tmp_path: Path) -> None:
    store = StoreWriter(tmp_path / "store")
    run_dir = tmp_path / "store" / "m-r" / "MF"
    for part in range(3):
        batch = [_request(f"h{part}-{k}", part * 100 + k) for k in range(50)]
        assert store.write(f"p{part}", batch) == 50 * 20
    meta = read_json(run_dir / RUN_META)
    assert "resources" not in meta and meta["resources_in_parts"] is True
    assert (run_dir / RUN_META).stat().st_size < 2000
    assert meta["resource"]["host.name"] == "h0-0"  # the run's first sender, as before
    assert len(list(run_dir.glob("resources-*.parquet"))) == 3
    run = open_run(run_dir)
    assert run.resources is not None and len(run.resources) == 150
    batches = by_sender(run.resources, run.resource, run.spans())
    hosts = sorted(str(b.resource["host.name"]) for b in batches)
    assert hosts == sorted(f"h{p}-{k}" for p in range(3) for k in range(50))


def test_an_older_collectors_run_json_resources_still_read_and_grow(tmp_path: Path) -> None:
    store = StoreWriter(tmp_path / "store")
    run_dir = tmp_path / "store" / "m-r" / "MF"
    store.write("p0", [_request("old", 1)])
    # as an older collector left it: every sender in run.json, no resources part
    ((_, (sender,), _),) = writer.convert(
        otlp_layout.encode_request({**_resource("r"), "host.name": "old"}, _table("r").slice(0, 1))
    )
    for part in run_dir.glob("resources-*.parquet"):
        part.unlink()
    meta = read_run_meta(run_dir / RUN_META)
    old = RunMeta.from_json({**meta.to_json(), "resources": {sender.id: sender.typed}})
    old = RunMeta.from_json({k: v for k, v in old.to_json().items() if k != "resources_in_parts"})
    write_run_meta(run_dir / RUN_META, old)
    assert open_run(run_dir).resources == {sender.id: sender.typed}
    StoreWriter(tmp_path / "store").write("p1", [_request("new", 2)])
    meta = read_json(run_dir / RUN_META)
    assert list(meta["resources"]) == [sender.id]  # kept, not grown
    assert meta["resource"]["host.name"] == "old"
    run = open_run(run_dir)
    assert run.resources is not None
    assert sorted(
        str(b.resource["host.name"]) for b in by_sender(run.resources, run.resource, run.spans())
    ) == ["new", "old"]


def test_a_request_of_many_senders_is_one_table_a_run_each_span_naming_its_sender(
    tmp_path: Path,
) -> None:
    # senders h0, h1 (run r), then one of run s, then h3 (run r): r, s, r, whichever decoder
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    from xsp.core import otlp
    from xsp.core.otlp import columns as otlp_columns

    base = _table("r").slice(0, 40)
    request = ExportTraceServiceRequest()
    for k, run in enumerate("rrsr"):
        resource = {**_resource(run), "host.name": f"h{k}"}
        rows = base.slice(10 * k, 10)
        request.resource_spans.extend(otlp_layout.encode_request(resource, rows).resource_spans)
    body = request.SerializeToString()
    (together,) = writer.convert_together([otlp_columns.parse_request(body)]) or [[]]
    for converted in (together, writer.convert(otlp.parse_protobuf(body))):
        runs = [
            (key, [s.attributes["host.name"] for s in senders]) for key, senders, _ in converted
        ]
        assert runs == [
            (("m-r", "MF"), ["h0", "h1"]),
            (("m-s", "MF"), ["h2"]),
            (("m-r", "MF"), ["h3"]),
        ]
        assert [table.num_rows for _, _, table in converted] == [20, 10, 10]
        first = converted[0]
        ids = first.table.column("resource_id").to_pylist()
        assert ids == [first.senders[0].id] * 10 + [first.senders[1].id] * 10
    store = StoreWriter(tmp_path / "store")
    assert store.write("p0", [together]) == 40
    run = open_run(tmp_path / "store" / "m-r" / "MF")
    assert run.resources is not None
    hosts = {
        str(b.resource["host.name"]): b.table.num_rows
        for b in by_sender(run.resources, run.resource, run.spans())
    }
    assert hosts == {"h0": 10, "h1": 10, "h3": 10}

"""The collector stores each (trace_id, span_id) of a run once, however often it is received
(issue 12, item 14): over another protocol or batching, after a restart, through ``xsp push``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from tests.fixtures import fixture_table, free_ports, make_collector, start_collector, write_run
from tests.test_collector import _post, _resource, _table
from xsp.collector import writer
from xsp.collector.spool import Spool
from xsp.collector.store_worker import store_requests
from xsp.collector.writer import StoreWriter
from xsp.core import otlp
from xsp.core.store import RUN_META, read_json
from xsp.tracer.export import otlp_layout

ROOT = Path(__file__).resolve().parents[1]
SPANS = 1791  # spans in one resnet18_train_cpu MF run


def _keys(run_dir: Path) -> list[tuple[bytes, int]]:
    rows = pa.concat_tables(
        pq.read_table(p, columns=["trace_id", "span_id"])
        for p in sorted(run_dir.glob("spans-*.parquet"))
    )
    return list(
        zip(rows.column("trace_id").to_pylist(), rows.column("span_id").to_pylist(), strict=True)
    )


def _assert_once(run_dir: Path, table: pa.Table) -> None:
    stored = _keys(run_dir)
    expected = zip(
        table.column("trace_id").to_pylist(), table.column("span_id").to_pylist(), strict=True
    )
    assert len(stored) == len(set(stored)) == table.num_rows
    assert set(stored) == set(expected)
    assert read_json(run_dir / RUN_META)["spans"] == table.num_rows


def test_http_protobuf_then_grpc_in_other_batches_is_stored_once(tmp_path: Path) -> None:
    table = _table("a")
    c = make_collector(tmp_path).start()
    try:
        assert (
            _post(
                c.http_port, otlp_layout.encode_request(_resource("a"), table).SerializeToString()
            )[0]
            == 200
        )
        c.flush()
        with grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}") as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            for first in range(0, SPANS, 700):  # the same spans, batched otherwise
                part = table.slice(first, 700)
                stub.Export(otlp_layout.encode_request(_resource("a"), part), timeout=10)
        backwards = table.take(pa.array(range(SPANS - 1, -1, -1)))  # else the spool's retry
        as_json = json.dumps(
            otlp.request_to_json(otlp_layout.encode_request(_resource("a"), backwards))
        )
        assert _post(c.http_port, as_json.encode(), "application/json")[0] == 200
    finally:
        c.stop()
    assert c.accepted_spans == 3 * SPANS  # every copy acknowledged
    assert c.duplicate_spans == 2 * SPANS  # ... and the second and third left out
    run_dir = tmp_path / "store" / "m-a" / "MF"
    _assert_once(run_dir, table)
    assert read_json(run_dir / RUN_META)["duplicate_spans_skipped"] == 2 * SPANS


def test_a_restart_after_the_first_copy_was_flushed_stores_it_once(tmp_path: Path) -> None:
    table = _table("r")
    body = otlp_layout.encode_request(_resource("r"), table).SerializeToString()
    counts = []
    for _ in range(3):  # the later starts know the parts only from the disk
        c = make_collector(tmp_path).start()
        try:
            assert _post(c.http_port, body)[0] == 200
        finally:
            c.stop()
        counts.append(c.duplicate_spans)
    assert counts == [0, SPANS, SPANS]
    run_dir = tmp_path / "store" / "m-r" / "MF"
    _assert_once(run_dir, table)
    assert read_json(run_dir / RUN_META)["duplicate_spans_skipped"] == 2 * SPANS


def test_replicas_on_one_store_keep_their_own_spools_and_store_a_span_once(
    tmp_path: Path,
) -> None:
    """Two collector replicas sharing a store: each spools in its own directory and names its
    parts after itself, and each leaves out the spans the other already stored, as it does its
    own; run.json counts both replicas' parts."""
    table = _table("s")
    first, second = table.slice(0, 1000), table.slice(1000)
    r1 = make_collector(tmp_path, replica="r1").start()
    r2 = make_collector(tmp_path, replica="r2").start()
    try:
        for collector, part in ((r1, first), (r2, table), (r1, second), (r2, first)):
            body = otlp_layout.encode_request(_resource("s"), part).SerializeToString()
            assert _post(collector.http_port, body)[0] == 200
            collector.flush()
    finally:
        r1.stop()
        r2.stop()
    store = tmp_path / "store"
    assert {p.name for p in store.iterdir() if p.name.startswith(".")} == {".spool-r1", ".spool-r2"}
    run_dir = store / "m-s" / "MF"
    assert sorted(p.name.rsplit("-", 1)[1] for p in run_dir.glob("spans-*")) == [
        "r1.parquet",
        "r2.parquet",
    ]  # r1's second and r2's second request were all duplicates: no part
    _assert_once(run_dir, table)
    assert (r1.duplicate_spans, r2.duplicate_spans) == (SPANS - 1000, 2000)
    assert read_json(run_dir / RUN_META)["duplicate_spans_skipped"] == SPANS - 1000 + 2000


def test_replaying_a_segment_already_written_keeps_its_spans(tmp_path: Path) -> None:
    # killed after the segment's part was written but before the segment was removed: the
    # replay rewrites that part, whose own spans must not count as already stored
    table = _table("k")
    c = make_collector(tmp_path, flush_interval_s=60)
    c.spool.append(otlp_layout.encode_request(_resource("k"), table).SerializeToString())
    segment = c.spool.rotate()
    assert segment is not None
    stored = store_requests(c.writer, Spool.part_name(segment), c.spool.read(segment))
    assert stored.duplicate_spans == 0
    c.spool.close()  # no stop(): the segment stays, as after kill -9
    again = make_collector(tmp_path).start()
    again.stop()
    assert again.duplicate_spans == 0
    assert not segment.exists()
    _assert_once(tmp_path / "store" / "m-k" / "MF", table)


def test_xsp_push_twice_to_collector_serve_stores_each_span_once(tmp_path: Path) -> None:
    table = fixture_table("resnet18_train_cpu", "MF", run_id="pushed")
    resource = {**_resource("pushed"), "xsp.workload": "resnet18"}
    write_run(tmp_path / "run", "MF", table, resource)
    store, (port,) = tmp_path / "store", free_ports(1)

    def push(protocol: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OTEL_EXPORTER_OTLP_PROTOCOL": protocol}
        done = subprocess.run(
            [
                *(sys.executable, "-m", "xsp", "push", str(tmp_path / "run" / "MF")),
                *("--endpoint", f"http://127.0.0.1:{port}"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr

    logs = []
    for protocol in ("http/protobuf", "http/json", "http/protobuf"):
        # xsp collector serve (a real store worker process), restarted between the pushes: the
        # spool's digests of the first push are gone, the parts are read back from the disk
        proc = start_collector(store, port)
        try:
            push(protocol)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        assert proc.stderr is not None
        logs.append(proc.stderr.read().decode())
    said = f"{table.num_rows} spans received again were not stored twice"
    assert [said in log for log in logs] == [False, True, True]
    run_dir = store / "m-pushed" / "MF"
    _assert_once(run_dir, table)
    assert read_json(run_dir / RUN_META)["duplicate_spans_skipped"] == 2 * table.num_rows


def test_unique_spans_are_stored_whole_even_when_every_hash_collides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = _table("u")

    def with_trace(table: pa.Table, n: int) -> pa.Table:
        trace = pa.array([n.to_bytes(16, "big")] * table.num_rows, pa.binary(16))
        return table.set_column(0, "trace_id", trace)

    def converted(table: pa.Table) -> writer.Converted:
        return writer.convert(otlp_layout.encode_request(_resource("u"), table))

    store = StoreWriter(tmp_path / "store")
    assert store.write("p1", [converted(with_trace(base, 1))]) == SPANS
    monkeypatch.setattr(writer, "key_hashes", lambda t: np.zeros(t.num_rows, np.uint64))
    # every hash now hits the index and the batch: only the exact check can keep these
    assert store.write("p2", [converted(with_trace(base, 2)), converted(with_trace(base, 3))]) == (
        2 * SPANS
    )
    assert store.duplicate_spans == 0
    # a real duplicate among them is still found: trace 1 again, trace 4 new, trace 4 repeated
    batch = [converted(with_trace(base, 1)), converted(with_trace(base, 4))]
    assert store.write("p3", [*batch, converted(with_trace(base, 4).slice(0, 10))]) == SPANS
    assert store.duplicate_spans == SPANS + 10
    run_dir = tmp_path / "store" / "m-u" / "MF"
    everything = pa.concat_tables([with_trace(base, n) for n in (1, 2, 3, 4)])
    _assert_once(run_dir, everything)
    meta = read_json(run_dir / RUN_META)
    assert meta["duplicate_spans_skipped"] == SPANS + 10
    assert meta["duplicate_spans_skipped_by_part"] == {"p3": SPANS + 10}


def test_the_index_is_bounded_and_reloaded_after_eviction(tmp_path: Path) -> None:
    base = _table("e").slice(0, 50)
    store = StoreWriter(tmp_path / "store", max_indexed_runs=2)

    def request(run: str) -> writer.Converted:
        return writer.convert(otlp_layout.encode_request(_resource(run), base))

    for part, run in enumerate("abcab"):
        store.write(f"p{part}", [request(run)])
    assert len(store._indexes) == 2
    assert store.spans_written == 3 * 50 and store.duplicate_spans == 2 * 50


def test_the_indexes_of_all_run_directories_hold_at_most_their_byte_budget(
    tmp_path: Path,
) -> None:
    # one part of 50 spans: 50 hashes of 8 bytes and its entry, 400 + 256 = 656 bytes; two
    # parts 1,312. A budget of 2,000 bytes holds three one-part directories, not four.
    base = _table("e").slice(0, 50)
    one, two = 50 * 8 + writer.PART_ENTRY_BYTES, 2 * (50 * 8 + writer.PART_ENTRY_BYTES)
    assert (one, two) == (656, 1312)
    store = StoreWriter(tmp_path / "store", max_index_bytes=2000)

    def write(part: str, run: str, trace: int = 0) -> int:
        request = otlp_layout.encode_request(_resource(run), _traced(base, trace))
        return store.write(part, [writer.convert(request)])

    def kept() -> dict[str, int]:
        return {path.parent.name[2:]: keys.nbytes for path, keys in store._indexes.items()}

    for part, run in enumerate("abc"):
        write(f"p{part}", run)
    assert kept() == {"a": one, "b": one, "c": one} and store.index_bytes == 1968
    write("p3", "d")  # 2,624 bytes: a, the least recently written, is dropped
    assert kept() == {"b": one, "c": one, "d": one}
    write("p4", "b", trace=1)  # b grows to two parts: c goes too
    assert kept() == {"d": one, "b": two} and store.index_bytes == 1968
    # a dropped index is read again from the parts: a's spans re-pushed are stored once (its
    # index now counts p5's duplicates too: 912 bytes, and b's 1,312 no longer fit beside it)
    assert write("p5", "a") == 0 and store.duplicate_spans == 50
    assert kept() == {"a": one + writer.PART_ENTRY_BYTES}
    # a directory bigger than the whole budget keeps its own index while it is written
    small = StoreWriter(tmp_path / "store", max_index_bytes=500)
    store = small
    assert write("p6", "b", trace=1) == 0 and kept() == {"b": two + writer.PART_ENTRY_BYTES}


def _traced(table: pa.Table, n: int) -> pa.Table:
    trace = pa.array([n.to_bytes(16, "big")] * table.num_rows, pa.binary(16))
    return table.set_column(0, "trace_id", trace)


def test_the_dedupe_window_is_bounded_and_holds_inside_it(tmp_path: Path) -> None:
    # window 100 spans, parts of 50: the newest 100 spans' parts are always indexed, and never
    # more than 200 hashes plus one part's
    base = _table("w").slice(0, 50)

    def request(n: int) -> writer.Converted:
        return writer.convert(otlp_layout.encode_request(_resource("w"), _traced(base, n)))

    store = StoreWriter(tmp_path / "store", dedupe_window=100)
    run_dir = tmp_path / "store" / "m-w" / "MF"
    for n in range(12):
        assert store.write(f"p{n:02d}", [request(n)]) == 50
        keys = store._indexes[run_dir]
        assert keys.hashes <= 200 + 50
        assert {f"p{n:02d}", f"p{max(n - 1, 0):02d}"} <= set(keys.indexed)
    assert keys.spans == 12 * 50 and len(keys.parts) == 12  # run.json still counts every part
    # inside the window: re-pushed (together, and after a restart) they are stored once
    assert store.write("q1", [request(10), request(11)]) == 0
    assert store.duplicate_spans == 100
    restarted = StoreWriter(tmp_path / "store", dedupe_window=100)
    assert restarted.write("q2", [request(11), request(10)]) == 0
    assert restarted._indexes[run_dir].hashes <= 250
    meta = read_json(run_dir / RUN_META)
    assert meta["spans"] == 12 * 50 and meta["duplicate_spans_skipped"] == 200


def test_a_span_re_pushed_beyond_the_dedupe_window_is_stored_again(tmp_path: Path) -> None:
    # what the window gives up: a copy whose original is older than the window's newest
    # spans is not recognised (stored twice, counted as two spans); nothing is lost
    base = _table("o").slice(0, 50)

    def request(n: int) -> writer.Converted:
        return writer.convert(otlp_layout.encode_request(_resource("o"), _traced(base, n)))

    store = StoreWriter(tmp_path / "store", dedupe_window=100)
    for n in range(8):
        store.write(f"p{n}", [request(n)])
    assert store.write("r", [request(0)]) == 50  # p0 left the index 250+ spans ago
    assert store.duplicate_spans == 0
    run_dir = tmp_path / "store" / "m-o" / "MF"
    assert len(_keys(run_dir)) == 9 * 50 and len(set(_keys(run_dir))) == 8 * 50
    assert read_json(run_dir / RUN_META)["spans"] == 9 * 50


def test_the_dedupe_window_is_a_setting() -> None:
    from xsp.core import config
    from xsp.core.errors import ConfigError

    assert config.collector_dedupe_spans({}) == config.DEFAULT_COLLECTOR_DEDUPE_SPANS == 2_000_000
    assert config.collector_dedupe_spans({"XSP_COLLECTOR_DEDUPE_SPANS": "5_000_000"}) == 5_000_000
    for bad in ("0", "-1", "lots"):
        with pytest.raises(ConfigError, match="XSP_COLLECTOR_DEDUPE_SPANS"):
            config.collector_dedupe_spans({"XSP_COLLECTOR_DEDUPE_SPANS": bad})
    assert config.collector_dedupe_index_bytes({}) == 256 * 1024 * 1024
    budget = {"XSP_COLLECTOR_DEDUPE_INDEX_MIB": "1_024"}
    assert config.collector_dedupe_index_bytes(budget) == 1 << 30
    for bad in ("0", "-1", "0.5", "lots"):
        with pytest.raises(ConfigError, match="XSP_COLLECTOR_DEDUPE_INDEX_MIB"):
            config.collector_dedupe_index_bytes({"XSP_COLLECTOR_DEDUPE_INDEX_MIB": bad})

"""A long burst reaches the store while it lasts: the spool closes a segment once it holds
``segment_bytes`` and wakes the flusher, so the store worker gets bounded pieces (each freeing
its spool space once stored) rather than everything that arrived while it stored the last one;
and a segment's requests are decoded together, into the tables each would have alone (issue 31)."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa

from tests.fixtures import make_collector
from tests.test_collector import _post, _resource, _table
from tests.test_collector_faults import _quarantine, _stored
from xsp.collector import writer
from xsp.collector.spool import Spool
from xsp.core import otlp, schema
from xsp.core.otlp import columns as otlp_columns
from xsp.tracer.export import otlp_layout


def test_a_full_segment_is_closed_and_handed_over_oldest_first(tmp_path: Path) -> None:
    woken = []
    spool = Spool(
        tmp_path / "spool",
        _quarantine(tmp_path),
        segment_bytes=100,
        on_closed=lambda: woken.append(1),
    )
    payloads = [bytes([i]) * 60 for i in range(5)]
    for payload in payloads:
        spool.append(payload)
    closed = spool.closed()
    assert len(closed) == 2 and len(woken) == 2  # 2 frames of 72 bytes fill a segment of 100
    assert [p for segment in closed for p in spool.read(segment)] == payloads[:4]
    assert spool.rotate() is not None
    (last,) = spool.closed()
    assert spool.read(last) == payloads[4:] and spool.closed() == []
    spool.close()


def test_a_burst_is_stored_while_it_lasts_not_after_the_flush_interval(tmp_path: Path) -> None:
    c = make_collector(tmp_path, flush_interval_s=60.0, segment_bytes=1).start()
    try:
        time.sleep(0.2)  # the first (replay) pass is done: the next comes in 60 s
        table = _table("burst")
        rows = 0
        for first in range(0, 600, 200):
            part = table.slice(first, 200)
            body = otlp_layout.encode_request(_resource("burst"), part).SerializeToString()
            assert _post(c.http_port, body)[0] == 200
            rows += part.num_rows
        deadline = time.monotonic() + 20
        while _stored(tmp_path / "store", "m-burst") < rows and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _stored(tmp_path / "store", "m-burst") == rows  # long before the 60 s interval
        assert c.spool.pending_bytes == 0
    finally:
        c.stop()


def _set_row(table: pa.Table, name: str, row: int, value: int) -> pa.Table:
    values = table.column(name).to_pylist()
    values[row] = value
    at = table.column_names.index(name)
    return table.set_column(at, name, pa.array(values, table.schema.field(name).type))


def test_requests_decoded_together_give_each_its_own_table() -> None:
    """Together as alone, including where a step's parent is a span of another request of the
    segment (to its own request, an application's span above it)."""
    table = _table("t")
    application = 0xABCDEF0123456789  # an id above the iteration roots' (an application's)
    first = _set_row(table.slice(150, 150), "span_id", 5, application)
    second = _set_row(table.slice(0, 150), "parent_span_id", 0, application)  # row 0: the step
    others = _resource("u") | {schema.RES_LEVELS: "MFLG"}
    bodies = [
        otlp_layout.encode_request(_resource("t"), first).SerializeToString(),
        otlp_layout.encode_request(_resource("t"), second).SerializeToString(),
        otlp_layout.encode_request(others, table.slice(10, 40)).SerializeToString(),
    ]
    mirrors = [otlp_columns.parse_request(body) for body in bodies]
    together = writer.convert_together(mirrors)
    assert together is not None
    alone = [writer.convert(otlp.parse_protobuf(body)) for body in bodies]
    for converted, expected in zip(together, alone, strict=True):
        assert [(k, s) for k, s, _ in converted] == [(k, s) for k, s, _ in expected]
        for (_, _, got), (_, _, want) in zip(converted, expected, strict=True):
            assert got.schema == want.schema  # values alike (a dictionary may hold more)
            assert got.to_pylist() == want.to_pylist()
    stored = together[1][0][2]
    assert stored.column("kind")[0].as_py() == "step"
    assert stored.column("remote_parent_span_id")[0].as_py() == application
    assert stored.column("parent_span_id")[0].as_py() == 0


def test_segment_one_million_of_a_start_is_replayed_and_named_after_its_number(
    tmp_path: Path,
) -> None:
    """Spool numbers segments ``{n:06d}``, so the millionth of one start has seven digits: a
    restart replays it after segment 999,999 (not quarantined as "not a spool segment") and
    its part is ``c<start>-1000000-<replica>``."""
    directory = tmp_path / "spool"
    spool = Spool(directory, _quarantine(tmp_path))
    spool.append(b"first")
    spool.rotate()
    spool.append(b"second")
    spool.rotate()
    spool.close()
    first, second = sorted(directory.glob("seg-*.log"))
    start = first.name.split("-")[1]
    last = first.rename(directory / f"seg-{start}-1000000.log")
    second.rename(directory / f"seg-{start}-999999.log")
    again = Spool(directory, _quarantine(tmp_path))
    assert [p.name for p in again.recovered] == [f"seg-{start}-999999.log", last.name]
    assert [again.read(p) for p in again.recovered] == [[b"second"], [b"first"]]
    assert Spool.part_name(last, "r1") == f"c{start}-1000000-r1"
    assert not (tmp_path / "store" / ".quarantine").exists()  # nothing set aside
    again.close()

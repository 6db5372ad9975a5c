"""The hostile pass (issue 51): the collector and the analyses against what any sender, a full
disk or any user of a shared directory can do to them, as one seeded, time-bounded pass.

``XSP_HOSTILE_SEED`` (default 51) picks each case's choices: which OpenTelemetry SDK exporters
send (OTLP over HTTP or gRPC) and how many spans a batch, when the collector is killed and by
which signal, the filesystem that fills and its size, the cycles of parent ids, and the crafted
directories. ``XSP_HOSTILE_SECONDS`` (default 90) is the whole pass's time, shared among its
cases by ``SHARES``. A failing case names the seed to rerun it with.

The promises checked (docs/collector.md's table names each case beside its promise):
- every span an SDK exporter was told SUCCESS for is stored, once (kills under load, full disk);
- the analyses of a store whose parent ids make cycles end, with one warning;
- no crafted run directory or store makes xsp write outside it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from click.testing import CliRunner
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind

from tests.fixtures import (
    FILESYSTEMS,
    fixture_table,
    free_ports,
    make_collector,
    small_filesystem,
    start_collector,
    write_run,
)
from tests.test_collector import _resource, _table
from tests.test_intervals import within
from tests.test_store_damage import _cyclic
from xsp.cli import main as cli_main
from xsp.tracer.export import otlp_layout

SEED = int(os.environ.get("XSP_HOSTILE_SEED", "51"))
SECONDS = float(os.environ.get("XSP_HOSTILE_SECONDS", "90"))
#: each case's share of the pass's time
SHARES = {"kills": 0.4, "full disk": 0.25, "cycles": 0.2, "crafted": 0.15}
PROTOCOLS = ("http", "grpc")
Key = tuple[bytes, int]
Request = trace_service_pb2.ExportTraceServiceRequest


@contextlib.contextmanager
def _case(name: str) -> Iterator[tuple[random.Random, float]]:
    """The case's random choices (from the seed and its name) and its seconds; a failure says
    the seed to rerun it with."""
    print(f"hostile case {name!r}: XSP_HOSTILE_SEED={SEED} XSP_HOSTILE_SECONDS={SECONDS:g}")
    try:
        yield random.Random(f"{SEED}:{name}"), SECONDS * SHARES[name]
    except Exception as exc:
        exc.add_note(
            f"hostile case {name!r} failed with XSP_HOSTILE_SEED={SEED}: rerun it with "
            f"XSP_HOSTILE_SEED={SEED} pytest tests/test_hostile.py"
        )
        raise


# -- the OpenTelemetry SDK as a sender -----------------------------------------------------------
class _SeededIds(IdGenerator):
    """The SDK's ids drawn from the case's seed, so a rerun sends the same spans."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def generate_span_id(self) -> int:
        return self._rng.getrandbits(64) | 1

    def generate_trace_id(self) -> int:
        return self._rng.getrandbits(128) | 1


def _exporter(protocol: str, http_port: int, grpc_port: int) -> Any:
    """The SDK's own OTLP exporter (the dev extra's opentelemetry-exporter-otlp)."""
    if protocol == "http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=f"http://127.0.0.1:{http_port}/v1/traces", timeout=4)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )

    return GrpcExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True, timeout=4)


def _key(span: ReadableSpan) -> Key:
    assert span.context is not None
    return span.context.trace_id.to_bytes(16, "big"), span.context.span_id


class _Sender:
    """One SDK exporter sending what an SDK tracer records, a batch at a time; a batch not
    answered SUCCESS is sent again, as a sender that keeps its spans does, until it is or the
    load ends. ``acked`` holds the keys of every span answered SUCCESS."""

    def __init__(self, protocol: str, ports: tuple[int, int], seed: int, batch: int) -> None:
        self.protocol, self.batch = protocol, batch
        self._exporter = _exporter(protocol, *ports)
        self._memory = InMemorySpanExporter()
        resource = Resource({"service.name": "hostile", "host.name": f"{protocol}-{seed}"})
        provider = TracerProvider(resource=resource, id_generator=_SeededIds(random.Random(seed)))
        provider.add_span_processor(SimpleSpanProcessor(self._memory))
        self._tracer = provider.get_tracer("xsp.tests.hostile")
        self._padding = random.Random(seed)
        self.acked: set[Key] = set()
        self.acked_at: list[float] = []  # when each batch was answered SUCCESS
        self.failures = 0
        self.padding_bytes = 0

    def _spans(self) -> list[ReadableSpan]:
        with self._tracer.start_as_current_span("step"):
            for j in range(self.batch - 1):
                with self._tracer.start_as_current_span(f"op{j % 7}") as span:
                    if self.padding_bytes:  # incompressible bytes, to fill a disk
                        padding = self._padding.randbytes(self.padding_bytes // 2).hex()
                        span.set_attribute("padding", padding)
        spans = list(self._memory.get_finished_spans())
        self._memory.clear()
        return spans

    def run(self, stop: threading.Event) -> None:
        spans = self._spans()
        while not stop.is_set():
            if self._exporter.export(spans) == SpanExportResult.SUCCESS:
                self.acked.update(_key(span) for span in spans)
                self.acked_at.append(time.monotonic())
                spans = self._spans()
            else:
                self.failures += 1
                time.sleep(0.05)
        self._exporter.shutdown()


def _load(senders: list[_Sender]) -> tuple[threading.Event, list[threading.Thread]]:
    stop = threading.Event()
    threads = [threading.Thread(target=s.run, args=(stop,), daemon=True) for s in senders]
    for thread in threads:
        thread.start()
    return stop, threads


def _end(stop: threading.Event, threads: list[threading.Thread]) -> None:
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive(), "a sender did not end"


def _stored_keys(store: Path) -> list[Key]:
    parts = sorted(store.glob("*/*/spans-*.parquet"))
    if not parts:
        return []
    rows = pa.concat_tables(pq.read_table(p, columns=["trace_id", "span_id"]) for p in parts)
    traces = rows.column("trace_id").to_pylist()
    return list(zip(traces, rows.column("span_id").to_pylist(), strict=True))


def _assert_acknowledged_stored_once(senders: list[_Sender], store: Path) -> None:
    stored = _stored_keys(store)
    assert len(stored) == len(set(stored)), f"{len(stored) - len(set(stored))} spans stored twice"
    acked = set().union(*(s.acked for s in senders))
    missing = acked - set(stored)
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged spans were not stored"


# -- 1. kills under load -------------------------------------------------------------------------
def test_sdk_exporters_through_kills_lose_nothing_acknowledged(tmp_path: Path) -> None:
    with _case("kills") as (rng, seconds):
        protocols = [rng.choice(PROTOCOLS) for _ in range(rng.randint(2, 3))]
        batch = rng.randint(20, 200)
        kills = [rng.choice(["SIGKILL", "SIGKILL", "SIGTERM"]) for _ in range(rng.randint(1, 2))]
        print(f"senders {protocols}, {batch} spans a batch, stopped by {kills}")
        store, ports = tmp_path / "store", tuple(free_ports(2))
        proc = start_collector(store, ports[0], ports[1])
        senders = [_Sender(p, ports, k, batch) for k, p in enumerate(protocols)]
        stop, threads = _load(senders)
        started = time.monotonic()
        try:
            for kill in kills:
                time.sleep(rng.uniform(0.15, 0.3) * seconds)
                proc.send_signal(getattr(signal, kill))
                proc.wait(timeout=60)
                proc = start_collector(store, ports[0], ports[1])
            restarted = time.monotonic()
            time.sleep(max(3.0, started + seconds - restarted))  # the load after the last start
            _end(stop, threads)
        finally:
            stop.set()
            proc.send_signal(signal.SIGTERM)  # stores everything acknowledged
            assert proc.wait(timeout=120) == 0
        print(
            f"acknowledged {sum(len(s.acked) for s in senders):,} spans, "
            f"{sum(s.failures for s in senders)} batches sent again"
        )
        for sender in senders:  # the load ran on both sides of the kills
            assert sender.acked_at[0] < restarted < sender.acked_at[-1], sender.protocol
        _assert_acknowledged_stored_once(senders, store)


# -- 2. a full disk ------------------------------------------------------------------------------
def test_a_full_disk_loses_no_acknowledged_span(tmp_path: Path) -> None:
    with _case("full disk") as (rng, seconds):
        kind = rng.choice(FILESYSTEMS)
        size = rng.choice([2, 3, 4] if kind == "tmpfs" else [6, 8]) * 1024 * 1024
        reserve = rng.choice([256, 512, 1024]) * 1024
        protocols = [rng.choice(PROTOCOLS) for _ in range(2)]
        print(f"{kind} of {size:,} bytes, {reserve:,} kept for the store, senders {protocols}")
        with small_filesystem(tmp_path / "disk", size, kind) as disk:
            c = make_collector(disk, spool_reserve_bytes=reserve).start()
            ports = (c.http_port, c.grpc_port)
            senders = [_Sender(p, ports, k, rng.randint(50, 200)) for k, p in enumerate(protocols)]
            for sender in senders:
                sender.padding_bytes = rng.choice([512, 2048])
            stop, threads = _load(senders)
            try:
                _until_full(c, rng.uniform(0.5, 2.0), time.monotonic() + seconds * 0.7)
                _end(stop, threads)
            finally:
                stop.set()
                c.stop()  # what the full disk cannot take stays in the spool
            refused = c.spool_refusals
            assert c.quarantine.items == 0
            moved = shutil.copytree(disk / "store", tmp_path / "bigger")
        print(f"{refused} requests refused on the full disk")
        assert refused > 0, "the disk never filled"
        on_full_disk = len(_stored_keys(moved))
        again = make_collector(tmp_path, store=moved).start()  # the store on a bigger disk
        again.stop()
        after = len(_stored_keys(moved)) - on_full_disk
        print(f"{on_full_disk:,} spans stored on the full disk, {after:,} from its spool after")
        assert again.quarantine.items == 0
        _assert_acknowledged_stored_once(senders, moved)


def _until_full(c: Any, past_s: float, deadline: float) -> None:
    """Wait for the collector's first refusal on the full disk, then ``past_s`` more seconds
    of senders retrying against it (or until the deadline)."""
    while c.spool_refusals == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(max(0.0, min(past_s, deadline - time.monotonic())))


# -- 3. parent cycles and self-parents, sent by the SDK ----------------------------------------------
def _value(value: AnyValue) -> Any:
    return getattr(value, value.WhichOneof("value"))


def _readable(request: Request) -> list[ReadableSpan]:
    """The spans of ``request`` as the SDK holds them, so that its exporter sends them."""
    out: list[ReadableSpan] = []
    for rs in request.resource_spans:
        resource = Resource({kv.key: _value(kv.value) for kv in rs.resource.attributes})
        for ss in rs.scope_spans:
            scope = InstrumentationScope(ss.scope.name, ss.scope.version or None)
            for span in ss.spans:
                trace_id = int.from_bytes(span.trace_id, "big")
                parent = int.from_bytes(span.parent_span_id, "big")
                out.append(
                    ReadableSpan(
                        name=span.name,
                        context=SpanContext(trace_id, int.from_bytes(span.span_id, "big"), False),
                        parent=SpanContext(trace_id, parent, False) if parent else None,
                        resource=resource,
                        attributes={kv.key: _value(kv.value) for kv in span.attributes},
                        kind=SpanKind(max(span.kind - 1, 0)),
                        start_time=span.start_time_unix_nano,
                        end_time=span.end_time_unix_nano,
                        instrumentation_scope=scope,
                    )
                )
    return out


def _cycles(rng: random.Random, ops: list[int]) -> tuple[dict[int, int], int]:
    """1-3 disjoint cycles of 1-3 ops (a self-parent, two ops each other's parent, three in a
    ring): the parent of each row picked, and how many rows are on a cycle."""
    lengths = [rng.randint(1, 3) for _ in range(rng.randint(1, 3))]
    picked = rng.sample(ops, sum(lengths))
    parents: dict[int, int] = {}
    for length in lengths:
        ring, picked = picked[:length], picked[length:]
        parents.update({row: ring[(i + 1) % length] for i, row in enumerate(ring)})
    return parents, len(parents)


def test_analyses_of_parent_cycles_sent_by_the_sdk_end_with_a_warning(tmp_path: Path) -> None:
    with _case("cycles") as (rng, seconds):
        table = _table("cyc")
        ops = pc.indices_nonzero(pc.equal(table.column("kind"), "op")).to_pylist()
        parents, on_cycle = _cycles(rng, ops)
        protocol, batch = rng.choice(PROTOCOLS), rng.randint(100, 900)
        print(f"parents set {parents}, sent over {protocol} {batch} spans a batch")
        spans = _readable(otlp_layout.encode_request(_resource("cyc"), _cyclic(table, parents)))
        c = make_collector(tmp_path).start()
        try:
            exporter = _exporter(protocol, c.http_port, c.grpc_port)
            for at in range(0, len(spans), batch):
                assert exporter.export(spans[at : at + batch]) == SpanExportResult.SUCCESS
            exporter.shutdown()
        finally:
            c.stop()
        run_dir = tmp_path / "store" / "m-cyc" / "MF"
        for command in rng.sample(["summary", "analyze"], 2):
            with within(seconds / 2):
                done = CliRunner().invoke(cli_main, [command, str(run_dir)])
            assert done.exit_code == 0, done.output
            assert f"{on_cycle} spans are their own ancestors" in done.output, done.output


# -- 4. crafted run directories and stores -------------------------------------------------------
def _tree(root: Path, skip: Path) -> dict[str, str]:
    """Every path under ``root`` but ``skip``'s, with what it is: a link's target, a file's
    hash, or a directory; links are not followed."""
    seen: dict[str, str] = {}
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(directory) / name
            if path == skip or skip in path.parents:
                continue
            if path.is_symlink():
                seen[str(path)] = f"link to {os.readlink(path)}"
            elif path.is_file():
                seen[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                seen[str(path)] = "directory"
    return seen


def _measurement(root: Path) -> Path:
    write_run(root, "MF", fixture_table("resnet18_train_cpu", "MF", f"run-{root.name}"))
    (root / "manifest.json").write_text(json.dumps({"status": "ok", "runs": [{"levels": "MF"}]}))
    return root


#: A crafted directory: planted in (the measurement R, another measurement V, the tmp dir),
#: it returns the command that meets it.
Attack = Callable[[Path, Path, Path], list[str]]


def _reconstructed_link(root: Path, victim: Path, tmp: Path) -> list[str]:
    (root / "reconstructed").symlink_to(victim / "MF", target_is_directory=True)
    return ["analyze", str(root), "--save-reconstruction"]


def _reconstructed_holding_links(root: Path, victim: Path, tmp: Path) -> list[str]:
    (root / "reconstructed").mkdir()
    for name in ("run.json", "spans-00000.parquet"):
        (root / "reconstructed" / name).symlink_to(victim / "MF" / name)
    return ["analyze", str(root), "--save-reconstruction"]


def _export_through_link(root: Path, victim: Path, tmp: Path) -> list[str]:
    (tmp / "out.jsonl").symlink_to(victim / "MF" / "run.json")
    return ["export", str(root), "-o", str(tmp / "out.jsonl")]


def _report_through_link(root: Path, victim: Path, tmp: Path) -> list[str]:
    (tmp / "report.html").symlink_to(victim / "MF" / "spans-00000.parquet")
    return ["analyze", str(root), "--report", str(tmp / "report.html")]


def _level_name(name: str) -> Attack:
    def attack(root: Path, victim: Path, tmp: Path) -> list[str]:
        levels = name.replace("VICTIM", str(victim))
        runs = [{"levels": "MF"}, {"levels": levels}]
        (root / "manifest.json").write_text(json.dumps({"status": "ok", "runs": runs}))
        return ["analyze", str(root), "--save-reconstruction"]

    return attack


def _level_set_linked_out(root: Path, victim: Path, tmp: Path) -> list[str]:
    (root / "MFL").symlink_to(victim / "MF", target_is_directory=True)
    runs = [{"levels": "MF"}, {"levels": "MFL"}]
    (root / "manifest.json").write_text(json.dumps({"status": "ok", "runs": runs}))
    return ["analyze", str(root), "--save-reconstruction"]


ATTACKS: dict[str, Attack] = {
    "reconstructed is a link to another run": _reconstructed_link,
    "reconstructed holds links to another run's files": _reconstructed_holding_links,
    "export -o is a link into another run": _export_through_link,
    "analyze --report is a link into another run": _report_through_link,
    "a manifest level set ../V/MF": _level_name("../V/MF"),
    "a manifest level set that is an absolute path": _level_name("VICTIM/MF"),
    "a manifest level set ..": _level_name(".."),
    "a level set that is a link out of the measurement": _level_set_linked_out,
}


def _meet(name: str, tmp: Path) -> None:
    root, victim = _measurement(tmp / "R"), _measurement(tmp / "V")
    command = ATTACKS[name](root, victim, tmp)
    outside = _tree(tmp, skip=root)
    done = CliRunner().invoke(cli_main, command)
    assert done.exception is None or isinstance(done.exception, SystemExit), done.output
    if done.exit_code:  # refused: one line saying why
        lines = done.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("xsp: error: "), done.output
    assert _tree(tmp, skip=root) == outside, f"{name}: written outside {root}"


def _store_linked_out(tmp: Path, planted: str) -> None:
    """A shared store where a user made the measurement's directory, or its level set's, a
    link to elsewhere: the collector writes nothing through it, and keeps the acknowledged
    request in its quarantine (never lost, never blocking the rest of the store)."""
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir(parents=True)
    (tmp / "store" / "m-a").mkdir(parents=True)
    link = tmp / "store" / planted
    if planted == "m-a":
        link.rmdir()
    link.symlink_to(elsewhere, target_is_directory=True)
    outside = _tree(tmp, skip=tmp / "store")
    c = make_collector(tmp).start()
    try:
        exporter = _exporter("http", c.http_port, c.grpc_port)
        request = otlp_layout.encode_request(_resource("a"), _table("a").slice(0, 50))
        assert exporter.export(_readable(request)) == SpanExportResult.SUCCESS
        exporter.shutdown()
    finally:
        c.stop()
    assert _tree(tmp, skip=tmp / "store") == outside, "the collector wrote through a link"
    assert list(elsewhere.iterdir()) == []
    assert c.quarantine.items == 1


def test_crafted_directories_never_make_xsp_write_outside_them(tmp_path: Path) -> None:
    with _case("crafted") as (rng, seconds):
        picked = rng.sample(sorted(ATTACKS), 3)
        planted = rng.choice(["m-a", "m-a/MF"])
        print(f"crafted: {picked}; a link planted in the collector's store as {planted}")
        with within(seconds):
            for k, name in enumerate(picked):
                (tmp_path / str(k)).mkdir()
                _meet(name, tmp_path / str(k))
            _store_linked_out(tmp_path / "store-case", planted)

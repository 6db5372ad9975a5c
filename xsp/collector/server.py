"""The OTLP receiver: gRPC and HTTP (protobuf and JSON) in, the run store (and a forward) out.

Request path (any number of tracer processes at once; ``http_receiver`` and ``grpc_receiver``
hold the transports):
1. size check (HTTP 413 / gRPC RESOURCE_EXHAUSTED), bearer token check, backpressure check (HTTP
   429 with Retry-After / gRPC UNAVAILABLE) when the spool holds more than ``max_pending_bytes``;
2. decode the whole request as the store worker will (the resource, scopes, events, links, every
   AnyValue: ``ingest_view``) and validate every span against the columns it will fill (HTTP
   400 / gRPC INVALID_ARGUMENT naming the field and value): a request is acknowledged only when
   every span of it will be stored. ``door`` does it natively for the requests it is sure of;
3. append to the write-ahead spool and fsync; only then acknowledge. A spool whose disk is full
   or short of ``spool_reserve_bytes`` keeps nothing of the request and answers HTTP 503 with
   Retry-After / gRPC UNAVAILABLE, so the sender retries.

A flusher thread turns spool segments into store files every ``flush_interval_s`` (at once when
the spool closes a full segment), oldest first
(the conversion itself in a worker process when ``store_workers`` is 1, as ``xsp collector serve``
runs it, so that it never holds the receivers' GIL),
and hands their requests to a forwarder (``forward``: any OTLP endpoint, Jaeger included), whose
own thread sends them, so a slow endpoint never holds up the store. A segment that
fails to store (a full or unwritable disk) stays queued and is retried with back-off, logged and
counted; one request in it that cannot be converted goes to the quarantine instead of blocking
the rest.

Segments found at start-up (a killed collector) are queued before any new one, and the flusher
replays them in the background while the receivers already accept: acknowledgement still means
"durable in the spool", so nothing acknowledged is lost, and a sender waits for no replay (a
27 MB spool took 8.7 s to replay). Their requests' digests are read before the receivers open,
so a sender's retry of a request that the crash left unanswered is still stored once.
``replayed`` is set once every recovered segment is stored.

A connection that sends nothing for ``idle_s`` (15 s) is closed, over HTTP and gRPC alike.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import ssl
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from xsp.collector import door, span_columns
from xsp.collector.forwarder import DRAIN_S as FORWARD_DRAIN_S
from xsp.collector.forwarder import Forwarder
from xsp.collector.grpc_receiver import GrpcReceiver
from xsp.collector.http_receiver import (
    DEFAULT_IDLE_S,
    RETRY_AFTER_S,
    TRACES_PATH,
    Busy,
    HttpReceiver,
    Unavailable,
    gunzip,
    rpc_status,
)
from xsp.collector.object_mirror import StoreTarget
from xsp.collector.quarantine import QUARANTINE_DIR, Quarantine
from xsp.collector.spool import DEFAULT_RESERVE_BYTES, DEFAULT_SEGMENT_BYTES, Spool
from xsp.collector.store_worker import Stored, open_writer, store_in_worker, store_requests
from xsp.collector.writer import note_quarantined
from xsp.core.errors import ConfigError, StoreError, XspError
from xsp.core.otlp.decode import parse_json
from xsp.core.otlp.transport import OtlpConfig, Transport, make_transport

log = logging.getLogger(__name__)

__all__ = [
    "RETRY_AFTER_S",
    "TRACES_PATH",
    "Busy",
    "Collector",
    "CollectorConfig",
    "rpc_status",
    "serve",
    "split_address",
]

DEFAULT_GRPC = "127.0.0.1:4317"
DEFAULT_HTTP = "127.0.0.1:4318"
DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_PENDING_BYTES = 512 * 1024 * 1024
DEFAULT_FLUSH_INTERVAL_S = 0.5
#: A request body must arrive within this (a stalled sender must not hold the request open).
DEFAULT_READ_TIMEOUT_S = 30.0
#: Back-off between attempts to store a segment that failed: doubles from the first to the cap.
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
#: A replica's name: it ends the part names and names the spool directory.
_REPLICA = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
#: How often a store worker process checks that its collector is still there.
WORKER_WATCH_S = 0.5


@dataclass(frozen=True)
class CollectorConfig:
    #: The store, or (with ``object_store``) the local directory of the spool and working copy.
    store: Path
    grpc_address: str | None = DEFAULT_GRPC
    http_address: str | None = DEFAULT_HTTP
    forward: str | None = None
    token: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES
    flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    #: A connection idle this long is closed (HTTP keep-alive, gRPC max_connection_idle).
    idle_s: float = DEFAULT_IDLE_S
    #: The spool closes a segment for the flusher once it holds this many bytes.
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    #: Free bytes on the spool's filesystem kept for the store: requests past it get 503.
    spool_reserve_bytes: int = DEFAULT_RESERVE_BYTES
    #: Worker processes that convert segments into store files (0: the flusher thread does).
    store_workers: int = 0
    #: How long stopping waits for requests not yet forwarded (they are stored either way).
    forward_drain_s: float = FORWARD_DRAIN_S
    #: This collector's name among the replicas sharing ``store`` (None: the store's only one).
    replica: str | None = None
    #: ``s3://bucket/prefix``: the store, ``store`` its local working copy (``object_mirror``).
    object_store: str | None = None

    def __post_init__(self) -> None:
        if not (self.grpc_address or self.http_address):
            raise ConfigError("the collector needs --grpc or --http")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("TLS needs both --tls-cert and --tls-key")
        for address in (self.grpc_address, self.http_address):
            if address is not None:
                split_address(address)
        if self.replica is not None and not _REPLICA.fullmatch(self.replica):
            raise ConfigError(
                f"bad replica name {self.replica!r}: use 1-63 of A-Z a-z 0-9 _ . - "
                "(a letter or digit first)"
            )
        if self.store_workers not in (0, 1):
            raise ConfigError(f"store_workers {self.store_workers}: use 0 or 1 (one flusher)")

    @property
    def target(self) -> StoreTarget:
        return StoreTarget(self.store, self.object_store, self.replica)

    @property
    def shown_store(self) -> str:
        """The store as the user named it."""
        return self.object_store or str(self.store)


def spool_directory(replica: str | None) -> str:
    """The spool's directory in the store: each replica has its own, since a start replays
    every segment in it."""
    return ".spool" if replica is None else f".spool-{replica}"


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"bad address {address!r}: use HOST:PORT, e.g. 127.0.0.1:4318")
    return host.strip("[]") or "127.0.0.1", int(port)


class Collector:
    def __init__(self, config: CollectorConfig) -> None:
        self.config = config
        self.quarantine = Quarantine(config.store / QUARANTINE_DIR)
        self.writer = open_writer(config.target)  # raises StoreError for an unwritable store
        try:
            self.spool = Spool(
                config.store / spool_directory(config.replica),
                self.quarantine,
                segment_bytes=config.segment_bytes,
                on_closed=self._wake_flusher,
                reserve_bytes=config.spool_reserve_bytes,
            )
        except OSError as exc:
            raise StoreError(f"cannot open the spool in {config.store}: {exc}") from exc
        self._forward_transport: Transport | None = None
        if config.forward:
            forward_config = OtlpConfig.from_env(config.forward)
            assert forward_config is not None  # an explicit endpoint always yields one
            self._forward_transport = make_transport(forward_config)
        self._forward: Forwarder | None = None  # its thread starts with the collector
        self.accepted_spans = 0
        self.flush_failures = 0  # attempts to store a segment that failed (each retried)
        self.quarantined_requests = 0  # spooled requests that could not be converted
        self.duplicate_spans = 0  # spans not stored again: their run already held them
        self.spool_refusals = 0  # requests not acknowledged: the spool's disk could not take them
        self._refusing = False  # the last append failed (its log line is not repeated)
        #: Why storing fails now (an unreachable object store, a full disk), and since when.
        self.store_failing: tuple[float, str] | None = None
        self._count_lock = threading.Lock()
        self._flush_lock = threading.Lock()  # one flusher at a time: the loop, flush(), stop()
        self._queue: list[Path] = []  # closed segments not yet stored, oldest first
        self._retry_at = 0.0
        self._backoff_s = RETRY_FIRST_S
        self._stop = threading.Event()
        self._wake = threading.Event()  # a full segment was closed, or stop
        self._stopped = False
        self._flusher = threading.Thread(target=self._flush_loop, name="xsp-flusher", daemon=True)
        self._recovered: list[Path] = []  # a killed collector's segments not yet stored
        #: Set once every segment found at start is stored (at once when there were none).
        self.replayed = threading.Event()
        self._workers: ProcessPoolExecutor | None = None
        self._http: HttpReceiver | None = None
        self._grpc: GrpcReceiver | None = None
        #: Every receiver listens: /healthz answers 200 from then on, 503 before.
        self.listening = threading.Event()
        self.http_port: int | None = None
        self.grpc_port: int | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Collector:
        """Open the receivers, then replay what an earlier process left in the background
        (the flusher stores it before any newer request). Raises ConfigError for an address
        that cannot be bound, having closed whatever it opened (the spool is kept)."""
        if self.config.store_workers:
            self._workers = _worker_pool()
        door.prepare()  # built now, if need be, not while the first request waits
        span_columns.prepare()  # likewise, for the store worker's first segment
        if self._forward_transport is not None:
            self._forward = Forwarder(self._forward_transport, drain_s=self.config.forward_drain_s)
        self._recovered = list(self.spool.recovered)  # a killed collector's acknowledged requests
        self._queue.extend(self._recovered)
        self._note_replay()
        try:
            if self.config.http_address:
                self._start_http(*split_address(self.config.http_address))
            if self.config.grpc_address:
                self._start_grpc(self.config.grpc_address)
            self.listening.set()
        except BaseException:
            self._close_receivers()
            self.spool.close()
            if self._workers is not None:
                self._workers.shutdown()
            if self._forward is not None:
                self._forward.stop()
            raise
        self._flusher.start()
        return self

    def stop(self) -> None:
        """Stop receiving, flush everything to the store, close. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self.listening.clear()
        self._close_receivers()
        self._stop.set()
        self._wake.set()
        if self._flusher.is_alive():
            self._flusher.join()
        self._retry_at = 0.0
        self.flush()
        if self._queue:
            log.error(
                "xsp collector: %d segments could not be stored; they stay in %s for the next "
                "start",
                len(self._queue),
                self.spool.directory,
            )
        self.spool.close()
        if self._workers is not None:
            self._workers.shutdown()
        if self._forward is not None:
            self._forward.stop()  # bounded: a dead endpoint does not hold up the exit

    @property
    def forward_errors(self) -> int:
        """Requests not forwarded: refused, unanswered, or dropped (the store has them all)."""
        return 0 if self._forward is None else self._forward.errors + self._forward.dropped

    def _close_receivers(self) -> None:
        if self._http is not None:
            self._http.stop()
        if self._grpc is not None:
            self._grpc.stop()

    # -- ingest --------------------------------------------------------------------------------
    def check_capacity(self) -> None:
        if self.spool.pending_bytes > self.config.max_pending_bytes:
            raise Busy(f"spool holds {self.spool.pending_bytes} bytes not yet stored")

    def ingest(self, request: trace_service_pb2.ExportTraceServiceRequest) -> int:
        """Validate and spool a request; returns the span count once it is durable. Checked as
        the bytes spooled, by the parser the store worker uses (``door``, ``ingest_view``)."""
        return self.ingest_protobuf(request.SerializeToString())

    def ingest_protobuf(self, body: bytes) -> int:
        """Decode, validate and spool a protobuf body (spooled as received: no re-encoding)."""
        return self._append(door.check(body), body)

    def ingest_http(self, body: bytes, as_json: bool, gzipped: bool) -> int:
        if gzipped:
            body = gunzip(body, self.config.max_request_bytes)
        if as_json:
            return self.ingest(parse_json(body))
        return self.ingest_protobuf(body)

    def _append(self, spans: int, payload: bytes) -> int:
        self.check_capacity()
        try:
            self.spool.append(payload)  # False for a retry already durable: acknowledge it again
        except OSError as exc:  # nothing of it was kept: the sender must retry, not move on
            with self._count_lock:
                self.spool_refusals += 1
                first, self._refusing = not self._refusing, True
            if first:  # once a spell: a full disk refuses every request until some is freed
                log.error("xsp collector: the spool refuses requests (503) until it can: %s", exc)
            raise Unavailable(str(exc)) from exc
        with self._count_lock:
            self.accepted_spans += spans
            self._refusing = False
        return spans

    def authorized(self, header: str | None) -> bool:
        if self.config.token is None:
            return True
        scheme, _, token = (header or "").partition(" ")
        return scheme.lower() == "bearer" and token == self.config.token  # RFC 7235: any case

    # -- flushing ------------------------------------------------------------------------------
    def _wake_flusher(self) -> None:
        self._wake.set()

    def _flush_loop(self) -> None:
        wait_s = 0.0  # the first pass at once: it replays the recovered segments
        while not self._stop.is_set():
            self._wake.wait(wait_s)  # every flush_interval_s, or as soon as a segment is full
            self._wake.clear()
            if self._stop.is_set():
                return
            wait_s = self.config.flush_interval_s
            try:
                self.flush()
            except Exception:  # keep flushing later; the spool still holds the data
                log.exception("xsp collector: flushing the spool failed")

    def flush(self) -> None:
        """Close the open segment and store every queued segment, oldest first, unless a
        failed attempt's back-off has not yet run out."""
        with self._flush_lock:
            self.spool.rotate()
            self._queue.extend(self.spool.closed())
            if time.monotonic() >= self._retry_at:
                self._flush_queue()
            self._note_replay()

    def _note_replay(self) -> None:
        """Set ``replayed`` once no recovered segment is waiting (called by the flusher)."""
        if self.replayed.is_set():
            return
        waiting = [segment for segment in self._recovered if segment in self._queue]
        if waiting:
            return
        if self._recovered:
            log.info("xsp collector: replayed the %d segments of the spool", len(self._recovered))
        self.replayed.set()

    def _flush_queue(self) -> None:
        duplicates = self.duplicate_spans
        try:
            self._flush_segments()
        finally:
            if self.duplicate_spans > duplicates:
                log.warning(
                    "xsp collector: %d spans received again were not stored twice (%d so far)",
                    self.duplicate_spans - duplicates,
                    self.duplicate_spans,
                )

    def _flush_segments(self) -> None:
        while self._queue:
            segment = self._queue[0]
            self._queue.extend(self.spool.closed())  # filled while the last one was stored
            try:
                self._flush_segment(segment)
            except (XspError, OSError) as exc:
                self.flush_failures += 1
                if self.store_failing is None:
                    self.store_failing = (time.time(), str(exc))
                self._retry_at = time.monotonic() + self._backoff_s
                log.error(
                    "xsp collector: storing %s failed (%d segments waiting; retry in %.1f s): %s",
                    segment.name,
                    len(self._queue),
                    self._backoff_s,
                    exc,
                )
                self._backoff_s = min(RETRY_MAX_S, self._backoff_s * 2)
                return
            self._queue.pop(0)
            self._backoff_s = RETRY_FIRST_S
            if self.store_failing is not None:
                log.warning(
                    "xsp collector: storing into %s again (%d segments waiting)",
                    self.config.shown_store,
                    len(self._queue),
                )
                self.store_failing = None

    def health(self) -> str:
        """/healthz's line: "ok", or why the spool is not being stored (the receivers still
        acknowledge what the spool holds, so the answer stays 200)."""
        if self.store_failing is None:
            return "ok"
        since, why = self.store_failing
        waiting = len(self._queue)
        return (
            f"ok, but storing into {self.config.shown_store} fails since "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(since))}: {waiting} segments "
            f"({self.spool.pending_bytes} bytes) kept in the spool and retried: {why}"
        )

    def _flush_segment(self, segment: Path) -> None:
        payloads = self.spool.read(segment)
        stored = self._store(Spool.part_name(segment, self.config.replica), payloads)
        self.duplicate_spans += stored.duplicate_spans
        poison = dict(stored.poison)
        for index, reason in poison.items():  # set aside; the rest of the segment is stored
            self.quarantined_requests += 1
            item = self.quarantine.put(f"{segment.stem}.r{index}.pb", payloads[index], reason)
            note_quarantined(self.config.store, payloads[index], item.name, self.writer.mirror)
        if self._forward is not None:
            for index, payload in enumerate(payloads):
                if index not in poison:
                    self._forward.put(payload)
        self.spool.remove(segment)

    def _store(self, part_name: str, payloads: list[bytes]) -> Stored:
        """Store a segment's requests, in the worker process when there is one."""
        if self._workers is None:
            return store_requests(self.writer, part_name, payloads)
        try:
            return self._workers.submit(
                store_in_worker, self.config.target, part_name, payloads
            ).result()
        except BrokenProcessPool as exc:  # the worker died: start another; the segment waits
            self._workers = _worker_pool()
            raise StoreError(f"the store worker process died ({exc})") from exc

    # -- receivers -----------------------------------------------------------------------------
    def _start_http(self, host: str, port: int) -> None:
        context = None
        if self.config.tls_cert is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                context.load_cert_chain(str(self.config.tls_cert), str(self.config.tls_key))
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"cannot load --tls-cert/--tls-key: {exc}") from exc
        self._http = HttpReceiver(
            host,
            port,
            ingest=self.ingest_http,
            check_capacity=self.check_capacity,
            authorized=self.authorized,
            max_request_bytes=self.config.max_request_bytes,
            read_timeout_s=self.config.read_timeout_s,
            idle_s=self.config.idle_s,
            ssl_context=context,
            ready=self.listening.is_set,
            health=self.health,
        )
        self._http.start()
        self.http_port = self._http.port

    def _start_grpc(self, address: str) -> None:
        tls = None
        if self.config.tls_cert is not None and self.config.tls_key is not None:
            tls = (Path(self.config.tls_cert), Path(self.config.tls_key))
        self._grpc = GrpcReceiver(
            address,
            ingest=self.ingest_protobuf,
            authorized=self.authorized,
            max_request_bytes=self.config.max_request_bytes,
            idle_s=self.config.idle_s,
            tls=tls,
        )
        self._grpc.start()
        self.grpc_port = self._grpc.port


def _worker_pool() -> ProcessPoolExecutor:
    # spawn, not fork: the receivers' and gRPC's threads must not be forked
    return ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_exit_with_collector,
        initargs=(os.getpid(),),
    )


def _exit_with_collector(collector_pid: int) -> None:
    """In the worker: end once the collector process is gone (killed with SIGKILL, its pool
    never says stop). A part it was writing stays under its own temporary name
    (tracer.store.write_span_part); the restarted collector's replay writes it whole."""

    def watch() -> None:
        while os.getppid() == collector_pid:
            time.sleep(WORKER_WATCH_S)
        os._exit(0)

    threading.Thread(target=watch, name="xsp-collector-watch", daemon=True).start()


def serve(config: CollectorConfig, ready: Any = None) -> None:
    """Run until SIGINT/SIGTERM, then flush and stop."""
    import signal

    from xsp.collector.heap import return_large_blocks

    return_large_blocks()
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):  # before the port opens: a SIGTERM that
        signal.signal(signum, lambda *_: stop.set())  # comes at once still stops it cleanly
    collector = Collector(config).start()
    if ready is not None:
        ready(collector)
    while not stop.wait(1.0):
        pass
    collector.stop()

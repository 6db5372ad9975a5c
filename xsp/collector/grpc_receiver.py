"""OTLP/gRPC in: the TraceService/Export method, registered with a raw-bytes deserializer.

gRPC's generated servicer parses the request before the handler runs, so a malformed message,
a string that is not UTF-8 or nesting past protobuf's limit ends as INTERNAL "Exception
deserializing request!". Taking the bytes and parsing them here turns every one of those into
INVALID_ARGUMENT with the reason, as OTLP asks.

The method is registered as client-streaming, which is the same on the wire as unary: its handler
gets the message as an iterator not yet read, so a call past the bodies in flight is refused with
UNAVAILABLE before its body is read. gRPC's own ``maximum_concurrent_rpcs`` refuses with
RESOURCE_EXHAUSTED, which OTLP senders such as the OpenTelemetry Collector treat as permanent
without a RetryInfo: a gateway dropped spans it had acknowledged.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from xsp.collector.http_receiver import (
    DEFAULT_IDLE_S,
    INFLIGHT_REQUESTS,
    RETRY_AFTER_S,
    Busy,
    Unavailable,
)
from xsp.core.errors import ConfigError
from xsp.core.otlp.wire import DecodeError

__all__ = ["DEFAULT_WORKERS", "SERVICE", "GrpcReceiver"]

log = logging.getLogger(__name__)

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
DEFAULT_WORKERS = 8
_EMPTY_RESPONSE = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()


class GrpcReceiver:
    """``start`` binds (raising ConfigError naming the address) and serves on gRPC's own
    threads; ``ingest(body)`` is called on one of them and may block."""

    def __init__(
        self,
        address: str,
        *,
        ingest: Callable[[bytes], int],
        authorized: Callable[[str | None], bool],
        max_request_bytes: int,
        idle_s: float = DEFAULT_IDLE_S,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        self._ingest = ingest
        self._authorized = authorized
        options = [
            ("grpc.max_receive_message_length", max_request_bytes),
            ("grpc.so_reuseport", 0),
            # a connection without a call for this long gets GOAWAY and is closed, as over HTTP
            ("grpc.max_connection_idle_ms", max(1, round(idle_s * 1000))),
            # the transport reads ahead only a fixed window per call: with the window grown to
            # the link's bandwidth-delay product, calls waiting their turn held their bodies
            ("grpc.http2.bdp_probe", 0),
        ]
        # As HTTP holds at most INFLIGHT_REQUESTS bodies of the largest size at once: a call
        # beyond them is refused before its message is read, where before 100 concurrent 31 MiB
        # calls took the process to 1.9 GB.
        self._bodies = threading.BoundedSemaphore(INFLIGHT_REQUESTS)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=DEFAULT_WORKERS), options=options
        )
        handler = grpc.stream_unary_rpc_method_handler(
            self._export,
            request_deserializer=None,  # the raw bytes: parsing is ours, and so are its errors
            response_serializer=lambda response: response,
        )
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),)
        )
        _probe(address)
        try:
            if tls is not None:
                cert, key = tls
                credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
                port = self._server.add_secure_port(address, credentials)
            else:
                port = self._server.add_insecure_port(address)
        except RuntimeError as exc:  # grpc >= 1.50 raises where older ones returned 0
            raise ConfigError(f"cannot listen for OTLP/gRPC on {address}: {exc}") from exc
        if port == 0:
            raise ConfigError(f"cannot listen for OTLP/gRPC on {address}: address in use?")
        self.port = port

    def start(self) -> None:
        self._server.start()

    def stop(self, grace_s: float = 2.0) -> None:
        self._server.stop(grace=grace_s).wait()

    def _export(self, messages: Iterator[bytes], context: Any) -> bytes:
        metadata = dict(context.invocation_metadata())
        if not self._authorized(metadata.get("authorization")):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        if not self._bodies.acquire(blocking=False):
            context.set_trailing_metadata((("retry-after", str(RETRY_AFTER_S)),))
            message = f"collector busy with {INFLIGHT_REQUESTS} requests, retry later"
            context.abort(grpc.StatusCode.UNAVAILABLE, message)
        try:
            self._ingest_one(messages, context)
        finally:
            self._bodies.release()
        return _EMPTY_RESPONSE

    def _ingest_one(self, messages: Iterator[bytes], context: Any) -> None:
        try:
            body = next(messages, None)  # a unary call sends exactly one message
        except grpc.RpcError:  # the sender cancelled the call: it is gone, nothing to answer
            return
        if body is None:  # none: cancelled before it came (or a stream closed empty): no spans
            return
        try:
            self._ingest(body)
        except DecodeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Busy as exc:
            context.set_trailing_metadata((("retry-after", str(RETRY_AFTER_S)),))
            context.abort(grpc.StatusCode.UNAVAILABLE, f"collector busy, retry later: {exc}")
        except Unavailable as exc:
            context.set_trailing_metadata((("retry-after", str(RETRY_AFTER_S)),))
            message = f"collector cannot spool, retry later: {exc}"
            context.abort(grpc.StatusCode.UNAVAILABLE, message)
        except Exception as exc:
            log.exception("xsp collector: spooling a request failed")
            context.abort(grpc.StatusCode.INTERNAL, f"collector cannot spool the request: {exc}")


def _probe(address: str) -> None:
    """Bind the address once with a plain socket: gRPC's own failure to bind logs a line of its
    own to stderr before raising, and the user should see one line, ours."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # as gRPC binds: connections of a stopped collector in TIME_WAIT (up to a minute) do
        # not hold the port, while another listener still does
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, int(port)))
        except OSError as exc:
            raise ConfigError(
                f"cannot listen for OTLP/gRPC on {address}: {exc.strerror or exc}"
            ) from exc

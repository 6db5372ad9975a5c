"""OTLP transports: one ``send(request)`` method plus ``close()``, for HTTP and gRPC.

Configuration follows the OpenTelemetry exporter specification's environment variables
(``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``, ``_PROTOCOL``, ``_HEADERS``, ``_TIMEOUT``,
``_INSECURE``); an explicit endpoint (``--otlp-endpoint``) overrides the endpoint variables.
Retryable answers (HTTP 429/502/503/504, gRPC UNAVAILABLE/RESOURCE_EXHAUSTED) are retried with
exponential back-off, honouring Retry-After; anything else becomes an ``ExportError``.
"""

from __future__ import annotations

import http.client
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from xsp.core.errors import ConfigError, ExportError

if TYPE_CHECKING:  # protobuf's import is paid by the processes that send OTLP only
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

__all__ = [
    "DEFAULT_PROTOCOL",
    "DEFAULT_TIMEOUT_S",
    "MAX_ATTEMPTS",
    "PROTOCOLS",
    "GrpcTransport",
    "HttpTransport",
    "OtlpConfig",
    "Transport",
    "make_transport",
    "parse_headers",
]

PROTOCOLS = ("grpc", "http/protobuf", "http/json")
DEFAULT_PROTOCOL = "http/protobuf"
DEFAULT_TIMEOUT_S = 10.0
MAX_ATTEMPTS = 5
_RETRY_HTTP = {429, 502, 503, 504}


class Transport(Protocol):
    """Sends one OTLP trace request. Called from the session's thread after the measured window;
    may block up to its timeout (times the retries)."""

    def send(self, request: ExportTraceServiceRequest) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class OtlpConfig:
    endpoint: str
    protocol: str = DEFAULT_PROTOCOL
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    insecure: bool = True

    @classmethod
    def from_env(
        cls, endpoint: str | None = None, env: Mapping[str, str] | None = None
    ) -> OtlpConfig | None:
        """Build the configuration from ``endpoint`` and the OTEL_* variables; None when neither
        names an endpoint."""
        env = os.environ if env is None else env

        def var(name: str) -> str | None:
            return env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or env.get(
                f"OTEL_EXPORTER_OTLP_{name}"
            )

        protocol = (var("PROTOCOL") or "").strip()
        signal_endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        base_endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        url = endpoint or signal_endpoint or base_endpoint
        if not url:
            return None
        scheme = urllib.parse.urlsplit(_with_scheme(url)).scheme
        if scheme in ("grpc", "grpcs"):  # xsp's shorthand: grpc://host:port names the protocol
            protocol = "grpc"
            url = ("https" if scheme == "grpcs" else "http") + url[len(scheme) :]
        if not protocol:
            protocol = (
                "grpc"
                if urllib.parse.urlsplit(_with_scheme(url)).port == 4317
                else DEFAULT_PROTOCOL
            )
        if protocol not in PROTOCOLS:
            raise ConfigError(f"bad OTLP protocol {protocol!r}: use one of {', '.join(PROTOCOLS)}")
        url = _with_scheme(url)
        named_signal_url = bool(endpoint or signal_endpoint)
        if protocol != "grpc" and (
            not named_signal_url or urllib.parse.urlsplit(url).path in ("", "/")
        ):
            url = url.rstrip("/") + "/v1/traces"  # a bare host or the base variable: add the path
        timeout_ms = var("TIMEOUT")
        try:
            timeout_s = float(timeout_ms) / 1000 if timeout_ms else DEFAULT_TIMEOUT_S
        except ValueError as exc:
            raise ConfigError(
                f"bad OTEL_EXPORTER_OTLP_TIMEOUT {timeout_ms!r}: milliseconds"
            ) from exc
        insecure_text = (var("INSECURE") or "").lower()
        insecure = url.startswith("http://") if not insecure_text else insecure_text == "true"
        return cls(url, protocol, parse_headers(var("HEADERS") or ""), timeout_s, insecure)


def _with_scheme(url: str) -> str:
    return url if "://" in url else f"http://{url}"


def parse_headers(text: str) -> dict[str, str]:
    """Parse the W3C-baggage-like ``key=value,key2=value2`` form of OTEL_EXPORTER_OTLP_HEADERS."""
    headers = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"bad OTLP header {item!r}: expected key=value")
        headers[urllib.parse.unquote(key.strip()).lower()] = urllib.parse.unquote(value.strip())
    return headers


def make_transport(config: OtlpConfig) -> Transport:
    if config.protocol == "grpc":
        return GrpcTransport(config)
    return HttpTransport(config)


def _backoff(attempt: int, hint_s: float | None) -> float:
    return min(hint_s if hint_s is not None else 0.5 * 2**attempt, 30.0)


class HttpTransport:
    """OTLP/HTTP with protobuf or JSON bodies (urllib: no extra dependency)."""

    def __init__(self, config: OtlpConfig, sleep: Any = time.sleep) -> None:
        self._config = config
        self._sleep = sleep

    def send(self, request: ExportTraceServiceRequest) -> None:
        if self._config.protocol == "http/json":
            import json

            from xsp.core.otlp.encode_json import request_to_json

            body = json.dumps(request_to_json(request)).encode()
            content_type = "application/json"
        else:
            body = request.SerializeToString()
            content_type = "application/x-protobuf"
        headers = {"Content-Type": content_type, **self._config.headers}
        for attempt in range(MAX_ATTEMPTS):
            req = urllib.request.Request(
                self._config.endpoint, data=body, headers=headers, method="POST"
            )
            try:
                with urllib.request.urlopen(req, timeout=self._config.timeout_s) as response:
                    response.read()
                    return
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:200].decode("utf-8", "replace")
                if exc.code not in _RETRY_HTTP or attempt == MAX_ATTEMPTS - 1:
                    raise ExportError(
                        f"OTLP endpoint {self._config.endpoint} answered HTTP {exc.code}: {detail}"
                    ) from exc
                retry_after = exc.headers.get("Retry-After")
                hint = float(retry_after) if retry_after and retry_after.isdigit() else None
                self._sleep(_backoff(attempt, hint))
            except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
                if attempt == MAX_ATTEMPTS - 1:
                    reason = getattr(exc, "reason", exc)
                    raise ExportError(
                        f"OTLP endpoint {self._config.endpoint} unreachable: {reason}"
                    ) from exc
                self._sleep(_backoff(attempt, None))

    def close(self) -> None:
        pass


class GrpcTransport:
    """OTLP/gRPC through the TraceService stub of opentelemetry-proto."""

    def __init__(self, config: OtlpConfig, sleep: Any = time.sleep) -> None:
        import grpc
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

        self._grpc = grpc
        self._config = config
        self._sleep = sleep
        target = urllib.parse.urlsplit(config.endpoint).netloc or config.endpoint
        options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
        if config.insecure:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            self._channel = grpc.secure_channel(
                target, grpc.ssl_channel_credentials(), options=options
            )
        self._stub = TraceServiceStub(self._channel)

    def send(self, request: ExportTraceServiceRequest) -> None:
        grpc = self._grpc
        retryable = {
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.ABORTED,
        }
        metadata = list(self._config.headers.items())
        for attempt in range(MAX_ATTEMPTS):
            try:
                self._stub.Export(request, timeout=self._config.timeout_s, metadata=metadata)
                return
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code not in retryable or attempt == MAX_ATTEMPTS - 1:
                    details = exc.details() if hasattr(exc, "details") else str(exc)
                    raise ExportError(
                        f"OTLP gRPC endpoint {self._config.endpoint} failed: {code}: {details}"
                    ) from exc
                self._sleep(_backoff(attempt, None))

    def close(self) -> None:
        self._channel.close()

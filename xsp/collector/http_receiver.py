"""OTLP/HTTP in, on aiohttp's asyncio server, in a thread of its own.

Per request, in this order, so that a bad or unauthenticated request costs almost nothing:
path (404), Content-Type (415), bearer token (401), Content-Length present (411) and within the
limit (413), spool capacity and the bytes of bodies in flight (429 with Retry-After); only then is
the body read, in chunks, under a read timeout (408) and a hard cap; a gzip body is inflated with
the same cap. Decoding, validation and the spool's fsync run in a thread pool so that the event
loop keeps accepting (TLS handshakes included) while they block.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from xsp.core.errors import ConfigError
from xsp.core.otlp.wire import DecodeError

__all__ = [
    "DEFAULT_BACKLOG",
    "DEFAULT_IDLE_S",
    "INFLIGHT_REQUESTS",
    "LINGER_S",
    "READ_BUFFER_BYTES",
    "RETRY_AFTER_S",
    "TRACES_PATH",
    "Busy",
    "HttpReceiver",
    "TooLarge",
    "Unavailable",
    "gunzip",
    "rpc_status",
]

log = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"
RETRY_AFTER_S = 1
#: Connections waiting for accept(); the kernel caps it at net.core.somaxconn.
DEFAULT_BACKLOG = 1024
#: A connection that sends no request for this long is closed (also a brand-new one), over
#: HTTP and gRPC alike: idle senders must not hold sockets and memory for ever.
DEFAULT_IDLE_S = 15.0
#: Bodies in flight (being read or decoded) across all requests, in units of the request limit:
#: past it, a sender is told to retry, so memory stays bounded however many senders there are.
INFLIGHT_REQUESTS = 4
#: After answering a request whose body was not read, read and drop the rest for this long so
#: the client sees the answer rather than a reset; past it, close.
LINGER_S = 5.0
#: Body bytes buffered per connection before reading pauses: big enough that a request of
#: 1000 spans (~360 KiB) arrives in a few socket reads, each of which needs the GIL.
READ_BUFFER_BYTES = 1 << 20

# HTTP status -> google.rpc code, for the Status message OTLP/HTTP error bodies carry.
_GRPC_CODE = {400: 3, 401: 16, 404: 5, 408: 4, 411: 3, 413: 8, 415: 3, 429: 14, 500: 13, 503: 14}


class Busy(Exception):
    """The spool is full: the sender should retry later."""


class Unavailable(Exception):
    """The spool's disk cannot take the request (full, or short of the store's reserve):
    nothing was kept, and the sender should retry later."""


def rpc_status(code: int, message: str) -> bytes:
    """A serialized google.rpc.Status{code, message}: the body OTLP/HTTP gives errors (encoded
    here: two fields do not justify the googleapis-common-protos dependency)."""
    text = message.encode()
    return bytes([0x08, code]) + bytes([0x12]) + _varint(len(text)) + text


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


class TooLarge(DecodeError):
    """A body over the request limit once inflated (413, as from Content-Length)."""


def gunzip(body: bytes, limit: int) -> bytes:
    """Inflate a gzip body, refusing corrupt data (DecodeError) and output past ``limit``
    (TooLarge)."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, limit + 1)
        if len(data) > limit:
            raise TooLarge(f"gzip body inflates past the limit of {limit} bytes")
        if not inflater.eof:
            raise DecodeError("bad gzip body: truncated")
    except zlib.error as exc:
        raise DecodeError(f"bad gzip body: {exc}") from exc
    return data


class HttpReceiver:
    """``start`` binds (raising ConfigError naming the address) and serves in a thread;
    ``stop`` closes, waiting for requests in progress. ``ingest(body, as_json, gzip)`` is
    called in a worker thread and may block; it raises DecodeError, Busy or Unavailable.
    ``/healthz`` answers 200 once ``ready()`` (every receiver of the collector listens), 503
    before; its body is ``health()``'s line ("ok", or why storing fails)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ingest: Callable[[bytes, bool, bool], int],
        check_capacity: Callable[[], None],
        authorized: Callable[[str | None], bool],
        max_request_bytes: int,
        read_timeout_s: float,
        idle_s: float = DEFAULT_IDLE_S,
        ssl_context: ssl.SSLContext | None = None,
        workers: int = 4,
        ready: Callable[[], bool] = lambda: True,
        health: Callable[[], str] = lambda: "ok",
    ) -> None:
        self._ingest = ingest
        self._ready = ready
        self._health_line = health
        self._idle_s = idle_s
        self._check_capacity = check_capacity
        self._authorized = authorized
        self._limit = max_request_bytes
        self._read_timeout_s = read_timeout_s
        self._ssl = ssl_context
        self._inflight = 0
        self._max_inflight = INFLIGHT_REQUESTS * max_request_bytes
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="xsp-ingest")
        self._sock = _bind(host, port)
        self.port = int(self._sock.getsockname()[1])
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="xsp-http", daemon=True)

    def start(self) -> None:
        app = web.Application(client_max_size=self._limit)
        app.router.add_post(TRACES_PATH, self._post)
        app.router.add_get("/", self._health)
        app.router.add_get("/healthz", self._health)
        self._runner = web.AppRunner(
            app,
            access_log=None,
            keepalive_timeout=self._idle_s,
            lingering_time=LINGER_S,
            auto_decompress=False,  # inflated here, under the cap
            read_bufsize=READ_BUFFER_BYTES,
            handle_signals=False,
        )
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._open(), self._loop)
        future.result()

    async def _open(self) -> None:
        assert self._runner is not None
        await self._runner.setup()
        site = web.SockSite(
            self._runner, self._sock, ssl_context=self._ssl, backlog=DEFAULT_BACKLOG
        )
        await site.start()

    def stop(self) -> None:
        if self._runner is not None and self._thread.is_alive():
            future = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            try:
                future.result(timeout=30)
            except Exception:  # stopping anyway: the spool holds what was acknowledged
                log.exception("xsp collector: closing the HTTP receiver failed")
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._sock.close()
        self._pool.shutdown(wait=True)

    # -- handlers ------------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        if not self._ready():  # the other receivers are not listening yet
            return web.Response(status=503, text="starting\n", headers={"Retry-After": "1"})
        return web.Response(text=self._health_line() + "\n")

    async def _post(self, request: web.Request) -> web.StreamResponse:
        content_type = request.content_type.lower()
        as_json = content_type == "application/json"
        if content_type not in ("application/x-protobuf", "application/json"):
            return self._error(415, f"unsupported Content-Type {content_type!r}", as_json, request)
        encoding = (request.headers.get("Content-Encoding") or "identity").lower()
        if encoding not in ("gzip", "identity"):
            message = f"unsupported Content-Encoding {encoding!r}: send gzip or none"
            return self._error(415, message, as_json, request)
        if not self._authorized(request.headers.get("Authorization")):
            return self._error(401, "missing or wrong bearer token", as_json, request)
        length = request.content_length
        if length is None:
            return self._error(411, "Content-Length required", as_json, request)
        if length > self._limit:
            message = f"request of {length} bytes exceeds the limit of {self._limit}"
            return self._error(413, message, as_json, request)
        try:
            self._check_capacity()
        except Busy as exc:
            return self._error(429, f"collector busy, retry later: {exc}", as_json, request)
        if self._inflight + length > self._max_inflight:
            message = f"collector busy, retry later: {self._inflight} bytes of requests in flight"
            return self._error(429, message, as_json, request)
        self._inflight += length
        try:
            try:
                async with asyncio.timeout(self._read_timeout_s):
                    body = await request.content.readexactly(length) if length else b""
            except TimeoutError:
                message = f"request body not received within {self._read_timeout_s:g} s"
                return self._error(408, message, as_json, request, close=True)
            except asyncio.IncompleteReadError:
                return self._error(400, "request body shorter than Content-Length", as_json)
            gzipped = encoding == "gzip"
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(self._pool, self._ingest, body, as_json, gzipped)
            except TooLarge as exc:
                return self._error(413, str(exc), as_json)
            except DecodeError as exc:
                return self._error(400, str(exc), as_json)
            except Busy as exc:
                return self._error(429, f"collector busy, retry later: {exc}", as_json)
            except Unavailable as exc:  # 503, not 507: OTLP senders retry 503 only
                return self._error(503, f"collector cannot spool, retry later: {exc}", as_json)
            except Exception as exc:  # the spool's disk failed: not acknowledged, say so
                log.exception("xsp collector: spooling a request failed")
                return self._error(500, f"collector cannot spool the request: {exc}", as_json)
        finally:
            self._inflight -= length
        if as_json:
            return web.Response(body=b"{}", content_type="application/json")
        return web.Response(body=b"", content_type="application/x-protobuf")

    def _error(
        self,
        code: int,
        message: str,
        as_json: bool,
        request: web.Request | None = None,
        close: bool = False,
    ) -> web.Response:
        rpc_code = _GRPC_CODE.get(code, 2)
        if as_json:
            body = json.dumps({"code": rpc_code, "message": message}).encode()
            response = web.Response(status=code, body=body, content_type="application/json")
        else:
            response = web.Response(
                status=code,
                body=rpc_status(rpc_code, message),
                content_type="application/x-protobuf",
            )
        if code in (429, 503):
            response.headers["Retry-After"] = str(RETRY_AFTER_S)
        length = request.content_length if request is not None else None
        # An unread body far past the limit is not worth lingering over: close at once.
        if close or (request is not None and (length is None or length > 8 * self._limit)):
            response.force_close()
        return response


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen for OTLP/HTTP on {host}:{port}: {exc.strerror or exc}"
        ) from exc
    sock.setblocking(False)
    return sock

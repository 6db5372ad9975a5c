"""Forwarding stored requests to another OTLP endpoint (Jaeger), off the store's path.

The flusher hands each request it has stored to ``Forwarder.put`` and moves on; a thread of the
forwarder's own sends them, oldest first. So a slow or dead endpoint (each failing request takes
the transport's retries: up to about a minute) never holds up the store or a shutdown. The store
is the record; forwarding is a copy: when more than ``max_pending`` requests wait, the oldest is
dropped, and ``stop`` waits at most ``drain_s`` for the rest. Both are counted and logged.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from xsp.core.errors import ExportError
from xsp.core.otlp.transport import Transport

__all__ = ["DRAIN_S", "MAX_PENDING", "Forwarder"]

log = logging.getLogger(__name__)

#: Requests waiting to be forwarded before the oldest is dropped (a request is up to 32 MiB).
MAX_PENDING = 256
#: How long ``stop`` gives the requests still waiting.
DRAIN_S = 10.0


class Forwarder:
    def __init__(
        self, transport: Transport, max_pending: int = MAX_PENDING, drain_s: float = DRAIN_S
    ) -> None:
        self._transport = transport
        self._max_pending = max_pending
        self._drain_s = drain_s
        self._pending: collections.deque[bytes] = collections.deque()
        self._ready = threading.Condition()
        self._sending = False
        self._stopping = False
        self.errors = 0  # requests the endpoint refused or never answered
        self.dropped = 0  # requests never sent: too many waiting, or still waiting at stop
        self._thread = threading.Thread(target=self._run, name="xsp-forwarder", daemon=True)
        self._thread.start()

    def put(self, payload: bytes) -> None:
        """Queue one stored request (serialized OTLP protobuf); never blocks."""
        with self._ready:
            if len(self._pending) >= self._max_pending:
                self._pending.popleft()
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 100 == 0:
                    log.error(
                        "xsp collector: the forward endpoint is behind; %d requests not "
                        "forwarded (they are stored)",
                        self.dropped,
                    )
            self._pending.append(payload)
            self._ready.notify()

    def stop(self) -> None:
        """Send what waits, for at most ``drain_s``, then close the transport."""
        deadline = time.monotonic() + self._drain_s
        with self._ready:
            self._stopping = True
            self._ready.notify()
            while (self._pending or self._sending) and time.monotonic() < deadline:
                self._ready.wait(max(0.0, deadline - time.monotonic()))
            left = len(self._pending) + int(self._sending)
            self._pending.clear()
        if left:
            self.dropped += left
            log.error(
                "xsp collector: %d requests were not forwarded within %.0f s of stopping "
                "(they are stored)",
                left,
                self._drain_s,
            )
        self._transport.close()

    def _run(self) -> None:
        from xsp.core.otlp.decode import parse_protobuf

        while True:
            with self._ready:
                while not self._pending and not self._stopping:
                    self._ready.wait()
                if not self._pending:
                    return
                payload = self._pending.popleft()
                self._sending = True
            try:
                self._transport.send(parse_protobuf(payload))
            except ExportError as exc:
                self.errors += 1
                log.error("xsp collector: forward failed: %s", exc)
            except Exception as exc:  # a transport bug must not end forwarding
                self.errors += 1
                log.exception("xsp collector: forward failed: %s", exc)
            finally:
                with self._ready:
                    self._sending = False
                    self._ready.notify_all()

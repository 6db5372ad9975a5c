"""The application's trace: the OpenTelemetry span an iteration begins in, if any.

A service instrumented with OpenTelemetry has a span per request (a server span started from a
W3C ``traceparent`` header, say). When a measured iteration begins inside such a span, recording
and sampled, level M's model span becomes its child, in its trace, and every deeper span
follows (``xsp.tracer.convert.table``); otherwise xsp's own trace ids stand.

The OpenTelemetry API is read once per measured iteration, at its begin, before the model
span's clock starts, and only where the program has imported ``opentelemetry.trace`` itself:
xsp never imports it into a program that does not use it, and nothing of the SDK is touched.
"""

from __future__ import annotations

import sys

__all__ = ["OTEL_TRACE", "SpanRef", "application_span"]

#: (trace id, span id) of an application span: 16 bytes and an unsigned 64-bit integer.
SpanRef = tuple[bytes, int]

OTEL_TRACE = "opentelemetry.trace"


def application_span() -> SpanRef | None:
    """The current OpenTelemetry span of the calling thread, if the program uses the API and
    that span is valid and sampled; never raises."""
    trace = sys.modules.get(OTEL_TRACE)
    if trace is None:
        return None
    try:
        context = trace.get_current_span().get_span_context()
        if not (context.is_valid and context.trace_flags.sampled):
            return None
        return int(context.trace_id).to_bytes(16, "big"), int(context.span_id)
    except Exception:  # a broken or foreign API: xsp's own ids stand
        return None

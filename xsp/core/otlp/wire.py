"""What xsp's encoder and decoders agree on about the wire: the scope name, the root kinds and
their stored names, the ids of multi-rank iteration roots, the attributes a viewer layout adds
(which decoding undoes), and the error a bad request raises."""

from __future__ import annotations

from xsp.core import schema

__all__ = [
    "DROPPED",
    "ID_KEYS",
    "INT64_MAX",
    "ITERATION_ROOT_IDS",
    "ROOT_KINDS",
    "ROOT_NAMES",
    "SCOPE_NAME",
    "VIEW_KEYS",
    "DecodeError",
]

SCOPE_NAME = "xsp"
#: The OTLP/JSON keys of a span's ids, hex on the wire (protobuf's JSON has them base64).
ID_KEYS = ("traceId", "spanId", "parentSpanId")
#: A trace's root takes its title (a single-rank step, or the iteration above the ranks).
ROOT_KINDS = (schema.KIND_STEP, schema.KIND_ITERATION)
ROOT_NAMES = {
    schema.KIND_STEP: schema.STEP_SPAN_NAME,
    schema.KIND_ITERATION: schema.ITERATION_SPAN_NAME,
}
#: Span ids at or below this are multi-rank iteration roots (iteration + 1), never an
#: application's (random 64-bit ids).
ITERATION_ROOT_IDS = 0xFFFF_FFFF
INT64_MAX = (1 << 63) - 1
#: A span's dropped counts: stored where another sender set them, sent back as they came.
DROPPED = ("dropped_attributes_count", "dropped_events_count", "dropped_links_count")
#: The attributes of a viewer layout that the decoder undoes (xsp.tracer.export.view).
VIEW_KEYS = frozenset(
    (schema.ATTR_KERNEL_NAME, schema.ATTR_VIEW_ADDED, schema.ATTR_VIEW_STORED_PARENT)
)


class DecodeError(ValueError):
    """A payload that is not a valid OTLP trace request; the message says why."""

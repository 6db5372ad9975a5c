"""The OTLP fields beyond xsp's as a span table stores them (``schema.OTLP_COLUMNS``), row by
row: what the decoders write and both encoders give back. Arrow reads a struct with every field,
null ones as None, so the event and link rows have all their keys."""

from __future__ import annotations

from typing import TypedDict

__all__ = ["RestRow", "StoredEvent", "StoredLink"]


class StoredEvent(TypedDict):
    """One of a span's ``events`` (``schema.EVENT_TYPE``); attributes as OTLP/JSON text."""

    time_ns: int | None
    name: str | None
    attributes: str | None
    dropped_attributes_count: int | None


class StoredLink(TypedDict):
    """One of a span's ``links`` (``schema.LINK_TYPE``); attributes as OTLP/JSON text."""

    trace_id: bytes | None
    span_id: int | None
    trace_state: str | None
    flags: int | None
    attributes: str | None
    dropped_attributes_count: int | None


class RestRow(TypedDict, total=False):
    """A row's set columns of ``schema.OTLP_COLUMNS`` but the scope's (``rows.rest_rows``)."""

    span_kind: int
    status_code: int
    status_description: str
    trace_state: str
    flags: int
    attributes: str  # OTLP/JSON KeyValues no column holds
    events: list[StoredEvent]
    links: list[StoredLink]
    dropped_attributes_count: int
    dropped_events_count: int
    dropped_links_count: int

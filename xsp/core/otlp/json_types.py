"""The OTLP/JSON documents xsp writes and reads, as types: the protobuf messages of
``opentelemetry/proto/{common,resource,trace}/v1`` under the OTLP JSON mapping (lowerCamelCase
keys, enums as integers, 64-bit integers as strings, trace and span ids as hex strings, fields at
their default left out). So every key is optional but those an encoder always writes."""

from __future__ import annotations

from typing import Required, TypeAlias, TypedDict

__all__ = [
    "AnyValueJson",
    "ArrayValueJson",
    "AttributeValue",
    "EventJson",
    "KeyValueJson",
    "KeyValueListJson",
    "LinkJson",
    "ResourceJson",
    "ResourceSpansJson",
    "ScopeExtraJson",
    "ScopeJson",
    "ScopeSpansJson",
    "SpanJson",
    "StatusJson",
    "StoredResourceJson",
    "TracesJson",
]


class ArrayValueJson(TypedDict, total=False):
    values: list[AnyValueJson]


class KeyValueListJson(TypedDict, total=False):
    values: list[KeyValueJson]


class AnyValueJson(TypedDict, total=False):
    """One of the keys, or none (an unset value is ``{}``)."""

    stringValue: str
    boolValue: bool
    intValue: str  # int64: a string
    doubleValue: float | str  # "NaN", "Infinity", "-Infinity" as strings
    arrayValue: ArrayValueJson
    kvlistValue: KeyValueListJson
    bytesValue: str  # base64


class KeyValueJson(TypedDict, total=False):
    key: Required[str]
    value: AnyValueJson  # absent: a KeyValue sent without its value


#: An attribute's value as xsp's code holds it: a plain value where one says it exactly, else
#: (an array, a key-value list, bytes, an unset value) its OTLP/JSON form.
AttributeValue: TypeAlias = str | bool | int | float | AnyValueJson


class ResourceJson(TypedDict, total=False):
    attributes: list[KeyValueJson]
    droppedAttributesCount: int


class StoredResourceJson(ResourceJson, total=False):
    """A sender's resource as the store keeps it: the Resource with its ResourceSpans' schema
    URL beside (``decode.resource_json``)."""

    schemaUrl: str


class ScopeJson(TypedDict, total=False):
    """An InstrumentationScope."""

    name: str
    version: str
    attributes: list[KeyValueJson]
    droppedAttributesCount: int


class ScopeExtraJson(TypedDict, total=False):
    """What the store keeps of a scope beyond its name and version (``scope_extra``)."""

    attributes: list[KeyValueJson]
    droppedAttributesCount: int
    schemaUrl: str


class StatusJson(TypedDict, total=False):
    message: str
    code: int


class EventJson(TypedDict, total=False):
    timeUnixNano: str
    name: str
    attributes: list[KeyValueJson]
    droppedAttributesCount: int


class LinkJson(TypedDict, total=False):
    traceId: Required[str]
    spanId: Required[str]
    traceState: str
    attributes: list[KeyValueJson]
    droppedAttributesCount: int
    flags: int


class SpanJson(TypedDict, total=False):
    traceId: Required[str]
    spanId: Required[str]
    traceState: str
    parentSpanId: str
    flags: int
    name: str
    kind: int
    startTimeUnixNano: str
    endTimeUnixNano: str
    attributes: list[KeyValueJson]
    droppedAttributesCount: int
    events: list[EventJson]
    droppedEventsCount: int
    links: list[LinkJson]
    droppedLinksCount: int
    status: StatusJson


class ScopeSpansJson(TypedDict, total=False):
    scope: Required[ScopeJson]
    spans: list[SpanJson]
    schemaUrl: str


class ResourceSpansJson(TypedDict, total=False):
    resource: Required[ResourceJson]
    scopeSpans: list[ScopeSpansJson]
    schemaUrl: str


class TracesJson(TypedDict, total=False):
    """An ExportTraceServiceRequest (or a TracesData: the same JSON)."""

    resourceSpans: list[ResourceSpansJson]

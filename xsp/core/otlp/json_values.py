"""OTLP values <-> OTLP/JSON, for the fields that xsp's typed columns do not hold.

The collector stores a foreign sender's attributes (those no column of ``schema.COLUMNS``
takes, or of another value type than their column's), its events' and links' attributes and its
resources as OTLP/JSON text: the form the OpenTelemetry specification gives them
(``[{"key": ..., "value": {"intValue": "7"}}]``: 64-bit integers as strings, bytes as base64,
non-finite doubles as "NaN"/"Infinity"), so that every value keeps its type, arrays and nested
key-value lists included, DuckDB's JSON functions read it, and the OTLP/JSON encoder writes it
back as it is. Hand-written rather than protobuf's ``MessageToDict`` / ``ParseDict``, which cost
about 20x more per value.

The input is a parsed protobuf message, so its depth is within protobuf's 100 levels and its
strings are UTF-8: nothing here fails on a request the collector acknowledged.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from xsp.core.otlp.json_types import AnyValueJson, AttributeValue, KeyValueJson

__all__ = [
    "attributes_text",
    "double_json",
    "json_from_text",
    "key_values_from_json",
    "key_values_from_text",
    "key_values_json",
    "plain",
    "value_from_json",
    "value_json",
]


def value_json(value: AnyValue) -> AnyValueJson:
    """``value`` as OTLP/JSON (an unset value is ``{}``)."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return {"stringValue": value.string_value}
    if which == "int_value":
        return {"intValue": str(value.int_value)}
    if which == "double_value":
        return {"doubleValue": double_json(value.double_value)}
    if which == "bool_value":
        return {"boolValue": value.bool_value}
    if which == "array_value":
        return {"arrayValue": {"values": [value_json(v) for v in value.array_value.values]}}
    if which == "kvlist_value":
        return {"kvlistValue": {"values": key_values_json(value.kvlist_value.values)}}
    if which == "bytes_value":
        return {"bytesValue": base64.b64encode(value.bytes_value).decode()}
    return {}


def double_json(number: float) -> float | str:
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    return number


def key_values_json(key_values: Iterable[KeyValue]) -> list[KeyValueJson]:
    """As OTLP/JSON; a KeyValue without its value (not even an empty one) has no "value"."""
    return [
        {"key": kv.key, "value": value_json(kv.value)} if kv.HasField("value") else {"key": kv.key}
        for kv in key_values
    ]


def attributes_text(key_values: Iterable[KeyValue]) -> str | None:
    """The OTLP/JSON text of ``key_values``; None when there are none (a null column costs
    nothing at rest)."""
    listed = key_values_json(key_values)
    return json.dumps(listed, separators=(",", ":")) if listed else None


def value_from_json(data: AnyValueJson) -> AnyValue:
    """An OTLP/JSON value back to an AnyValue (``value_json`` undone)."""
    if "stringValue" in data:
        return AnyValue(string_value=data["stringValue"])
    if "intValue" in data:
        return AnyValue(int_value=int(data["intValue"]))
    if "doubleValue" in data:
        return AnyValue(double_value=float(data["doubleValue"]))
    if "boolValue" in data:
        return AnyValue(bool_value=bool(data["boolValue"]))
    if "arrayValue" in data:
        out = AnyValue()
        values = out.array_value.values
        for item in data["arrayValue"].get("values") or []:
            values.add().CopyFrom(value_from_json(item))
        out.array_value.SetInParent()  # an empty array stays an array
        return out
    if "kvlistValue" in data:
        out = AnyValue()
        out.kvlist_value.values.extend(key_values_from_json(data["kvlistValue"].get("values")))
        out.kvlist_value.SetInParent()
        return out
    if "bytesValue" in data:
        return AnyValue(bytes_value=base64.b64decode(data["bytesValue"]))
    return AnyValue()


def key_values_from_json(listed: Iterable[KeyValueJson] | None) -> list[KeyValue]:
    return [
        KeyValue(key=item.get("key", ""), value=value_from_json(item["value"]))
        if "value" in item
        else KeyValue(key=item.get("key", ""))
        for item in listed or []
    ]


def key_values_from_text(text: str | None) -> list[KeyValue]:
    return key_values_from_json(json.loads(text)) if text else []


def json_from_text(text: str | None) -> list[KeyValueJson]:
    return json.loads(text) if text else []


def plain(data: AnyValueJson) -> AttributeValue:
    """An OTLP/JSON value as a plain Python value where one says it exactly (a string, bool,
    int or float); arrays, key-value lists, bytes and an empty value (``{}``) stay OTLP/JSON
    (``any_value`` and the OTLP/JSON encoder take either)."""
    if "stringValue" in data:
        return data["stringValue"]
    if "boolValue" in data:
        return bool(data["boolValue"])
    if "intValue" in data:
        return int(data["intValue"])
    if "doubleValue" in data:
        return float(data["doubleValue"])
    return data.copy()

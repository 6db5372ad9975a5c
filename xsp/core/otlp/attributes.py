"""Attribute values between OTLP and xsp's typed columns: a plain value as OTLP (``any_value``),
an OTLP value as plain Python (``plain_value``), and an attribute's value as its column wants it
(``typed_value``), refused with a DecodeError where it cannot be stored without loss."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

import pyarrow as pa
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from xsp.core import schema
from xsp.core.otlp import json_values
from xsp.core.otlp.json_types import AnyValueJson
from xsp.core.otlp.wire import DecodeError

__all__ = [
    "KINDS",
    "NUMERIC",
    "ColumnKind",
    "any_value",
    "key_values",
    "plain_value",
    "stored_parent",
    "typed_value",
]


def any_value(value: Any) -> AnyValue:
    """A plain value as OTLP; a dict is a typed value kept as OTLP/JSON (``json_values``)."""
    if isinstance(value, dict):
        return json_values.value_from_json(cast(AnyValueJson, value))
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=str(value))


def key_values(attributes: Mapping[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attributes.items() if v is not None]


class ColumnKind:
    """How an attribute column wants its values: an integer within bounds, a float, a string."""

    __slots__ = ("high", "is_float", "key", "low", "own", "type_name", "wide")

    def __init__(self, key: str, type_: pa.DataType) -> None:
        self.key = key
        self.is_float = pa.types.is_floating(type_)
        #: the AnyValue field of the column's own type; a value of another is kept as sent too
        self.own = (
            "double_value"
            if self.is_float
            else "int_value"
            if pa.types.is_integer(type_)
            else "string_value"
        )
        self.type_name = str(type_)
        self.wide = type_ == pa.int64()  # holds any int_value OTLP can carry
        if pa.types.is_integer(type_):
            bits = type_.bit_width
            signed = pa.types.is_signed_integer(type_)
            self.low = -(1 << (bits - 1)) if signed else 0
            self.high = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1
        else:
            self.low = self.high = None


KINDS: dict[str, ColumnKind] = {
    str(c.attribute): ColumnKind(str(c.attribute), c.type) for c in schema.ATTRIBUTE_COLUMNS
}
#: The attributes whose values validate() checks: those filling integer or float columns.
NUMERIC: dict[str, ColumnKind] = {
    key: kind for key, kind in KINDS.items() if kind.high is not None or kind.is_float
}


def typed_value(value: AnyValue, kind: ColumnKind, which: str | None) -> Any:
    """An attribute value (``which``: its ``WhichOneof``) as its column wants it (foreign
    senders may use other value types).

    A numeric column takes numbers and numeric strings (``"7"``). Anything else (a bool, an array,
    ``"abc"``, 7.9 for an integer) and a number that does not fit the column (2**40 for an int32
    iteration, an infinite thread id, a 30-digit parameter count) raise DecodeError naming the
    attribute and value: the request is refused before it is acknowledged, rather than stored
    with the value silently dropped or truncated.
    """
    if kind.high is not None:
        if which == "int_value":
            number: Any = value.int_value
        else:
            plain = plain_value(value)
            if plain is None:
                return None
            if isinstance(plain, float) and not math.isfinite(plain):
                raise DecodeError(f"{kind.key} {plain!r} is not a finite number")
            try:
                if isinstance(plain, (bool, dict, list)) or (
                    isinstance(plain, float) and not plain.is_integer()
                ):
                    raise TypeError
                number = int(plain)
            except (TypeError, ValueError):
                raise DecodeError(
                    f"{kind.key} {str(plain)[:40]!r} ({which}) is not an integer for its "
                    f"{kind.type_name} column"
                ) from None
        if not kind.low <= number <= kind.high:
            raise DecodeError(
                f"{kind.key} {_short(number)} does not fit its {kind.type_name} column "
                f"({kind.low}..{kind.high})"
            )
        return number
    if kind.is_float:
        if which == "double_value":
            return value.double_value
        plain = plain_value(value)
        if plain is None:
            return None
        try:
            if isinstance(plain, (bool, dict, list)):
                raise TypeError
            return float(plain)
        except (TypeError, ValueError, OverflowError):
            raise DecodeError(
                f"{kind.key} {str(plain)[:40]!r} ({which}) is not a number for its "
                f"{kind.type_name} column"
            ) from None
    if which == "string_value":
        return value.string_value
    plain = plain_value(value)
    return None if plain is None else str(plain)


def _short(number: int) -> str:
    text = str(number)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} digits)"


def plain_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("array_value", "kvlist_value"):
        return MessageToDict(value)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def stored_parent(value: AnyValue) -> int:
    """The span id in ``schema.ATTR_VIEW_STORED_PARENT`` (16 hex digits)."""
    text = plain_value(value)
    try:
        if not isinstance(text, str) or len(text) != 16:
            raise ValueError
        return int(text, 16)
    except ValueError:
        raise DecodeError(
            f"{schema.ATTR_VIEW_STORED_PARENT} {str(text)[:40]!r} is not a span id of 16 hex digits"
        ) from None

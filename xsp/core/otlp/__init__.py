"""OTLP for traces: xsp's span tables to OTLP requests and back, one job a module.

The codec (no viewer layout, no torch; the collector imports these alone):

- ``rows``: a table's rows as the wire has them, read once for both encoders;
- ``encode``: rows -> protobuf; ``encode_json``: rows -> OTLP/JSON (and a protobuf request as
  OTLP/JSON);
- ``decode``: a request (protobuf or OTLP/JSON) parsed, checked at the door and turned into span
  tables and stored resources; ``decode_spans``: any request's spans, span by span;
  ``columns``: xsp's own spans, column-wise with numpy (``protobuf_fields``, ``mirror``);
- ``attributes``: attribute values between OTLP and the typed columns; ``json_values``: OTLP
  values as OTLP/JSON; ``json_types``: the OTLP/JSON documents as types; ``stored``: the OTLP
  fields beyond xsp's as a table's rows hold them; ``wire``: what encoder and decoders agree on;
- ``batching``: a table cut into requests along its traces.

The layout on the wire for Jaeger and the viewer (root titles, Jaeger's host key, one service per
level, short kernel names), with the encoders most callers use, ``encode_request`` and
``encode_request_json``, is the export stage's (``xsp.tracer.export.otlp_layout``); the
transports that send requests are ``transport``.

The names below are loaded on first use, so that importing one codec module loads no other.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xsp.core.otlp.attributes import any_value, key_values
    from xsp.core.otlp.batching import batches_under, split_traces
    from xsp.core.otlp.decode import (
        Scopes,
        parse_json,
        parse_protobuf,
        plain_resource,
        resource_attributes,
        resource_id,
        resource_json,
        spans_and_scopes,
        table_from_columns,
        table_from_resource_spans,
        validate,
        validate_span,
    )
    from xsp.core.otlp.encode import encode_resource_spans
    from xsp.core.otlp.encode_json import request_to_json
    from xsp.core.otlp.wire import SCOPE_NAME, DecodeError

__all__ = [
    "SCOPE_NAME",
    "DecodeError",
    "Scopes",
    "any_value",
    "batches_under",
    "encode_resource_spans",
    "key_values",
    "parse_json",
    "parse_protobuf",
    "plain_resource",
    "request_to_json",
    "resource_attributes",
    "resource_id",
    "resource_json",
    "spans_and_scopes",
    "split_traces",
    "table_from_columns",
    "table_from_resource_spans",
    "validate",
    "validate_span",
]

#: Each name's module in this package.
_HOME = {
    "SCOPE_NAME": "wire",
    "DecodeError": "wire",
    "any_value": "attributes",
    "key_values": "attributes",
    "encode_resource_spans": "encode",
    "request_to_json": "encode_json",
    "batches_under": "batching",
    "split_traces": "batching",
    "Scopes": "decode",
    "parse_json": "decode",
    "parse_protobuf": "decode",
    "plain_resource": "decode",
    "resource_attributes": "decode",
    "resource_id": "decode",
    "resource_json": "decode",
    "spans_and_scopes": "decode",
    "table_from_columns": "decode",
    "table_from_resource_spans": "decode",
    "validate": "decode",
    "validate_span": "decode",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value

"""How xsp lays a store's spans out on the wire: each trace's root titled for Jaeger's trace list
(``trace_title``), the run's host as Jaeger's host key on the resource (``wire_resource``), and
with ``view`` the viewer's layout (``xsp.tracer.export.view``): one service per level
(``by_level``), short kernel names. ``encode_request`` and ``encode_request_json`` are the
encoders (``encode``, ``encode_json``) with this layout; the decoders undo it
(``decode``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pyarrow as pa
import pyarrow.compute as pc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from xsp.core import schema
from xsp.core.otlp.encode import encode_resources
from xsp.core.otlp.encode_json import encode_resources_json
from xsp.core.otlp.json_types import AttributeValue, StoredResourceJson, TracesJson
from xsp.core.otlp.rows import WireLayout
from xsp.core.store import RECONSTRUCTED
from xsp.tracer.export.kernel_names import short_kernel_name
from xsp.tracer.export.view import WIRE_COLUMNS, level_resource

__all__ = [
    "STORED",
    "VIEWER",
    "by_level",
    "encode_request",
    "encode_request_json",
    "trace_title",
    "wire_resource",
]


def encode_request(
    resource: Mapping[str, AttributeValue],
    table: pa.Table,
    scope_version: str = "",
    view: bool = False,
    resource_extra: StoredResourceJson | None = None,
) -> ExportTraceServiceRequest:
    """The request of ``table``'s spans; with ``view``, laid out for a trace viewer (one service
    per level, short kernel names: ``xsp.tracer.export.view``); ``resource_extra`` as
    ``encode.encode_resource_spans``'."""
    groups = by_level(resource, table, view)
    return encode_resources(groups, scope_version, VIEWER if view else STORED, resource_extra)


def encode_request_json(
    resource: Mapping[str, AttributeValue],
    table: pa.Table,
    scope_version: str = "",
    view: bool = False,
    resource_extra: StoredResourceJson | None = None,
) -> TracesJson:
    """``request_to_json(encode_request(...))``, built straight from the columns
    (``encode_json.encode_resources_json``)."""
    groups = by_level(resource, table, view)
    return encode_resources_json(groups, scope_version, VIEWER if view else STORED, resource_extra)


def trace_title(resource: Mapping[str, AttributeValue], iteration: int | None) -> str:
    """The root's name on the wire, which Jaeger lists traces by and compares them by: workload,
    mode and batch, the ranks of a multi-rank job, and level set marked "(traced)" (or
    "reconstructed", the replayed step), e.g. "torchvision:resnet50 train b64 · MFLG (traced)"
    or "train.py · 2 ranks · MF (traced)": a traced run's steps are slower than the replayed
    step, which is what xsp reports, and the list says which is which. The iteration is the
    root's ``xsp.iteration`` attribute, not part of the name: one operation a level set, so that
    Jaeger's operation filter and its trace compare see the iterations as the same step. The
    store keeps the plain name ("step", or "iteration" above the ranks)."""
    workload = " ".join(
        str(part)
        for part in (
            resource.get(schema.RES_WORKLOAD),
            resource.get(schema.RES_MODE),
            f"b{resource[schema.RES_BATCH_SIZE]}" if resource.get(schema.RES_BATCH_SIZE) else None,
        )
        if part
    )
    world_size = resource.get(schema.RES_WORLD_SIZE)
    ranks = f"{world_size} ranks" if isinstance(world_size, int) and world_size > 1 else None
    levels = resource.get(schema.RES_LEVELS)
    if levels and levels != RECONSTRUCTED:
        levels = f"{levels} (traced)"
    parts = (workload, ranks, levels)
    return " · ".join(str(p) for p in parts if p)


def wire_resource(resource: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
    """The resource as sent: Jaeger's host key added where it is missing. Jaeger adjusts (or, with
    adjustment off, flags) clock skew between spans whose host keys differ or are absent; its v1
    API, which the UI reads, looks at ``ip`` alone. All of a run's spans come from one clock, so
    they share one key: the run's own ``ip``, else its host name. Another sender's resource
    (no ``xsp.`` attribute: the collector stored it) goes back as it came in."""
    wired = dict(resource)
    ours = any(key.startswith("xsp.") for key in wired)
    if ours and not wired.get(schema.RES_JAEGER_HOST_KEY):
        wired[schema.RES_JAEGER_HOST_KEY] = str(wired.get(schema.RES_HOST_NAME) or "localhost")
    return wired


def by_level(
    resource: Mapping[str, AttributeValue], table: pa.Table, view: bool
) -> Iterator[tuple[dict[str, AttributeValue], pa.Table]]:
    """The resources and rows of a request: with ``view``, one per level, in stack order, each
    its own service (``view.level_resource``); else the one resource as it is."""
    if not view or "level" not in table.column_names:
        yield dict(resource), table
        return
    levels = table.column("level").cast(pa.string())
    present = set(levels.unique().to_pylist())
    order = [name for name in schema.LEVEL_BY_LETTER.values() if name in present]
    order += sorted(name for name in present if name not in order and name is not None)
    for level in order:
        rows = table.filter(pc.fill_null(pc.equal(levels, level), False))
        yield level_resource(resource, level), rows
    if None in present:
        yield dict(resource), table.filter(pc.is_null(levels))


#: The stored spans as sent: titled roots, Jaeger's host key, the view's columns (where a table
#: has them) as attributes.
STORED = WireLayout(wire_resource, trace_title, None, WIRE_COLUMNS)
#: A trace viewer's: as ``STORED``, kernels under their short names too.
VIEWER = WireLayout(wire_resource, trace_title, short_kernel_name, WIRE_COLUMNS)

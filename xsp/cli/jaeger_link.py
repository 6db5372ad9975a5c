"""The Jaeger UI link ``xsp push`` prints: a search that finds the pushed traces and opens fast,
printed only where a Jaeger UI answers.

Jaeger's search returns every span of every trace it lists (255 MB for 80 ResNet-50 training
traces, 15-30 s to open), so the link narrows it to the pushed traces' root operation (one name
a level set, on the model level's service, which holds only the roots), their time range, and a
``limit`` of traces whose spans stay within ``SEARCH_SPAN_BUDGET`` (the rest are one click on
the search form away)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xsp.tracer.export.sinks import SpanBatch

__all__ = [
    "JAEGER_UI_PORT",
    "SEARCH_SPAN_BUDGET",
    "SearchLink",
    "default_ui",
    "is_jaeger_ui",
    "search_link",
]

#: Jaeger's query service (its UI) listens here unless configured otherwise.
JAEGER_UI_PORT = 16686
#: Spans the printed search may return: one trace of the most the layout sends unfolded
#: (``view.DEFAULT_MAX_SPANS_PER_TRACE``). Measured with Jaeger 1.76's UI API on the committed
#: ResNet-50 replay (5,170 spans, 5.2 MB a trace): 1, 2, 3, 5 and 10 traces took 0.54, 0.79,
#: 1.06, 2.27 and 3.79 s on the shared 2-core dev machine, and 0.9-1.4, 1.1-2.8 and 2.2-3.9 s
#: for 1, 2 and 3 under a load of 10 (``benchmarks/jaeger_link.py``).
SEARCH_SPAN_BUDGET = 8_192
#: How long ``is_jaeger_ui`` waits for the UI's API.
PROBE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class SearchLink:
    """The search URL and what it asks for (``limit`` traces of ``traces`` pushed)."""

    url: str
    limit: int
    traces: int


def default_ui(endpoint: str) -> str:
    """The Jaeger UI next to an OTLP endpoint: the endpoint's host, port 16686."""
    host = urllib.parse.urlsplit(endpoint).hostname or "127.0.0.1"
    return f"http://{host if ':' not in host else f'[{host}]'}:{JAEGER_UI_PORT}"


def is_jaeger_ui(ui: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a Jaeger query service answers at ``ui``: its ``/api/services`` gives JSON with a
    ``data`` list (the xsp collector, or nothing, at that address does not)."""
    try:
        with urllib.request.urlopen(f"{ui.rstrip('/')}/api/services", timeout=timeout_s) as r:
            body = json.loads(r.read(1 << 20))
    except (OSError, ValueError, urllib.error.URLError):
        return False
    return isinstance(body, dict) and "data" in body and isinstance(body["data"], list | None)


def search_link(
    ui: str, batches: Sequence[SpanBatch], per_level: bool, max_spans_per_trace: int
) -> SearchLink | None:
    """The UI's search for the pushed traces (see the module notes): the model level's service
    (the sender's own without the per-level layout), the roots' operation where the push had
    one, the measurement's time range in microseconds (so a run of any age is found), and as
    many traces as ``SEARCH_SPAN_BUDGET`` allows, counted as the layout sends them (a folded
    trace holds at most ``max_spans_per_trace``)."""
    import pyarrow.compute as pc

    from xsp.core import schema
    from xsp.tracer.export.otlp_layout import trace_title

    tables = [b.table for b in batches if b.table.num_rows]
    if not tables:
        return None
    if per_level and all(t.column("level").null_count == t.num_rows for t in tables):
        per_level = False  # another sender's spans (no xsp level): its own service names
    start = min(pc.min(t.column("start_ns")).as_py() for t in tables)
    end = max(pc.max(pc.add(t.column("start_ns"), t.column("dur_ns"))).as_py() for t in tables)
    sizes = [c["counts"] for t in tables for c in pc.value_counts(t.column("trace_id")).to_pylist()]
    largest = max(sizes)
    if per_level and max_spans_per_trace > 0:
        largest = min(largest, max_spans_per_trace)
    limit = max(1, min(len(sizes), SEARCH_SPAN_BUDGET // largest))
    service = str(batches[0].resource.get(schema.RES_SERVICE_NAME) or schema.SERVICE_NAME)
    query: dict[str, str | int] = {
        "service": f"{service}.{schema.LEVEL_MODEL}" if per_level else service
    }
    titles = {trace_title(b.resource, None) for b in batches if b.table.num_rows}
    if per_level and len(titles) == 1:  # the roots: one operation a level set
        query["operation"] = titles.pop()
    query |= {"start": start // 1000, "end": -(-end // 1000), "lookback": "custom", "limit": limit}
    return SearchLink(f"{ui.rstrip('/')}/search?{urllib.parse.urlencode(query)}", limit, len(sizes))

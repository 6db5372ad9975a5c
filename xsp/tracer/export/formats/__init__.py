"""The export formats: one module per format, each an ``ExportFormat`` (see ``base``).

``xsp export --format NAME`` takes its choices and their help from ``FORMATS``; a script or the
collector looks a format up by name and calls its ``write`` on an ``ExportSource``. Adding a
format is one module here plus its entry below.
"""

from __future__ import annotations

from xsp.core.errors import ConfigError
from xsp.tracer.export.formats import chrome, otlp_json, otlp_metrics_json
from xsp.tracer.export.formats.base import ExportFormat, ExportSource, RunSpans

__all__ = ["FORMATS", "ExportFormat", "ExportSource", "RunSpans", "get"]

#: Format name -> format, in the order the CLI lists them (the first is its default).
FORMATS: dict[str, ExportFormat] = {
    f.name: f for f in (otlp_json.FORMAT, chrome.FORMAT, chrome.FORMAT_NS, otlp_metrics_json.FORMAT)
}


def get(name: str) -> ExportFormat:
    """The format called ``name``; ConfigError naming the known ones otherwise."""
    try:
        return FORMATS[name]
    except KeyError:
        known = ", ".join(FORMATS)
        raise ConfigError(f"unknown export format {name!r} (known: {known})") from None

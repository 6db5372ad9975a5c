"""The core every stage builds on: the span schema, errors, levels, configuration, array and
interval helpers, the capture records and arena format, the run store and its documents. It
imports nothing else of xsp and never torch."""

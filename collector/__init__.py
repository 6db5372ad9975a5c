"""The xsp collector: an OTLP receiver that writes the run store (see the collector issue).

It will reuse ``tracer.otlp`` (decoding), ``tracer.store`` (the store format) and ``tracer.sinks``
(forwarding); nothing here yet.
"""

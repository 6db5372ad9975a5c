"""The xsp collector service: an OTLP receiver (gRPC, HTTP protobuf/JSON) that writes received
spans into the run store through a write-ahead spool and can forward them to Jaeger or any OTLP
endpoint. ``xsp collector serve`` runs it; ``xsp.collector.server`` holds the service,
``xsp.collector.spool`` the durability, ``xsp.collector.writer`` the store layout. Decoding is shared with
the tracer (``xsp.core.otlp``)."""

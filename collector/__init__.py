"""The xsp collector service: an OTLP receiver (gRPC, HTTP protobuf/JSON) that writes received
spans into the run store through a write-ahead spool and can forward them to Jaeger or any OTLP
endpoint. ``xsp collector serve`` runs it; ``collector.server`` holds the service,
``collector.spool`` the durability, ``collector.writer`` the store layout. Decoding is shared with
the tracer (``tracer.otlp``)."""

"""Export: span tables to OTLP (otlp/, transport.py, sinks.py), OTLP metrics (metrics.py) and
Chrome/Perfetto traces (chrome.py); the file formats ``xsp export`` writes are a registry
(formats/, one module per format)."""

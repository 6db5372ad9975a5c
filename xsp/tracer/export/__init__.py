"""Export: span tables to OTLP (otlp.py, transport.py, sinks.py), OTLP metrics (metrics.py) and Chrome/Perfetto traces (chrome.py)."""

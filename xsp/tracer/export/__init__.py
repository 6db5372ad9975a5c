"""Export: span tables to OTLP (otlp/, transport.py, sinks.py), OTLP metrics (metrics.py; its
OTLP/JSON document types: metrics_json.py) and Chrome/Perfetto traces (chrome.py; the event
types: chrome_events.py); the file formats ``xsp export`` writes are a registry (formats/, one
module per format)."""

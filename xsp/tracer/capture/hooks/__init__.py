"""What a capture holds in its process, which the levels and the session share: the capture
arena, CUPTI (one owner), torch.compile's kernel provenance, the program's own profiler watched,
and the application's OpenTelemetry span. These import nothing else of the capture stage."""

"""Export: the Prometheus exporter and its HTTP server, generated Prometheus rules, OTLP spans,
Perfetto traces.
"""

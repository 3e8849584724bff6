"""The diagnostic's pipelines: plain Python over a lab session or an endpoint.

`measure` is the delivered-throughput measurement (METHODOLOGY.md, "Measurement").
"""

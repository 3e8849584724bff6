"""The delivered-throughput measurement (METHODOLOGY.md, "Measurement").

`protocol` runs the protocol against an endpoint or a lab session and returns the
findings' `measurement` section; `claim` reads what the server says it generated and
tests each known cause of the difference; `summary` is the one-page text of a result.
"""

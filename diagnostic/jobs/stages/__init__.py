"""The pipeline stage adapters: one module per stage, named as in registry.STAGE_ORDER
(`measure.py` for the measure stage), each registering its stage when imported, and
`ensure_serving.py`, the step they share.

An adapter is the Django side of a pipeline: it makes sure the customer's configuration
is serving, calls the plain pipeline code with the lab session, and records what it
found on the StageContext. Importing this package imports the adapter of every declared
stage that has one; a stage not built yet has no module here and is simply absent.
"""

from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec

from diagnostic.jobs.registry import STAGE_ORDER

# Only declared names are looked for: a stray module here never becomes a stage.
ADAPTERS = tuple(name for name in STAGE_ORDER if find_spec(f"{__name__}.{name}") is not None)

for _name in ADAPTERS:
    import_module(f"{__name__}.{_name}")

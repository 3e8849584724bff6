"""Build tooling, not part of the running platform: the release tables in
lab/engines/releases/ made from the engines' released packages (`python -m
enginetables.extract`, `make engine-tables`). Nothing under lab/, diagnostic/ or reports/
imports it; the runtime reads only the tables it writes."""

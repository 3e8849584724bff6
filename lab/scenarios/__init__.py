"""The scenario files shipped with the package, found by name (`reference-kimi-k2-8spark`).

A scenario describes a simulated lab; see README.md in this folder for the format.
"""

from __future__ import annotations

from pathlib import Path

SCENARIO_DIR = Path(__file__).resolve().parent
REFERENCE = "reference-kimi-k2-8spark"


def available() -> list[str]:
    """Names of the shipped scenarios, sorted."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def scenario_path(name: str) -> Path:
    """The file of a shipped scenario, by name (with or without `.yaml`)."""
    stem = name.removesuffix(".yaml")
    path = SCENARIO_DIR / f"{stem}.yaml"
    if not path.is_file():
        raise FileNotFoundError(
            f"no shipped scenario named {name!r}; available: {', '.join(available())}")
    return path

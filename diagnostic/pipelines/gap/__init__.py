"""The gap to the lab's own best (METHODOLOGY.md): which differences between the day's
configuration and the lab's baseline cost speed or start time, each proved alone."""

from diagnostic.pipelines.gap.pipeline import GapBaseline, resolve_baseline, run_gap

__all__ = ["GapBaseline", "resolve_baseline", "run_gap"]

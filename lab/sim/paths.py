"""Where a simulated node keeps things, as paths on the node (the engine process and the
node both read them; neither owns the other's module)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodePaths:
    work_dir: str  # the agent's working directory (launch specs, logs)
    model_dir: str  # the lab's models directory
    cache_dir: str  # the lab's kept JIT caches

"""Lab time: the clock every duration in the platform is measured in.

On a real lab, lab time is wall time. A simulated lab runs `dilation` times faster and
declares it in its inventory; `LabClock` is the one conversion between the two.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class LabClock:
    dilation: float = 1.0
    origin: float = 0.0  # wall epoch at which lab time equals wall time

    def now(self) -> float:
        """Lab epoch seconds, as the lab's nodes report their own clocks."""
        return self.at(time.time())

    def at(self, wall_epoch: float) -> float:
        return self.origin + (wall_epoch - self.origin) * self.dilation

    def lab_seconds(self, wall_seconds: float) -> float:
        """A duration measured on the wall (monotonic) clock, in lab seconds."""
        return wall_seconds * self.dilation

    def wall_seconds(self, lab_seconds: float) -> float:
        """How long a lab duration takes on the wall clock."""
        return lab_seconds / self.dilation

    def sleep(self, lab_seconds: float) -> None:
        time.sleep(max(0.0, self.wall_seconds(lab_seconds)))

"""Python's cycle collector, set for processes that play episodes all day.

An episode allocates a few hundred container objects, nearly all freed by reference count,
yet at CPython's default thresholds they start collections that walk Ray's, pyarrow's and
pydantic's start-up heap: a large share of a worker's CPU. ``tune_gc`` freezes the start-up
heap (``gc.freeze()``) and sets a young threshold of ``YOUNG_THRESHOLD``; only processes
rayrollout owns call it (workers, the engine, environment replicas), never the driver.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "tune_gc"]

YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """Freeze what start-up made and raise the young generation's threshold (see above)."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)

"""Python's cycle collector, set for processes that play episodes all day.

A worker actor allocates a few hundred container objects per episode (messages, pydantic
models, request state, row dicts) and frees nearly all of them by reference counting. With
CPython's default thresholds (700, 10, 10) that churn still starts a young collection every
few episodes, and every tenth of those a middle one; a full one walks the whole heap,
including the hundreds of thousands of objects Ray, pyarrow, pydantic and aiohttp leave at
import. Measured with ``benchmarks/overhead.py`` (URL mode, free servers, 10,000 episodes,
2 cores): the two worker actors spent 1.5-1.9 s of their 7.5-8.3 s of CPU collecting, about
0.34 ms an episode, where the bare loop spends 0.03.

``tune_gc`` does what long-running Python servers do about it:

- ``gc.freeze()`` once start-up is done: what exists then (modules, classes, the run's
  config, Ray's worker state) lives as long as the process, so later full collections skip
  it;
- a young threshold of ``YOUNG_THRESHOLD`` allocations instead of 700: objects that die by
  reference count never need the collector, and fewer, larger young collections promote
  far fewer short-lived episode objects into the older generations.

Cyclic garbage still gets collected, a few hundred episodes later than before: at most
``YOUNG_THRESHOLD`` objects' worth. Only processes rayrollout owns call this (worker actors,
the engine actor, environment replicas); the driver is the user's process and is left as
it is.
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

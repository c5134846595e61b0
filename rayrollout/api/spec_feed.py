"""The driver's reading of episode specs: in a thread, a bounded number ahead of the engine.

Parsing and checking rows on the driver's event loop would stall its progress reports, so
``SpecFeed`` reads in its own thread into a queue of ``ahead`` specs, and the submitter
takes what is ready. A failing source hands over what it read first, then the error.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from rayrollout.engine.episode_spec import EpisodeSpec

__all__ = ["SpecFeed"]

_POLL_S = 0.2  # how often a blocked put or get looks whether the run stopped


@dataclass
class _Failed:
    error: Exception


_END = object()


class SpecFeed:
    """Specs read from ``specs`` in a thread, at most ``ahead`` of what was taken.

    Args:
        specs: The run's episode specs (a generator reading a task set, or a list).
        ahead: How many specs the thread may read before they are taken.
    """

    def __init__(self, specs: Iterable[EpisodeSpec], ahead: int) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=ahead)
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._read, args=(iter(specs),), name="read-tasks", daemon=True
        )
        self._thread.start()

    def take(self, most: int) -> tuple[list[EpisodeSpec], bool, Exception | None]:
        """Blocks (call it in a thread) until a spec is ready, the source ends or fails, or
        ``stop``; returns ``(specs, ended, error)``: up to ``most`` specs, whether the source
        has no more, and the error it failed with (its specs before it are in the list)."""
        batch: list[EpisodeSpec] = []
        while len(batch) < most:
            try:
                item = self._queue.get(timeout=_POLL_S) if not batch else self._queue.get_nowait()
            except queue.Empty:
                if batch:
                    break
                if self._stopped.is_set():
                    return batch, True, None
                continue
            if item is _END:
                return batch, True, None
            if isinstance(item, _Failed):
                return batch, True, item.error
            batch.append(item)  # type: ignore[arg-type]  # the queue holds specs otherwise
        return batch, False, None

    def stop(self, wait_s: float = 5.0) -> None:
        """End the reading (the run is over or interrupted), and wait up to ``wait_s`` for
        the thread to close the source (a read in progress ends first)."""
        self._stopped.set()
        self._thread.join(wait_s)

    def _read(self, source: Iterator[EpisodeSpec]) -> None:
        try:
            for spec in source:
                if not self._put(spec):
                    return
            self._put(_END)
        except Exception as exc:
            self._put(_Failed(exc))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def _put(self, item: object) -> bool:
        """Queue ``item``, waiting for room; False once the run stopped."""
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
            except queue.Full:
                continue
            return True
        return False

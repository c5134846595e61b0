"""How the engine feeds its workers: their names, how many episodes it keeps out at once,
and in what batches.

A reserve waits in the workers beyond ``concurrency``, so a freed slot starts the next
episode at once instead of after a round trip; ``Refill`` sizes it from the run's measured
episode time and refill lag, and ``worker_limits`` splits it per worker.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

_RESERVE_S = 0.1  # the least round trip a worker's reserve covers

WORKER_PREFIX = "worker:"
"""Worker actors are named ``worker:<i>`` in the run's namespace."""


def worker_name(index: int) -> str:
    """Actor name of the i-th worker in a run's namespace."""
    return f"{WORKER_PREFIX}{index}"


def worker_share(concurrency: int, num_workers: int, index: int) -> int:
    """Episodes the i-th worker may run at once: the shares add up to ``concurrency``."""
    return max(1, concurrency // num_workers + (1 if index < concurrency % num_workers else 0))


def chunk_size(concurrency: int, num_workers: int) -> int:
    """Most episodes per worker call: enough to amortize the call (about 1.4 ms of the
    engine's CPU each; 64 rather than 32 took a tenth off the engine's CPU per episode), few
    enough to spread the work over the workers."""
    return max(1, min(64, concurrency // (num_workers * 2)))


def most_reserve(concurrency: int, num_workers: int) -> int:
    """The largest reserve: a chunk per worker."""
    return chunk_size(concurrency, num_workers) * num_workers


def refill_cover(refill_s: float | None) -> float:
    """Seconds a reserve must cover: the measured refill (``refill_lag``) doubled for the way
    back, and at least ``_RESERVE_S``."""
    return max(_RESERVE_S, 2 * refill_s) if refill_s else _RESERVE_S


def reserve(
    concurrency: int,
    num_workers: int,
    episode_s: float | None,
    refill_s: float | None = None,
    burst: int = 0,
) -> int:
    """Episodes sent to workers beyond ``concurrency``, waiting there. Workers still run at
    most ``concurrency`` at once between them (``worker_share``).

    As many as finish within one refill: at the run's mean episode time (``episode_s``; None
    before the first rows: a chunk per worker), or as many as were seen ending together
    (``burst``, from ``Refill``), whichever is more; at most a chunk per worker. The refill is
    ``refill_s`` as measured (``refill_lag``) doubled for the way back, and at least
    ``_RESERVE_S``: a loaded machine or a slow verifier stretches it. Long episodes that end
    apart need almost none, and must not get more: an episode waiting in a busy worker cannot
    move to another worker's free slot, so a big reserve would stretch the tail of a round of
    minute-long episodes.

    Episodes that started together and generate the same number of tokens (every sample cut
    at ``max_tokens``, common early in training) end in the same step of the policy's batch.
    By rate alone the reserve would be two of them for 32 slots: the rest of the wave's slots
    would wait for refills, the next wave would go out spread over them, and the policy would
    run smaller batches for the rest of the round (rounds a third longer against a policy that
    answers in fixed time).

    >>> reserve(32, 2, 1.6)  # 32 slots x 0.1 s / 1.6 s
    2
    >>> reserve(32, 2, 1.6, burst=12)  # twelve seen ending within one refill
    12
    """
    most = most_reserve(concurrency, num_workers)
    if not episode_s:
        return most
    rate = math.ceil(concurrency * refill_cover(refill_s) / episode_s)
    return min(most, max(burst, rate))


def send_limits(concurrency: int, chunk: int, waiting: int) -> tuple[int, int]:
    """(most episodes out at once, episodes per worker call), for a reserve of ``waiting``.

    The feeder waits for room for a whole batch before it sends one, so the workers must
    still hold their reserve when it does: the batch's room comes on top of it. A batch is at
    most the reserve, so long episodes (a reserve of one) go one at a time and no worker
    hoards them. (A batch counted inside the reserve left every slot that emptied waiting
    until a whole batch's worth had finished: on short episodes the policy ran well under
    ``concurrency`` requests.)

    >>> send_limits(32, 8, 2)  # a quick refill: batches of two, two more waiting
    (36, 2)
    >>> send_limits(32, 8, 16)  # before the first rows: chunks of 8, a chunk per worker
    (56, 8)
    """
    batch = min(chunk, waiting)
    return concurrency + waiting + batch, batch


def worker_limits(
    concurrency: int, num_workers: int, index: int, chunk: int, waiting: int
) -> tuple[int, int]:
    """(most episodes out at worker ``index`` at once, episodes per call to it), for a
    reserve of ``waiting`` over all workers: each worker holds its share of ``concurrency``
    and an equal part of the reserve (``send_limits``).

    Per worker, because an episode waiting in one worker cannot move to another's free
    slot. Counted over all workers, the first batches (whole chunks, to the least-loaded
    worker) left one worker holding a chunk more than the other: its slots ran a wave ahead
    while the other's sat empty until a refill, and to the end of the run one worker had
    more episodes than the other, so the policy ran the last wave of a collect short.

    >>> worker_limits(32, 2, 0, 8, 2)  # a quick refill: one more waiting in each worker
    (18, 1)
    >>> worker_limits(32, 2, 1, 8, 16)  # before the first rows: a chunk waiting in each
    (32, 8)
    """
    own = -(-waiting // num_workers)
    return send_limits(worker_share(concurrency, num_workers, index), chunk, own)


def worker_with_room(limits: list[int], loads: list[int], batch: int) -> int | None:
    """The worker to send a batch of ``batch`` episodes to: the one with the most room
    (``limits``, from ``worker_limits``, less the episodes it holds), or None while none
    has room for the batch. Ties go to the lowest index.

    >>> worker_with_room([32, 32], [8, 0], 8)
    1
    >>> worker_with_room([18, 18], [17, 18], 2) is None
    True
    """
    rooms = [most - load for most, load in zip(limits, loads, strict=True)]
    index = max(range(len(rooms)), key=rooms.__getitem__)
    return index if rooms[index] >= batch else None


def loop_end(metrics: dict[str, Any]) -> float | None:
    """When an episode's agent loop ended (its worker freed its slot then), by the worker's
    clock; None for a row that does not say (a failed episode's)."""
    if not metrics.get("started_at"):
        return None
    return float(metrics["started_at"] + metrics["seconds_total"] - metrics["seconds_verify"])


def refill_lag(ends: list[float], now: float) -> float | None:
    """Mean seconds from the end of an episode's agent loop (``loop_end``: where its worker
    freed its slot) to its row reaching the engine at ``now``: the verifier, the session's
    close, the row and the trip. Clocks of other nodes may be off a little; the figure is
    clamped to [0, 10] s."""
    if not ends:
        return None
    return min(10.0, max(0.0, now - sum(ends) / len(ends)))


class Refill:
    """What the reserve is sized from, measured from the rows as they reach the engine:
    the mean episode time and refill lag (recent rows weigh more), and the most episodes
    seen ending within one refill of each other (``burst``)."""

    def __init__(self, concurrency: int, num_workers: int) -> None:
        self.concurrency = concurrency
        self.num_workers = num_workers
        self.episode_s: float | None = None
        self.refill_s: float | None = None
        self.burst = 0
        # The last loop ends seen: twice the largest reserve, enough to see a burst that
        # would fill it.
        self.ends: deque[float] = deque(maxlen=2 * most_reserve(concurrency, num_workers))

    def observe(self, summaries: list[dict[str, Any]], now: float) -> None:
        """Take in a batch of finished episodes' summaries (their ``metrics``)."""
        seconds = [s["metrics"]["seconds_total"] for s in summaries]
        ends = [end for end in (loop_end(s["metrics"]) for s in summaries) if end is not None]
        self.observe_batch(sum(seconds) / len(seconds) if seconds else None, ends, now)

    def observe_batch(self, episode_s: float | None, ends: list[float], now: float) -> None:
        """Take in a batch of finished episodes as their mean time and loop ends
        (``loop_end``): what a worker's ``Tally`` holds."""
        if episode_s is not None:
            old = self.episode_s
            self.episode_s = episode_s if old is None else 0.8 * old + 0.2 * episode_s
        lag = refill_lag(ends, now)
        if lag is not None:
            self.refill_s = lag if self.refill_s is None else 0.8 * self.refill_s + 0.2 * lag
            self.ends.extend(ends)
            self.burst = most_within(sorted(self.ends), refill_cover(self.refill_s))

    def reserve(self) -> int:
        """The reserve now (``reserve``)."""
        return reserve(
            self.concurrency, self.num_workers, self.episode_s, self.refill_s, self.burst
        )


def most_within(times: list[float], window: float) -> int:
    """The most of ``times`` (sorted) that fall within ``window`` seconds of each other.

    >>> most_within([0.0, 0.01, 0.02, 1.0, 1.05], 0.1)
    3
    """
    most, first = 0, 0
    for last, time in enumerate(times):
        while time - times[first] > window:
            first += 1
        most = max(most, last - first + 1)
    return most

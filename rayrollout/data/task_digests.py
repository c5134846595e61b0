"""Keys of a million tasks in a few bytes each: fixed-size digests in sorted numpy runs.

Checking that a task set's ids are unique, skipping what a resumed run already wrote, and
continuing each task's sample indices in ``generate(write=True)`` all need a lookup over
every task seen. A Python set or dict of ids costs 100-200 bytes a task (the string, a
tuple, the slot), which at a million tasks is the driver's whole memory budget. Here a key
is a 12-byte BLAKE2b digest (two keys of ten million collide with odds near 10^-15), held as
a ``uint64`` and a ``uint32`` column, plus an optional fixed-size value per key: 12 bytes a
key, 20 with a ``uint64`` value, whatever the keys' length.

New keys wait in a small dict (``BUFFER`` keys); a full buffer becomes a sorted run, and
runs of similar size are merged, as a log-structured merge tree does, so a lookup is one
dict probe and a binary search in each of about log2(n / ``BUFFER``) runs, and the arrays
are rewritten O(log n) times in all. A key is in at most one place, so a value is updated
where it lies.

Example:
    >>> seen = DigestTable(np.dtype("<u8"))
    >>> seen.setdefault(b"task-a", 1), seen.setdefault(b"task-a", 7)
    (1, 1)
    >>> b"task-b" in seen, len(seen)
    (False, 1)
"""

from __future__ import annotations

import array
import hashlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

__all__ = [
    "BUFFER",
    "DIGEST_BYTES",
    "DigestTable",
    "NextSamples",
    "SampleKeys",
    "digest",
    "digests",
    "sample_key",
]

DIGEST_BYTES = 12
"""Bytes of a key's digest: 8 searched on, 4 compared among equal ones."""
BUFFER = 16_384
"""Keys held in a dict before they become a sorted run (about 2 MB at most)."""
_KEY = np.dtype([("key", "<u8"), ("check", "<u4")])


def digest(data: bytes) -> bytes:
    """A key's 12-byte digest."""
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def digests(items: Iterable[bytes]) -> np.ndarray:
    """Many keys' digests as one structured array (fields ``key``, ``check``)."""
    joined = b"".join(digest(item) for item in items)
    return np.frombuffer(joined, dtype=_KEY)


class _Run:
    """Keys sorted by ``key``, with their checks and values in the same order."""

    __slots__ = ("checks", "keys", "values")

    def __init__(self, keys: np.ndarray, checks: np.ndarray, values: np.ndarray | None) -> None:
        self.keys, self.checks, self.values = keys, checks, values

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, key: np.uint64, check: int) -> int:
        """The index of the digest, or -1."""
        index = int(self.keys.searchsorted(key))
        while index < len(self.keys) and self.keys[index] == key:
            if self.checks[index] == check:
                return index
            index += 1
        return -1

    def merge(self, other: _Run) -> _Run:
        """One sorted run of both (their keys are disjoint), in O(n) moves."""
        at = self.keys.searchsorted(other.keys)
        values = None
        if self.values is not None and other.values is not None:
            values = np.insert(self.values, at, other.values)
        return _Run(
            np.insert(self.keys, at, other.keys), np.insert(self.checks, at, other.checks), values
        )

    @property
    def nbytes(self) -> int:
        extra = 0 if self.values is None else self.values.nbytes
        return self.keys.nbytes + self.checks.nbytes + extra


class DigestTable:
    """A set of byte-string keys (by digest), each with an optional fixed-size value.

    Args:
        value_dtype: The numpy dtype of a key's value (a scalar, or a structured dtype
            whose values are tuples); None keeps keys only (a set: 12 bytes a key).
    """

    def __init__(self, value_dtype: np.dtype | None = None) -> None:
        self.value_dtype = value_dtype
        self._buffer: dict[bytes, Any] = {}
        self._runs: list[_Run] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __contains__(self, item: object) -> bool:
        return isinstance(item, bytes) and self._where(digest(item))[0] is not None

    @property
    def nbytes(self) -> int:
        """Bytes held by the sorted runs (the buffer adds at most about 2 MB)."""
        return sum(run.nbytes for run in self._runs)

    def get(self, item: bytes, default: Any = None) -> Any:
        """The value of ``item``'s key, or ``default``."""
        place, index = self._where(digest(item))
        if place is None:
            return default
        return self._value(place, index, digest(item))

    def setdefault(self, item: bytes, value: Any = None) -> Any:
        """The value already kept for ``item``, else keep ``value`` and return it."""
        key = digest(item)
        place, index = self._where(key)
        if place is not None:
            return self._value(place, index, key)
        self._add(key, value)
        return value

    def set(self, item: bytes, value: Any) -> None:
        """Keep ``value`` for ``item``, replacing the value kept before."""
        self._put(item, value, lambda kept: value)

    def set_max(self, item: bytes, value: int) -> None:
        """Keep the larger of ``value`` and the value kept for ``item`` (scalar values)."""
        self._put(item, value, lambda kept: max(int(kept), value))

    def _put(self, item: bytes, value: Any, combine: Callable[[Any], Any]) -> None:
        """Keep ``value`` for a new ``item``, else ``combine(value kept)`` in its place."""
        key = digest(item)
        place, index = self._where(key)
        if place is None:
            self._add(key, value)
        elif isinstance(place, dict):
            place[key] = combine(place[key])
        elif place.values is not None:
            place.values[index] = combine(place.values[index])

    def load(self, items: Iterable[bytes] | Iterable[tuple[bytes, int]]) -> None:
        """Add many keys at once (a folder's written keys): keys, or ``(key, value)`` pairs
        with a scalar ``value_dtype``, the largest value kept for a key met twice. Only on
        an empty table; a key's digest and value are all that is held while loading."""
        if self._size:
            raise ValueError("load() fills an empty table; add to a filled one key by key")
        joined, values = bytearray(), array.array("q")
        for item in items:
            if isinstance(item, tuple):
                joined += digest(item[0])
                values.append(item[1])
            else:
                joined += digest(item)
        found = np.frombuffer(bytes(joined), dtype=_KEY)
        del joined
        if not len(found):
            return
        order = np.lexsort((found["check"], found["key"]))
        found = found[order]
        firsts = np.ones(len(found), dtype=bool)
        firsts[1:] = (found["key"][1:] != found["key"][:-1]) | (
            found["check"][1:] != found["check"][:-1]
        )
        run_values = None
        if self.value_dtype is not None:
            given = np.frombuffer(values, dtype=np.int64).astype(self.value_dtype)[order]
            run_values = np.maximum.reduceat(given, np.flatnonzero(firsts))
        unique = found[firsts]
        self._runs = [_Run(unique["key"].copy(), unique["check"].copy(), run_values)]
        self._size = len(unique)

    # Inside.

    def _where(self, key: bytes) -> tuple[dict[bytes, Any] | _Run | None, int]:
        if key in self._buffer:
            return self._buffer, 0
        if self._runs:
            head, check = np.uint64(int.from_bytes(key[:8], "little")), key[8:]
            check_int = int.from_bytes(check, "little")
            for run in self._runs:
                index = run.find(head, check_int)
                if index >= 0:
                    return run, index
        return None, -1

    def _value(self, place: dict[bytes, Any] | _Run, index: int, key: bytes) -> Any:
        if isinstance(place, dict):
            return place[key]
        if place.values is None:
            return None
        value = place.values[index]
        return value.item() if hasattr(value, "item") else value

    def _add(self, key: bytes, value: Any) -> None:
        self._buffer[key] = value
        self._size += 1
        if len(self._buffer) >= BUFFER:
            self._spill()

    def _spill(self) -> None:
        """The buffer as a sorted run; runs merged while the one below is no bigger."""
        found = np.frombuffer(b"".join(self._buffer), dtype=_KEY)
        order = np.argsort(found["key"], kind="stable")
        values = None
        if self.value_dtype is not None:
            values = np.array(list(self._buffer.values()), dtype=self.value_dtype)[order]
        self._runs.append(_Run(found["key"][order], found["check"][order], values))
        self._buffer = {}
        while len(self._runs) > 1 and len(self._runs[-2]) <= len(self._runs[-1]):
            newer = self._runs.pop()
            self._runs[-1] = self._runs[-1].merge(newer)


def sample_key(task_id: str, sample_index: int) -> bytes:
    """The bytes of a ``(task_id, sample_index)`` key (a task id holds no NUL: ``Task``
    refuses control characters, so the join is unambiguous)."""
    return f"{task_id}\0{sample_index}".encode()


class SampleKeys:
    """A set of ``(task_id, sample_index)`` pairs (what a resumed run finds written), 12
    bytes a pair; ``pair in keys`` and ``len(keys)`` as a set of tuples answers them."""

    def __init__(self, pairs: Iterable[tuple[str, int]] = ()) -> None:
        self._table = DigestTable()
        self._table.load(sample_key(task_id, index) for task_id, index in pairs)

    def __contains__(self, pair: object) -> bool:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            return False
        return sample_key(*pair) in self._table

    def __len__(self) -> int:
        return len(self._table)

    def add(self, task_id: str, sample_index: int) -> None:
        """Add one pair."""
        self._table.setdefault(sample_key(task_id, sample_index))

    @property
    def nbytes(self) -> int:
        """Bytes of the digests held."""
        return self._table.nbytes


class NextSamples:
    """The next free sample index of each task id (``generate(write=True)``), 16 bytes a
    task: read as a dict of ``str -> int`` is (``get``, ``[]=``), by the ids' digests."""

    def __init__(self, pairs: Iterable[tuple[str, int]] = ()) -> None:
        self._table = DigestTable(np.dtype("<u4"))
        self._table.load((task_id.encode(), index) for task_id, index in pairs)

    def get(self, task_id: str, default: int = 0) -> int:
        """The next free index of ``task_id`` (``default`` for a task never written)."""
        value = self._table.get(task_id.encode())
        return default if value is None else int(value)

    def __getitem__(self, task_id: str) -> int:
        value = self._table.get(task_id.encode())
        if value is None:
            raise KeyError(task_id)
        return int(value)

    def __setitem__(self, task_id: str, index: int) -> None:
        self._table.set(task_id.encode(), index)

    def __contains__(self, task_id: object) -> bool:
        return isinstance(task_id, str) and task_id.encode() in self._table

    def __len__(self) -> int:
        return len(self._table)

    def raise_to(self, task_id: str, index: int) -> None:
        """Make the next free index of ``task_id`` at least ``index``."""
        self._table.set_max(task_id.encode(), index)

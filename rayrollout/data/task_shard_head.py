"""A shard set's first rows and its Parquet row count, read in a child process of the driver.

Why a child process: decoding Parquet grows the process that does it, and for good (Arrow's
allocator, the pages of its libraries it touches: measured, most of what a shard set's driver
held beyond a tasks file's, ``benchmarks/task_scale.py``), and the driver lives as long as
the run. So the driver asks this module, run as ``python -m rayrollout.data.task_shard_head``,
for what it needs: the head's raw rows (``HEAD_ROWS`` of them at most, about 0.5 MB of JSON
text) and one number, and checks the rows itself (``tasks.row_from_line``), so they are
named by shard and line as every row is. The head is read before anything starts, Ray
included, so this is a plain process rather than a Ray task; the rows after the head are
read by the reader actor (``task_shard_reader``).

``shard_lines``, the one reading of a shard's rows (here, by the child, by Ray Data's read
tasks through ``task_shard_source``, and for a JSONL shard's head by the driver), lives here
so that the child imports Arrow and little else.

The request comes on stdin as JSON (``{"head": limit, "paths": [...]}`` or ``{"count": true,
"paths": [...]}``; a set may have thousands of shards, too many for a command line); the
answer is one pickle on stdout: ``("rows", [(shard index, line, raw bytes), ...])``,
``("count", rows)``, or ``("error", shard index, message)`` for a shard that cannot be read.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from rayrollout.data.errors import HeadReadError

__all__ = ["count_apart", "head_apart", "main", "shard_lines"]

Answer = tuple[Any, ...]
_READ_CHUNK = 1 << 20


def shard_lines(file: IO[bytes], parquet: bool) -> Iterator[tuple[int, bytes]]:
    """``(line, raw JSON)`` for every row of an open shard: a JSONL shard's lines that are
    not blank, split on ``\\n`` only (numbered as a text editor numbers them); a Parquet
    shard's rows as JSON, numbered from 1, null fields left out as a file's are."""
    if parquet:
        import pyarrow.parquet as pq  # in the processes that read shards, not the driver

        number = 0
        for batch in pq.ParquetFile(file).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                number += 1
                kept = {k: v for k, v in row.items() if v is not None}
                yield number, json.dumps(kept, ensure_ascii=False, default=str).encode()
        return
    number, rest = 0, b""
    while chunk := file.read(_READ_CHUNK):
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            number += 1
            if line.strip():
                yield number, line
    if rest.strip():
        yield number + 1, rest


def head_apart(paths: list[Path], limit: int) -> list[tuple[int, int, bytes]]:
    """The first ``limit`` rows of ``paths``, shard after shard, read by a child process:
    ``(index in paths, line, raw JSON)``.

    Raises:
        HeadReadError: a shard could not be read; ``index`` says which.
    """
    answer = _ask({"head": limit, "paths": [str(p) for p in paths]})
    if answer[0] == "error":
        raise HeadReadError(answer[1], answer[2])
    rows: list[tuple[int, int, bytes]] = answer[1]
    return rows


def count_apart(paths: list[Path]) -> int | None:
    """Rows in the Parquet shards ``paths``, from their footers, read by a child process;
    None when a footer cannot be read (the rows themselves say what is wrong)."""
    try:
        answer = _ask({"count": True, "paths": [str(p) for p in paths]})
    except HeadReadError:
        return None
    return int(answer[1]) if answer[0] == "count" else None


def _ask(request: dict[str, Any]) -> Answer:
    # The child imports this package from where the driver does, whatever its sys.path.
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-m", __name__],
        env={**os.environ, "PYTHONPATH": path},
        input=json.dumps(request).encode(),
        capture_output=True,
        check=False,
    )
    if done.returncode != 0 or not done.stdout:
        lines = done.stderr.decode(errors="replace").strip().splitlines() or ["no answer"]
        raise HeadReadError(None, f"the process reading it failed: {lines[-1]}")
    answer: Answer = pickle.loads(done.stdout)  # our own child's answer
    return answer


def _answer(request: dict[str, Any]) -> Answer:
    import pyarrow.parquet as pq

    paths = [Path(p) for p in request["paths"]]
    index = 0
    try:
        if request.get("count"):
            total = 0
            for index in range(len(paths)):  # the index names a shard that fails
                total += pq.read_metadata(paths[index]).num_rows
            return ("count", total)
        rows: list[tuple[int, int, bytes]] = []
        limit = int(request["head"])
        for index, path in enumerate(paths):
            with path.open("rb") as file:
                for line, raw in shard_lines(file, path.suffix == ".parquet"):
                    if len(rows) >= limit:
                        return ("rows", rows)
                    rows.append((index, line, raw))
        return ("rows", rows)
    except Exception as exc:  # any reason a shard cannot be read goes back to the driver
        return ("error", index, f"{type(exc).__name__}: {exc}".strip())


def main() -> None:
    """Answer the request on stdin (see the module's docstring)."""
    answer = _answer(json.loads(sys.stdin.buffer.read()))
    sys.stdout.buffer.write(pickle.dumps(answer))


if __name__ == "__main__":
    main()

"""Where a run's log noise goes: a file in the output folder, so the console keeps only
rayrollout's own progress, summary and errors.

Ray's, Serve's and every worker's output goes to ``LOG_FILE`` in the output folder, beside
the rows it explains (``--verbose`` keeps it on the console); the file lives in ``_logs/``,
which readers skip, and is appended to, one header per run.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from rich.console import Console

__all__ = ["LOG_FILE", "LogFile", "log_path", "logs_routed", "routed_logs"]

LOG_FILE = "_logs/collect.log"
"""The run's log, relative to its output folder."""


def log_path(out_dir: str | Path) -> Path:
    """Where a run writing to ``out_dir`` keeps its log."""
    return Path(out_dir) / LOG_FILE


class LogFile(io.TextIOBase):
    """A text stream into the log file, opened at its first write.

    Written from several threads at once (Ray's log thread, logging handlers, the main
    thread), so each write holds a lock: lines from two threads never interleave mid-line.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None
        self._lock = threading.Lock()

    @property
    def written(self) -> bool:
        """Whether anything was written (the file exists from the first write on)."""
        return self._file is not None

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False  # nothing downstream should colour or redraw for a file

    def write(self, text: str) -> int:
        with self._lock:
            if self._file is None:
                if self.closed:
                    return len(text)  # a late line after the run: dropped, not an error
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", encoding="utf-8", buffering=1)
                stamp = time.strftime("%Y-%m-%d %H:%M:%S")
                self._file.write(f"===== run of {stamp} =====\n")
            self._file.write(text)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
        super().close()


_active: list[LogFile] = []


def logs_routed() -> bool:
    """Whether a run's logs go to its file now (the progress bar then leaves
    ``sys.stdout``/``sys.stderr`` alone instead of printing them above itself)."""
    return bool(_active)


@contextmanager
def routed_logs(console: Console, out_dir: str | Path, verbose: bool = False) -> Iterator[None]:
    """For the ``with`` body, send Ray's, Serve's and the workers' output to the run's log
    file; ``console`` keeps printing to the terminal. With ``verbose``, change nothing.

    On leaving, one console line names the file if anything was written to it.
    """
    if verbose:
        yield
        return
    log = LogFile(log_path(out_dir))
    real_out, real_err = sys.stdout, sys.stderr
    pinned = console._file  # None: the console follows sys.stderr, which is about to move
    console.file = real_err
    standard = {id(s) for s in (real_out, real_err, sys.__stdout__, sys.__stderr__) if s}
    moved = _retarget(lambda stream: id(stream) in standard, log)
    sys.stdout = sys.stderr = log
    _active.append(log)
    try:
        yield
    finally:
        _release_held_worker_lines()  # while sys.stdout and sys.stderr are still the log
        _active.remove(log)
        sys.stdout, sys.stderr = real_out, real_err
        for handler, stream in moved:
            handler.setStream(stream)
        # Handlers made during the run (Serve's, at its start) took the log as their stream.
        _retarget(lambda stream: stream is log, real_err)
        console._file = pinned
        if log.written:
            console.print(  # unwrapped: the path stays whole, to copy
                f"[dim]logs of Ray, Serve and the workers: {log.path}",
                highlight=False,
                soft_wrap=True,
            )
        log.close()


def _release_held_worker_lines() -> None:
    """Print now, where ``sys.stdout``/``sys.stderr`` point, the worker lines Ray holds back.

    Ray's driver deduplicates worker lines: a line that a second worker repeats is held for
    up to 5 s to be counted, and what is still held is printed at ``ray.shutdown``, which for
    the CLI is the process's exit: after the summary, on the console. The demo's two worker
    actors both logged Serve's router start-up; one copy went to the file, the other ended the
    console. The names are Ray's private ones; if they move, the lines are left to Ray.
    """
    worker = sys.modules.get("ray._private.worker")
    if worker is None:
        return  # Ray was never imported here: nothing is held
    try:
        from ray._private.ray_logging import stderr_deduplicator, stdout_deduplicator

        ignore_prefix = worker._should_ignore_worker_log_prefix(worker.global_worker)
        for deduplicator, stream in (
            (stdout_deduplicator, sys.stdout),
            (stderr_deduplicator, sys.stderr),
        ):
            for batch in deduplicator.flush():
                worker.print_worker_logs(batch, stream, ignore_prefix)
    except (ImportError, AttributeError, RuntimeError):  # RuntimeError: Ray's log thread
        return  # changed the held set while it was read; Ray prints the rest at exit


def _retarget(
    matches: Callable[[Any], bool], target: IO[str] | io.TextIOBase
) -> list[tuple[logging.StreamHandler, Any]]:
    """Point every logging handler whose stream ``matches`` at ``target``; returns each
    moved handler with its former stream."""
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    moved: list[tuple[logging.StreamHandler, Any]] = []
    for logger in loggers:
        for handler in list(logger.handlers):
            if (
                isinstance(handler, logging.StreamHandler)
                and not isinstance(handler, logging.FileHandler)
                and matches(handler.stream)
            ):
                try:
                    moved.append((handler, handler.setStream(target)))
                except AttributeError:  # logging's last-resort handler: it follows sys.stderr
                    continue
    return moved

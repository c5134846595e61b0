"""The local Ray head ``rayrollout up`` starts on a machine with no cluster, kept until ``down``.

A Ray that ``ray.init`` starts ends with the process that started it, so ``up`` starts a
real head instead: ``ray start --head --block`` in a session of its own (a terminal closing,
or ``up`` itself being killed, does not end it), with the run's settings (``ray.num_cpus``,
``ray.head_port``, ``ray.temp_dir``), Serve's patience and without the driver's secrets
(``services.ensure_ray`` says why). Where it runs is recorded in an owner-only file,
``~/.rayrollout/local-ray.json``, written as soon as the head is spawned: ``up`` run again
after an ``up`` stopped half-way joins the same head, ``status`` and ``down`` find it
without ``--address``, and ``down`` ends it (its process group: the blocking ``ray start``
reaps the GCS, the raylet and the workers) once no rayrollout engine or service is left on
it. The dashboard, its agent and the Ray client server get free ports of their own, so two
heads on one machine do not fight over Ray's fixed defaults.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from rayrollout.data.config import RunConfig
from rayrollout.engine.errors import LocalHeadError
from rayrollout.ports import free_port

__all__ = [
    "HEAD_START_TIMEOUT_S",
    "MOST_STARTS",
    "LocalHead",
    "LocalHeadError",
    "find_head",
    "group_members",
    "head_state_path",
    "start_or_join_head",
    "state_summary",
    "stop_head",
]

log = logging.getLogger("rayrollout")

# A bare machine takes 4 s. A loaded one took over 3 minutes: Ray waits up to 60 s for its
# dashboard process (started even without the web UI) before it goes on without it.
HEAD_START_TIMEOUT_S = 300.0
_STOP_GRACE_S = 10.0
# What `ray start` prints when one of Ray's own fixed start-up waits ran out: for its raylet
# (30 s), for a GCS that was not answering yet, or for its dashboard process (Ray goes on
# without it, so this one matters only for a head not up by HEAD_START_TIMEOUT_S).
_START_WAITS_RAN_OUT = (
    "timed out during startup",
    "Failed to connect to GCS",
    "Failed to start the dashboard",
)
MOST_STARTS = 4
"""Starts of ``ray start`` that may each end on one of Ray's fixed start-up waits. A machine
loaded by other programs misses them now and then; each start gets the same chance."""


class LocalHead(BaseModel):
    """A local Ray head ``up`` started: its process and where it listens."""

    pid: int = Field(
        description="The blocking `ray start` process; its process group is the head's."
    )
    temp_dir: str = Field(description="The head's temp folder (sessions, sockets, logs).")
    log: str = Field(description="Where the `ray start` process writes its output.")
    started_at: float = Field(description="Unix time the head was spawned.")
    address: str | None = Field(default=None, description="GCS address, once the head is up.")

    def alive(self) -> bool:
        """Whether the ``ray start`` process still runs (and is a Ray's, not a reused pid)."""
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError:
            return False
        return b"ray" in cmdline and self.temp_dir.encode() in cmdline


def head_state_path() -> Path:
    """``~/.rayrollout/local-ray.json``: the local head ``up`` started, if any."""
    return Path.home() / ".rayrollout" / "local-ray.json"


def find_head() -> LocalHead | None:
    """The recorded local head while its process runs, else None."""
    try:
        head = LocalHead.model_validate_json(head_state_path().read_text())
    except (OSError, ValueError):
        return None
    return head if head.alive() else None


def _write_state(head: LocalHead) -> None:
    path = head_state_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=".local-ray-")
    with os.fdopen(fd, "w") as handle:  # mkstemp's file is owner-only already
        handle.write(head.model_dump_json())
    os.replace(name, path)


@contextmanager
def _locked() -> Iterator[None]:
    """One ``up`` at a time finds or starts the head (two at once would start two)."""
    path = head_state_path().with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def start_or_join_head(config: RunConfig, env: dict[str, str]) -> LocalHead:
    """The recorded head if it runs (waiting for it to be up), else a new one; returns it
    with its address.

    Args:
        config: The run's config (``ray.num_cpus``, ``ray.head_port``, ``ray.temp_dir``).
        env: The head's environment (the caller strips secrets and adds Ray's settings).

    A head whose ``ray start`` ran out of Ray's own wait for its raylet or GCS is started again,
    up to ``MOST_STARTS`` starts in all.

    Raises:
        LocalHeadError: the head did not come up within ``HEAD_START_TIMEOUT_S`` or its
            ``ray start`` ended (on a start-up wait: ``MOST_STARTS`` times); the message
            names its log.
    """
    with _locked():
        head, process = find_head(), None
        if head is None:
            head, process = _spawn(config, env)
        elif head.address is None:
            log.warning(
                "joining the local Ray an earlier `rayrollout up` started (pid %d)", head.pid
            )
        if head.address is None:
            head = _wait_for_head(head, process, config, env)
            _write_state(head)
    return head


def _wait_for_head(
    head: LocalHead,
    process: subprocess.Popen[bytes] | None,
    config: RunConfig,
    env: dict[str, str],
) -> LocalHead:
    """``head`` once it is up, with its address. A ``ray start`` of this process that ended on
    Ray's own start-up waits is started again, up to ``MOST_STARTS`` starts in all."""
    starts = 1
    while True:
        try:
            head.address = _wait_for_address(head, process)
            return head
        except LocalHeadError:
            if process is None or starts == MOST_STARTS or not _start_wait_ran_out(head):
                if process is not None:  # a `ray start` still up with no head: not left behind
                    stop_head(head)
                raise
        starts += 1
        log.warning(
            "Ray's own start-up wait for its raylet or GCS ran out (a busy machine); starting "
            "the local Ray head again, start %d of at most %d (log: %s)",
            starts,
            MOST_STARTS,
            head.log,
        )
        stop_head(head)
        head, process = _spawn(config, env)


def _start_wait_ran_out(head: LocalHead) -> bool:
    """Whether the head's ``ray start`` ended on one of Ray's fixed start-up waits (for its
    raylet, for the GCS), which a loaded machine can miss; a later start finds the machine's
    caches warm."""
    try:
        log_text = Path(head.log).read_text()
    except OSError:
        return False
    return any(message in log_text for message in _START_WAITS_RAN_OUT)


def _spawn(config: RunConfig, env: dict[str, str]) -> tuple[LocalHead, subprocess.Popen[bytes]]:
    temp_dir = config.ray.temp_dir or os.path.join(tempfile.gettempdir(), "ray")
    state = head_state_path()
    state.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    log_path = state.with_name("local-ray.log")
    command = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        "--block",
        "--disable-usage-stats",
        f"--port={config.ray.head_port}",
        f"--num-cpus={config.ray.num_cpus or max(2, os.cpu_count() or 2)}",
        f"--temp-dir={temp_dir}",
        "--include-dashboard=false",
        f"--dashboard-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--ray-client-server-port={free_port()}",
    ]
    started_at = time.time()
    with open(log_path, "w") as output:  # owner-only: the home folder is 0700
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # outlives `up`, its terminal and a Ctrl-C sent to it
        )
    head = LocalHead(pid=process.pid, temp_dir=temp_dir, log=str(log_path), started_at=started_at)
    _write_state(head)  # first: an `up` killed from here on leaves a head the next one finds
    return head, process


def _wait_for_address(head: LocalHead, process: subprocess.Popen[bytes] | None) -> str:
    """The head's GCS address, once its ``ray start`` wrote it (``ray_current_cluster``).
    ``process``: the head, when this process spawned it (just spawned, it may not have
    replaced its command line yet, so ``alive`` cannot tell)."""
    address_file = Path(head.temp_dir, "ray_current_cluster")
    deadline = head.started_at + HEAD_START_TIMEOUT_S

    def running() -> bool:
        return process.poll() is None if process is not None else head.alive()

    while True:
        try:
            if address_file.stat().st_mtime >= head.started_at - 1:
                address = address_file.read_text().strip()
                if address:
                    return address
        except OSError:
            pass
        ended = not running()
        if ended or time.time() > deadline:
            tail = _log_tail(head.log)
            why = "ended" if ended else f"was not up after {HEAD_START_TIMEOUT_S:g}s"
            if ended:
                head_state_path().unlink(missing_ok=True)
            raise LocalHeadError(
                f"the local Ray head (`ray start --head`, pid {head.pid}) {why}: {tail} "
                f"(log: {head.log})"
            )
        time.sleep(0.25)


def _log_tail(path: str) -> str:
    try:
        lines = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "nothing logged"


def stop_head(head: LocalHead) -> None:
    """End the head's process group (SIGTERM, then SIGKILL after a grace period) and forget
    it. The blocking ``ray start`` stops the GCS, the raylet and their workers on SIGTERM."""
    _signal_and_wait(head.pid, signal.SIGTERM, poll_s=0.25)
    if _group_alive(head.pid):
        _signal_and_wait(head.pid, signal.SIGKILL, poll_s=0.1)
    head_state_path().unlink(missing_ok=True)


def _signal_and_wait(pgid: int, sig: signal.Signals, poll_s: float) -> None:
    """Send ``sig`` to process group ``pgid`` (gone already is fine) and wait, polling every
    ``poll_s``, until the group has ended or the grace period is over."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + _STOP_GRACE_S
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(poll_s)


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, from ``/proc``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ')'
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


def state_summary(head: LocalHead | None) -> dict[str, Any]:
    """What ``status`` says of the local head: its pid, address and log, or that none runs."""
    if head is None:
        return {"started_by_up": False}
    return {"started_by_up": True, "pid": head.pid, "log": head.log, "temp_dir": head.temp_dir}

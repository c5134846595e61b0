"""Run untrusted Python in a bubblewrap sandbox, under an unprivileged uid, and capture its output.

One job: run a script the model wrote and return what it printed. Each run gets a fresh
interpreter (``python -I -B``) in a bubblewrap (``bwrap``) sandbox built by ``_bwrap.py``.

What the sandbox promises, against code that knows it is sandboxed:

* **identity**: the code runs as a uid and gid of its own, drawn per run from
  ``UID_RANGE`` (no login user, not root, not the Ray workers' user), with no capabilities,
  no supplementary groups and ``no_new_privs``;
* **files**: it sees a read-only ``/usr``, the interpreter's prefix and ``/etc/ld.so.cache``
  only (not the repository, the virtual environment, ``/root``, ``/home``, ``/etc/shadow``,
  other runs' work dirs); its work dir is a private tmpfs of ``workdir_bytes``, the only
  writable place, gone when the run ends;
* **processes**: its own pid namespace (its ``/proc`` shows only its processes, so no
  ``/proc/<ppid>/environ``, no signals or ``ptrace`` to anything outside), a new session,
  ``RLIMIT_NPROC`` of ``max_tasks`` for its uid (processes and threads), and every process
  of the run is killed when it ends: the namespace dies with its init, which bwrap ends when
  the script exits or the run is killed for time;
* **network**: an empty network namespace (no 127.0.0.1, no DNS);
* **environment**: ``--clearenv``: only PATH, LANG, HOME and TMPDIR (the work dir);
* **limits**: a timeout on the code's own time, ``RLIMIT_AS`` memory and ``RLIMIT_CPU`` per
  process, ``RLIMIT_FSIZE``, no core files, output capped per stream. The code's time runs
  from the moment it starts, and leaves out what a busy machine takes from it: building the
  sandbox and starting the interpreter (bounded apart, ``START_LIMIT_S``), and the time it
  was ready to run but waited for a CPU (``_clock.py``; bounded apart, ``CPU_WAIT_LIMIT_S``).
  A busy machine would otherwise fail correct code; a sleeping or blocked program is still
  ended on time, and a program that keeps every CPU busy itself is ended by its CPU time.

What it does not promise: protection from kernel bugs (the code reaches the whole system-call
surface: there is no seccomp filter; it may create user namespaces of its own); a bound on
the run's total memory below ``max_tasks * memory_bytes`` (the limit is per process; a
memory cgroup would be tighter) or on kernel memory such as tmpfs inodes; confidentiality of
what is world-readable under ``/usr`` and the interpreter's prefix, or of host facts in
``/proc`` (CPU, memory, kernel version); fairness of CPU between runs; and two runs drawing
the same uid out of 100 million share the ``RLIMIT_NPROC`` budget (nothing else).

Why bubblewrap: it is a small, audited, setuid-free Debian package (``bubblewrap``) whose
one job is this; the sandbox is one argv, readable in ``_bwrap.py``. nsjail does as much
but brings a protobuf config language and is not in this machine's apt sources; landlock
(files only) and seccomp (system calls only) are layers, not a sandbox: neither gives a pid
or network namespace or hides ``/proc``. The audit hook of ``_bootstrap.py`` remains as
defence in depth and for clear error messages to honest code; the sandbox does not rely on it.

Cost, measured on this machine (2 shared cores, median of 50 runs of ``print(1)``, see
``benchmark.py``): 47 ms a run in the
sandbox against 26 ms for the plain ``unshare --net`` subprocess it replaced, so about 22 ms
more per tool call or verification (bwrap sets up namespaces and mounts; setpriv execs).
Starting it with vfork and ``prlimit`` instead of a ``preexec_fn`` fork costs nothing
measurable: 40 interleaved runs each, median 196 ms against 229 ms for the fork.

The process calling ``run_sandboxed`` must be root (bwrap runs privileged and hands the code
a uid of its own). If it is not, or bwrap is missing or cannot create its namespaces, the
run raises ``SandboxUnavailableError`` naming the fix; code is never run unsandboxed.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from ._bootstrap import BOOTSTRAP
from ._bwrap import (
    SandboxUnavailableError,
    bwrap_command,
    check_bubblewrap,
    interpreter,
    limits_command,
)
from ._clock import CodeClock

__all__ = [
    "UID_RANGE",
    "RunResult",
    "SandboxUnavailableError",
    "check_bubblewrap",
    "run_sandboxed",
]

MiB = 1024 * 1024

# Far above the uids systems hand out (logins < 60000, systemd's dynamic users < 65520,
# subordinate uid ranges for containers usually from 100000 in blocks of 65536).
UID_RANGE = range(1_500_000_000, 1_600_000_000)

START_LIMIT_S = 60.0
"""Bound on the sandbox's own start (namespaces, mounts, the interpreter), apart from the code's
timeout: a sandbox not started by then is killed and reported as timed out."""

CPU_WAIT_LIMIT_S = 60.0
"""Bound on the time the code may wait for a CPU other programs hold, on top of its own
``timeout_s``: past ``timeout_s + CPU_WAIT_LIMIT_S`` of wall time it is killed as timed out."""


@dataclass(frozen=True)
class RunResult:
    """What one sandboxed run did."""

    exit_code: int | None  # None when it was killed for running past the timeout
    stdout: str
    stderr: str
    timed_out: bool = False

    def report(self) -> str:
        """The run as readable text for a model."""
        status = "timed out and was killed" if self.timed_out else f"exit code {self.exit_code}"
        return f"{status}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


async def run_sandboxed(
    code: str,
    timeout_s: float = 5.0,
    memory_bytes: int = 512 * MiB,
    output_bytes: int = 8 * 1024,
    *,
    max_tasks: int = 16,
    workdir_bytes: int = 64 * MiB,
) -> RunResult:
    """Run ``code`` as a script in a fresh interpreter in a bubblewrap sandbox.

    Args:
        code: Python source to run as ``main.py``.
        timeout_s: Limit on the code's own time: wall time from when it starts, less the
            time it waited for a CPU (``START_LIMIT_S`` bounds the start,
            ``CPU_WAIT_LIMIT_S`` the waiting); the whole sandbox is killed when it passes.
        memory_bytes: Address-space limit per process (``RLIMIT_AS``).
        output_bytes: How much of stdout and of stderr to keep; the rest is dropped, noted.
        max_tasks: Processes plus threads the run's uid may have at once (``RLIMIT_NPROC``).
        workdir_bytes: Size of the work dir, the only writable place (also ``RLIMIT_FSIZE``).

    Returns:
        The exit code and output; ``timed_out`` is set when the run was killed.

    Raises:
        SandboxUnavailableError: bwrap is missing or cannot run here (the message says why).

    Example:
        >>> asyncio.run(run_sandboxed("print(6 * 7)")).stdout
        '42\n'
    """
    await asyncio.to_thread(check_bubblewrap)  # probes once per process
    cpu_s = int(timeout_s) + 1  # CPU time backs up the wall clock if the parent stalls
    uid = UID_RANGE.start + secrets.randbelow(len(UID_RANGE))
    workdir = f"/tmp/rayrollout-code-{uuid.uuid4().hex[:12]}"  # inside the sandbox only
    executable, _ = interpreter()

    script_fd = os.memfd_create("main.py", os.MFD_CLOEXEC)
    info_read, info_write = os.pipe()  # bwrap reports its init's pid here
    start_read, start_write = os.pipe()  # the bootstrap writes a byte here as the code starts
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    ours = [info_read, start_read, out_read, err_read]  # closed when the call ends, whatever
    process: subprocess.Popen[bytes] | None = None
    try:
        os.write(script_fd, code.encode("utf-8"))
        os.lseek(script_fd, 0, os.SEEK_SET)
        limits = limits_command(
            memory_bytes=memory_bytes, cpu_s=cpu_s, file_bytes=workdir_bytes, max_tasks=max_tasks
        )
        command = bwrap_command(
            workdir=workdir,
            script_fd=script_fd,
            uid=uid,
            workdir_bytes=workdir_bytes,
            argv=[str(executable), "-I", "-B", "-c", BOOTSTRAP, str(start_write)],
            info_fd=info_write,
        )
        # subprocess.Popen without a preexec_fn starts the child with vfork + exec, which
        # runs no fork handlers in this threaded process; the event loop's own subprocess
        # API would fork under uvloop (Ray's loop), and gRPC logged "skipping fork()
        # handlers" for every run. The limits are prlimit's; bwrap's --die-with-parent ends
        # the run if this process dies. Output and exit are awaited on their descriptors.
        process = subprocess.Popen(
            [*limits, *command],
            env={},  # bwrap --clearenv sets the sandbox's own; nothing of ours leaks in
            stdin=subprocess.DEVNULL,
            stdout=out_write,
            stderr=err_write,
            pass_fds=(script_fd, info_write, start_write),
            start_new_session=True,  # bwrap and its init in one group: one kill ends both
        )
        exited = os.pidfd_open(process.pid)  # readable once bwrap has exited
    except BaseException:
        if process is not None:  # started, but its pidfd could not be opened
            _kill_group(process.pid)
            process.wait()
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in (script_fd, info_write, start_write, out_write, err_write):
            os.close(fd)
    ours.append(exited)
    init = None
    try:
        start_by = time.monotonic() + START_LIMIT_S  # one bound for the whole start
        init, init_pid = await _sandbox_init(info_read, process.pid, START_LIMIT_S)
        if not await _until_readable(start_read, max(0.0, start_by - time.monotonic())):
            return RunResult(exit_code=None, stdout="", stderr="", timed_out=True)
        collect = asyncio.gather(
            _read_capped(out_read, output_bytes),
            _read_capped(err_read, output_bytes),
            _until_readable(exited),
        )
        if not await _within_code_time(collect, init_pid, timeout_s):
            return RunResult(exit_code=None, stdout="", stderr="", timed_out=True)
        stdout, stderr, _ = collect.result()
        return RunResult(exit_code=process.wait(), stdout=stdout, stderr=stderr)
    finally:
        # The sandbox's init is pid 1 of its namespace: when it dies, the kernel kills every
        # process in it, and its pidfd turns readable only once they are all gone. bwrap's
        # own exit says less (it may exit first), so the call waits for the pidfd.
        if init is not None:
            if process.poll() is None:  # timed out or cancelled: end the sandbox now
                signal.pidfd_send_signal(init, signal.SIGKILL)
            await _until_readable(init, timeout_s + 10)
            os.close(init)
        if process.poll() is None:
            _kill_group(process.pid)  # bwrap itself (and the init, if it never reported)
            await _until_readable(exited, 30)
        process.wait()  # reaps bwrap, gone by now
        for fd in ours:
            os.close(fd)


async def _within_code_time(
    collect: asyncio.Future[tuple[str, str, bool]], init_pid: int | None, timeout_s: float
) -> bool:
    """Wait for ``collect`` (the run's output and exit) while the code's own time
    (``CodeClock``) stays within ``timeout_s``; returns whether it finished. ``collect`` is
    cancelled when the run is out of time."""
    clock = CodeClock(init_pid, CPU_WAIT_LIMIT_S)
    left = timeout_s  # the clock reads /proc only when a wait runs out, not per run
    while left > 0:
        done, _ = await asyncio.wait({collect}, timeout=left)
        if done:
            return True
        left = timeout_s - clock.elapsed()
    collect.cancel()
    await asyncio.gather(collect, return_exceptions=True)
    return False


async def _sandbox_init(
    info_fd: int, bwrap_pid: int, timeout_s: float
) -> tuple[int, int] | tuple[None, None]:
    """A pidfd of the sandbox's init and its host pid, which bwrap writes to ``--info-fd``;
    Nones if bwrap failed before starting it. A pidfd pins the pid, and the process is checked to be
    bwrap's child or a namespace's init, so a reused pid number is not signalled."""
    try:
        info = await asyncio.wait_for(_read_info(info_fd), timeout_s)
        pid = int(info["child-pid"])
        pidfd = os.pidfd_open(pid)
    except (OSError, ValueError, KeyError, TypeError, TimeoutError):  # bwrap failed, or gone
        return None, None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        status = ""
    # bwrap's child while bwrap lives; after that, still pid 1 of a namespace of its own
    if f"\nPPid:\t{bwrap_pid}\n" not in status and f"\nNSpid:\t{pid}\t1\n" not in status:
        os.close(pidfd)
        return None, None
    return pidfd, pid


async def _read_info(fd: int) -> dict:
    """bwrap's ``--info-fd`` JSON object, read until it parses: bwrap writes it in pieces,
    so one read may end mid-object (a single read would lose the init's pid now and then)."""
    os.set_blocking(fd, False)
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            await _until_readable(fd)
            continue
        data += chunk
        try:
            return json.loads(data)
        except ValueError:
            if not chunk:  # bwrap closed it before the object was whole
                raise


async def _until_readable(fd: int, timeout_s: float | None = None) -> bool:
    """Wait until ``fd`` polls readable (a pidfd: its process has exited; a pipe: data or
    its end), at most ``timeout_s`` (None: no limit); returns whether it did. The start pipe
    is readable once the bootstrap wrote its byte or the sandbox ended before the code (a
    script that does not compile): either way the code's own limit starts then."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def mark_ready() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, mark_ready)
    try:
        await asyncio.wait_for(ready, timeout_s)
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
    return True


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # already gone
        pass


async def _read_capped(fd: int, limit: int) -> str:
    """Read a pipe to its end, keeping the first ``limit`` bytes (draining keeps the child
    from blocking on a full pipe)."""
    os.set_blocking(fd, False)
    kept = bytearray()
    total = 0
    while True:
        try:
            chunk = os.read(fd, 64 * 1024)
        except BlockingIOError:
            await _until_readable(fd)
            continue
        if not chunk:
            break
        total += len(chunk)
        kept += chunk[: max(limit - len(kept), 0)]
    text = kept.decode("utf-8", errors="replace")
    if total > limit:
        text += f"\n[output truncated: {total} bytes, only the first {limit} are shown]"
    return text

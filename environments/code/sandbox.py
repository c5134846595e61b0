"""Run untrusted Python in a fresh, resource-limited subprocess and capture its output.

Each run gets its own interpreter (``python -I``: no user site, no environment variables,
no script directory on ``sys.path``), its own temporary working directory (deleted after),
a wall-clock timeout, limits on memory, CPU time and file size, and capped output.

No network, no writes outside the working directory, no new processes:

* network: the child runs in an empty network namespace (``unshare --net``, as root or
  through a user namespace) where the kernel allows it, so nothing is reachable, not even
  127.0.0.1; and in every case an audit hook refuses to create sockets;
* files: the audit hook refuses opening for writing, creating, renaming, removing or
  changing anything outside the working directory (``/dev/null`` excepted);
* processes: the audit hook refuses ``fork``, ``exec``, ``subprocess``, ``os.system``,
  signals to other processes, and ``ctypes`` (which could call the C library directly).

Audit hooks (PEP 578) cannot be removed from Python code, and they stop the usual ways
out; but they live in the same process as the code they watch. This bounds accidents and
naive escapes (loops, huge allocations, output floods, stray writes, network calls); it is
not a security boundary against code written to break out, which needs a container or a VM.
"""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunResult", "run_sandboxed"]

MiB = 1024 * 1024

# Runs before the user's code (``python -c``): reads main.py, installs the audit hook, then
# runs the script as ``__main__``, printing its traceback as a plain script run would.
_BOOTSTRAP = r"""
import os, sys
import subprocess, _posixsubprocess  # fork_exec is not audited: replace it (below)

def _sandbox_guard():
    workdir = os.path.realpath(os.getcwd())
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    denied = {
        "socket.__new__": "network access", "socket.connect": "network access",
        "socket.bind": "network access", "socket.getaddrinfo": "network access",
        "os.fork": "starting processes", "os.forkpty": "starting processes",
        "os.exec": "starting processes", "os.posix_spawn": "starting processes",
        "os.spawn": "starting processes", "os.system": "starting processes",
        "subprocess.Popen": "starting processes", "os.kill": "signalling processes",
        "os.killpg": "signalling processes", "ctypes.dlopen": "ctypes",
        "ctypes.dlsym": "ctypes", "ctypes.call_function": "ctypes",
    }
    changes = ("os.mkdir", "os.remove", "os.rmdir", "os.chmod", "os.chown", "os.truncate",
               "os.utime", "os.rename", "os.link", "os.symlink", "shutil.rmtree",
               "os.chflags", "os.setxattr", "os.removexattr")

    def inside(path):
        if isinstance(path, int):
            return True  # an open file descriptor: checked when it was opened
        real = os.path.realpath(os.fsdecode(path))
        return real == workdir or real.startswith(workdir + os.sep) or real == os.devnull

    def refuse(what, path=None):
        where = f" ({path!r} is outside the working directory {workdir})" if path else ""
        raise PermissionError(f"sandbox: {what} is not allowed{where}")

    def hook(event, args):
        if event == "open":
            path, _, flags = args
            if path is not None and flags & write_flags and not inside(path):
                refuse("writing outside the working directory", path)
        elif event in changes:  # a symlink may point anywhere: writes through it resolve
            paths = {"os.rename": args[:2], "os.link": args[:2], "os.symlink": args[1:2]}
            for path in paths.get(event, args[:1]):
                if path is not None and not inside(path):
                    refuse(f"{event} outside the working directory", path)
        elif event in denied:
            refuse(f"{denied[event]} ({event})")

    def no_fork_exec(*args, **kwargs):
        refuse("starting processes (_posixsubprocess.fork_exec)")

    _posixsubprocess.fork_exec = no_fork_exec
    sys.addaudithook(hook)

with open("main.py", encoding="utf-8") as _file:
    _code = compile(_file.read(), os.path.abspath("main.py"), "exec")
_sandbox_guard()
del _sandbox_guard, _file
sys.argv = ["main.py"]
try:
    exec(_code, {"__name__": "__main__", "__file__": os.path.abspath("main.py")})
except SystemExit:
    raise
except BaseException as _exc:
    import traceback
    traceback.print_exception(type(_exc), _exc, _exc.__traceback__.tb_next)
    sys.exit(1)
"""


@functools.cache
def network_isolation() -> list[str]:
    """The command prefix that runs the child in an empty network namespace, or ``[]``
    where the kernel refuses (no ``unshare``, no user namespaces): the audit hook remains."""
    for prefix in (["unshare", "--net"], ["unshare", "--user", "--map-root-user", "--net"]):
        try:
            probe = subprocess.run([*prefix, "--", "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return [*prefix, "--"]
    return []


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
) -> RunResult:
    """Run ``code`` as a script in a fresh interpreter under limits.

    Args:
        code: Python source to run as ``main.py``.
        timeout_s: Wall-clock limit; the process group is killed when it passes.
        memory_bytes: Address-space limit (``RLIMIT_AS``); allocations past it fail.
        output_bytes: How much of stdout and of stderr to keep; the rest is dropped, noted.

    Returns:
        The exit code and output; ``timed_out`` is set when the run was killed.
    """
    cpu_s = int(timeout_s) + 1  # CPU time backs up the wall clock if the parent stalls

    def limit_resources() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * MiB, 64 * MiB))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    with tempfile.TemporaryDirectory(prefix="rayrollout-code-") as workdir:
        script = Path(workdir) / "main.py"
        script.write_text(code, encoding="utf-8")
        isolation = await asyncio.to_thread(network_isolation)  # probes once per process
        process = await asyncio.create_subprocess_exec(
            *isolation,
            sys.executable,
            "-I",
            "-B",  # no .pyc writes (they would land outside the working directory)
            "-c",
            _BOOTSTRAP,
            cwd=workdir,
            env={"HOME": workdir, "LANG": "C.UTF-8"},  # nothing of ours leaks in
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=limit_resources,
            start_new_session=True,  # its own process group, so a kill takes its children too
        )
        assert process.stdout is not None and process.stderr is not None  # PIPE was asked for
        reading = asyncio.gather(
            _read_capped(process.stdout, output_bytes), _read_capped(process.stderr, output_bytes)
        )
        try:
            (stdout, stderr), exit_code = await asyncio.wait_for(
                asyncio.gather(reading, process.wait()), timeout_s
            )
        except TimeoutError:
            _kill_group(process.pid)
            await process.wait()
            return RunResult(exit_code=None, stdout="", stderr="", timed_out=True)
        finally:
            _kill_group(process.pid)  # background children it left behind
    return RunResult(exit_code=exit_code, stdout=stdout, stderr=stderr)


async def _read_capped(stream: asyncio.StreamReader, limit: int) -> str:
    """Read a stream to its end, keeping the first ``limit`` bytes (draining keeps the child
    from blocking on a full pipe)."""
    kept = bytearray()
    total = 0
    while chunk := await stream.read(64 * 1024):
        total += len(chunk)
        kept += chunk[: max(limit - len(kept), 0)]
    text = kept.decode("utf-8", errors="replace")
    if total > limit:
        text += f"\n[output truncated: {total} bytes, only the first {limit} are shown]"
    return text


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # already gone, or the pid was reused
        pass

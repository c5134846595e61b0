"""The bubblewrap command line that isolates one sandboxed run, and the check that it works here.

One job: turn "run this interpreter on this script as this uid, within these limits" into
an argv (``prlimit`` then ``bwrap``), and say clearly (``SandboxUnavailableError``) when this
machine cannot run it. ``sandbox.py`` spawns the command and reads the output.

The resource limits are set by ``prlimit`` (util-linux, like ``setpriv``) on itself before it
execs bwrap, not by a ``preexec_fn``: a ``preexec_fn`` makes Python fork the threaded replica,
and gRPC's fork handlers then log a line per run; without one, Python uses vfork and exec.

Layout inside the sandbox (everything read-only except the work dir):

* ``/usr`` (with the ``/bin``, ``/lib``, ``/lib64`` links of a merged-/usr system),
  ``/etc/ld.so.cache``, and the interpreter's own prefix (``sys.base_prefix``, bound at the
  same path so its ``RUNPATH`` and ``sys.prefix`` still resolve). No ``/home``, ``/root``
  (beyond the interpreter's prefix), ``/work``, ``/tmp`` contents, ``/etc`` files,
  ``/sys`` or ``/run``; no virtual environment (the run's own packages and code stay out).
* ``/dev`` with only null, zero, full, random, urandom, tty (read-only mount; the device
  nodes still work) and a ``/proc`` of the sandbox's own pid namespace.
* The work dir ``/tmp/rayrollout-code-<hex>``: a size-limited tmpfs, the only writable place,
  holding ``main.py``; it vanishes with the sandbox's mount namespace.

bwrap starts as root (it must: it binds paths such as ``/root/.pyenv/...`` that no other
uid can reach, and it is the only way to give tool code a uid of its own without a user
namespace that maps back to root). Its namespaces: mount, pid, net, ipc, uts, cgroup. The
only capabilities it keeps for the command are ``CAP_SETUID``/``CAP_SETGID``/``CAP_SETPCAP``,
which ``setpriv`` uses, then drops for good (empty bounding set, ``no_new_privs``), switching
to the per-run uid and gid before exec'ing Python.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = [
    "SandboxUnavailableError",
    "bwrap_command",
    "check_bubblewrap",
    "interpreter",
    "limits_command",
]

ENVIRONMENT = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # plus HOME and TMPDIR: the work dir


class SandboxUnavailableError(RuntimeError):
    """This machine cannot run the code sandbox; the message names the fix."""


def interpreter() -> tuple[Path, Path]:
    """The real interpreter binary and the prefix it lives in (``sys.base_prefix``, not the
    virtual environment: the sandbox gets the standard library only)."""
    prefix = Path(sys.base_prefix).resolve()
    executable = Path(sys.executable).resolve()
    if not executable.is_relative_to(prefix):
        raise SandboxUnavailableError(
            f"the code sandbox runs the interpreter inside sys.base_prefix ({prefix}), but "
            f"{sys.executable} resolves to {executable}, outside it; run rayrollout with a "
            "Python whose binary lives in its prefix (python.org, pyenv, Debian, conda)"
        )
    return executable, prefix


def bwrap_command(
    *,
    workdir: str,
    script_fd: int,
    uid: int,
    workdir_bytes: int,
    argv: list[str],
    info_fd: int | None = None,
) -> list[str]:
    """The ``bwrap`` argv that runs ``argv`` (an interpreter command line) as ``uid``.

    Args:
        workdir: Absolute path of the work dir inside the sandbox (a fresh tmpfs).
        script_fd: A readable file descriptor whose content becomes ``workdir/main.py``;
            it must be passed to the child (``pass_fds``).
        uid: The uid and gid the code runs as: one of its own, unprivileged.
        workdir_bytes: Size of the work dir's tmpfs; writes past it fail with ``ENOSPC``.
        argv: The command to run inside, e.g. ``[python, "-I", "-B", "-c", BOOTSTRAP]``.
        info_fd: Where bwrap writes ``{"child-pid": N}``: the host pid of the sandbox's
            init, whose death ends every process of the run (also passed to the child).
    """
    _, prefix = interpreter()
    command = [
        shutil.which("bwrap") or "bwrap",
        *("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"),
        *("--unshare-cgroup-try", "--hostname", "sandbox"),
        *("--die-with-parent", "--new-session", "--cap-drop", "ALL"),
        *("--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"),
        *("--ro-bind", "/usr", "/usr"),
        *(("--info-fd", str(info_fd)) if info_fd is not None else ()),
    ]
    for name in ("bin", "lib", "lib64", "sbin"):
        if Path(f"/{name}").is_symlink():  # merged /usr: /bin -> usr/bin
            command += ["--symlink", os.readlink(f"/{name}"), f"/{name}"]
        elif Path(f"/{name}").is_dir():
            command += ["--ro-bind", f"/{name}", f"/{name}"]
    command += _directories("/etc", "/tmp")
    if Path("/etc/ld.so.cache").exists():
        command += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    if not prefix.is_relative_to("/usr"):  # pyenv, conda, /opt/...: bind it where it is
        command += _directories(*(str(p) for p in reversed(prefix.parents) if str(p) != "/"))
        command += ["--ro-bind", str(prefix), str(prefix)]
    command += [
        *("--dev", "/dev", "--proc", "/proc"),
        *("--size", str(workdir_bytes), "--perms", "01777", "--tmpfs", workdir),
        *("--perms", "0444", "--file", str(script_fd), f"{workdir}/main.py"),
        *("--remount-ro", "/dev", "--remount-ro", "/", "--chdir", workdir, "--clearenv"),
    ]
    for name, value in {**ENVIRONMENT, "HOME": workdir, "TMPDIR": workdir}.items():
        command += ["--setenv", name, value]
    setpriv = [
        shutil.which("setpriv") or "/usr/bin/setpriv",
        *(f"--reuid={uid}", f"--regid={uid}", "--clear-groups"),
        *("--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"),
    ]
    return [*command, "--", *setpriv, "--", *argv]


def limits_command(*, memory_bytes: int, cpu_s: int, file_bytes: int, max_tasks: int) -> list[str]:
    """The ``prlimit`` argv that sets a run's rlimits, then execs the command after it.

    They are inherited from bwrap (which starts as root, where ``RLIMIT_NPROC`` is not
    enforced) by the sandboxed code, whose uid they then bound.

    Args:
        memory_bytes: ``RLIMIT_AS`` per process.
        cpu_s: ``RLIMIT_CPU`` seconds per process (backs up the wall-clock timeout).
        file_bytes: ``RLIMIT_FSIZE``, the largest file the code may write.
        max_tasks: ``RLIMIT_NPROC``: processes plus threads of the run's uid.
    """
    return [
        shutil.which("prlimit") or "/usr/bin/prlimit",
        *(f"--as={memory_bytes}", f"--cpu={cpu_s}", f"--fsize={file_bytes}"),
        *("--core=0", f"--nproc={max_tasks}", "--"),
    ]


def _directories(*paths: str) -> list[str]:
    """Create ``paths`` traversable by anyone (bwrap copies e.g. ``/root``'s 0700 otherwise)."""
    return [arg for path in paths for arg in ("--perms", "0755", "--dir", path)]


@functools.cache
def check_bubblewrap() -> None:
    """Raise ``SandboxUnavailableError`` naming the fix unless a sandbox starts here.

    Checked once per process (a failure is not cached, so installing bwrap fixes a running
    replica): bwrap and setpriv on PATH, running as root, and a trivial sandboxed run.
    """
    if shutil.which("bwrap") is None:
        raise SandboxUnavailableError(
            "the code sandbox needs bubblewrap, and `bwrap` is not on PATH: install it "
            "(`apt-get install bubblewrap`); tool code is never run unsandboxed"
        )
    for tool, why in (("setpriv", "to drop to an unprivileged uid"), ("prlimit", "to set limits")):
        if shutil.which(tool) is None:
            raise SandboxUnavailableError(
                f"the code sandbox needs `{tool}` {why}, and it is not on PATH: install "
                "util-linux (`apt-get install util-linux`)"
            )
    if os.geteuid() != 0:
        raise SandboxUnavailableError(
            f"the code sandbox must start as root to run tool code under a uid of its own; "
            f"this process runs as uid {os.geteuid()}. Run the environment replicas as root "
            "(e.g. in their container); tool code is never run unsandboxed"
        )
    executable, _ = interpreter()
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"")
    os.close(write_fd)
    try:
        command = bwrap_command(
            workdir="/tmp/rayrollout-code-probe",
            script_fd=read_fd,
            uid=65534,
            workdir_bytes=1024 * 1024,
            argv=[str(executable), "-I", "-S", "-c", "import os; print(os.getuid())"],
        )
        limits = limits_command(
            memory_bytes=1024 * 1024 * 1024, cpu_s=60, file_bytes=1024 * 1024, max_tasks=1024
        )
        probe = subprocess.run(
            [*limits, *command],
            pass_fds=(read_fd,),
            capture_output=True,
            text=True,
            timeout=60,
            env={},
        )
    finally:
        os.close(read_fd)
    if probe.returncode != 0 or probe.stdout.strip() != "65534":
        raise SandboxUnavailableError(
            f"bubblewrap could not start the code sandbox here (exit code {probe.returncode}): "
            f"{probe.stderr.strip()[-500:]!r}. It needs mount, pid and network namespaces "
            "(a container may have to allow them, e.g. docker --privileged or a seccomp/AppArmor "
            "profile permitting unshare and mount); tool code is never run unsandboxed"
        )

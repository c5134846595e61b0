"""The script the sandboxed interpreter runs first: an audit hook, then ``main.py``.

The hook refuses writes outside the working directory, sockets, new processes, signals and
``ctypes``. It lives in the same process as the code it watches, so code written to break
out can switch it off (its closure cells are reachable through ``gc``): it is defence in
depth behind bubblewrap (``_bwrap.py``), which is the boundary. What it still does well is
give honest code a clear ``PermissionError: sandbox: ...`` instead of a bare ``EROFS``.
"""

from __future__ import annotations

__all__ = ["BOOTSTRAP"]

# Runs before the user's code (``python -c``): reads main.py, installs the audit hook, tells
# the host the code starts (one byte on the pipe whose descriptor is its argument, if any),
# then runs the script as ``__main__``, printing its traceback as a plain script run would.
BOOTSTRAP = r"""
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
if len(sys.argv) > 1:  # the host's start pipe: its time limit counts from here
    os.write(int(sys.argv[1]), b"1")
    os.close(int(sys.argv[1]))
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

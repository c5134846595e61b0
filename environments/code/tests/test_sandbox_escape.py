"""Code that tries to escape each limit of the code environment's sandbox, and fails to.

Time (loops, sleeps, processes left behind), memory, network, the file system outside the
run's working directory, and output size. Each attempt runs through ``run_sandboxed`` as a
model's code would; attempts that must fail print what happened so the test can check it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from rayrollout.environments.code.sandbox import network_isolation, run_sandboxed

# The child runs each attempt and reports "blocked: <error>" or "ESCAPED".
ATTEMPTS = """\
import json, os
outcomes = {}
def attempt(name, action):
    try:
        action()
    except BaseException as exc:
        outcomes[name] = f"blocked: {type(exc).__name__}: {exc}"
    else:
        outcomes[name] = "ESCAPED"
"""


def attempts(body: str) -> str:
    return ATTEMPTS + textwrap.dedent(body) + "\nprint(json.dumps(outcomes))\n"


def outcomes_of(stdout: str) -> dict[str, str]:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "code",
    ["while True:\n    pass\n", "import time\ntime.sleep(60)\n"],
    ids=["infinite-loop", "sleep"],
)
async def test_code_running_past_the_time_limit_is_killed(code):
    started = time.monotonic()
    result = await run_sandboxed(code, timeout_s=1.0)
    assert result.timed_out and result.exit_code is None
    assert time.monotonic() - started < 5


async def test_code_cannot_start_processes_that_outlive_it():
    marker = f"sandbox-escape-{uuid.uuid4().hex}"
    code = attempts(
        f"""
        import subprocess, _posixsubprocess
        attempt("fork", lambda: os.fork())
        attempt("popen", lambda: subprocess.Popen(["sleep", "60", "{marker}"]))
        attempt("system", lambda: os.system("sleep 60 {marker} &"))
        attempt("exec", lambda: os.execv("/bin/sleep", ["sleep", "60", "{marker}"]))
        attempt("spawn", lambda: os.posix_spawn("/bin/sleep", ["sleep", "60"], {{}}))
        attempt("fork_exec", lambda: _posixsubprocess.fork_exec(
            [b"/bin/sleep"], [b"/bin/sleep"], True, (), None, None,
            -1, -1, -1, -1, -1, -1, -1, -1, False, False, 0, None, None, None, -1, None, False))
        attempt("kill parent", lambda: os.kill(os.getppid(), 9))
        attempt("ctypes", lambda: __import__("ctypes").CDLL(None).fork())
        """
    )
    result = await run_sandboxed(code, timeout_s=5.0)
    outcomes = outcomes_of(result.stdout)
    assert set(outcomes) == {
        "fork", "popen", "system", "exec", "spawn", "fork_exec", "kill parent", "ctypes",
    }  # fmt: skip
    for name, outcome in outcomes.items():
        assert outcome.startswith("blocked: PermissionError: sandbox:"), (name, outcome)
    leftovers = [
        pid for pid in os.listdir("/proc") if pid.isdigit() and marker.encode() in _cmdline(pid)
    ]
    assert leftovers == []


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def test_allocating_two_gib_fails_inside_the_memory_limit():
    code = "data = bytearray(2 * 1024**3)\nprint('ESCAPED', len(data))\n"
    result = await run_sandboxed(code, timeout_s=5.0, memory_bytes=512 * 1024 * 1024)
    assert result.exit_code == 1 and not result.timed_out
    assert "MemoryError" in result.stderr and "ESCAPED" not in result.stdout


@pytest.fixture
def listening_port():
    """A TCP server on 127.0.0.1 that the sandboxed code must not reach."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        yield server


async def test_code_cannot_open_any_network_connection(listening_port):
    port = listening_port.getsockname()[1]
    code = attempts(
        f"""
        import socket, urllib.request
        attempt("tcp to loopback", lambda: socket.create_connection(("127.0.0.1", {port}), 2))
        attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        attempt("dns", lambda: socket.getaddrinfo("example.com", 80))
        attempt("http", lambda: urllib.request.urlopen("http://127.0.0.1:{port}/", timeout=2))
        """
    )
    result = await run_sandboxed(code, timeout_s=10.0)
    outcomes = outcomes_of(result.stdout)
    assert len(outcomes) == 4
    for name, outcome in outcomes.items():
        assert outcome.startswith("blocked:") and "sandbox: network access" in outcome, (
            name,
            outcome,
        )
    with pytest.raises(BlockingIOError):
        listening_port.accept()  # nobody connected


def test_the_network_namespace_alone_already_cuts_off_loopback(listening_port):
    """The kernel layer, without the audit hook: nothing listens in an empty namespace."""
    prefix = network_isolation()
    if not prefix:
        pytest.skip("this kernel refuses network namespaces here; the audit hook still applies")
    port = listening_port.getsockname()[1]
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), 2)"
    result = subprocess.run(
        [*prefix, sys.executable, "-c", probe], capture_output=True, text=True, timeout=30
    )
    assert result.returncode != 0
    assert "ConnectionRefusedError" in result.stderr or "unreachable" in result.stderr


async def test_code_cannot_write_outside_its_working_directory(tmp_path):
    outside = Path("/tmp") / f"escape-{uuid.uuid4().hex}"
    victim = tmp_path / "keep-me.txt"
    victim.write_text("precious")
    code = attempts(
        f"""
        import pathlib, shutil
        outside = {str(outside)!r}
        attempt("open", lambda: open(outside, "w").write("x"))
        attempt("append", lambda: open({str(victim)!r}, "a").write("x"))
        attempt("os.open", lambda: os.open(outside, os.O_CREAT | os.O_WRONLY))
        attempt("pathlib", lambda: pathlib.Path(outside).write_text("x"))
        attempt("mkdir", lambda: os.mkdir(outside))
        attempt("remove", lambda: os.remove({str(victim)!r}))
        attempt("chmod", lambda: os.chmod({str(victim)!r}, 0o777))
        open("inside.txt", "w").write("fine")
        attempt("rename out", lambda: os.rename("inside.txt", outside))
        attempt("copy out", lambda: shutil.copy("inside.txt", outside))
        os.symlink(outside, "link")
        attempt("write via symlink", lambda: open("link", "w").write("x"))
        print("WORKDIR", os.getcwd())
        """
    )
    result = await run_sandboxed(code, timeout_s=10.0)
    outcomes = outcomes_of(result.stdout)
    assert len(outcomes) == 10
    for name, outcome in outcomes.items():
        assert "sandbox:" in outcome and "outside the working directory" in outcome, (
            name,
            outcome,
        )
    assert not outside.exists()
    assert victim.read_text() == "precious"
    workdir = next(line for line in result.stdout.splitlines() if line.startswith("WORKDIR"))
    assert not Path(workdir.split(" ", 1)[1]).exists()  # the per-run directory is gone


async def test_writing_inside_the_working_directory_still_works():
    code = (
        "import os, pathlib\n"
        "pathlib.Path('data').mkdir()\n"
        "pathlib.Path('data/a.txt').write_text('hello')\n"
        "os.rename('data/a.txt', 'b.txt')\n"
        "print(open('b.txt').read(), open(os.devnull, 'w').write('quiet'))\n"
    )
    result = await run_sandboxed(code)
    assert (result.exit_code, result.stdout.strip()) == (0, "hello 5")


async def test_a_flood_of_output_is_capped():
    code = "import sys\nfor _ in range(50):\n    sys.stdout.write('x' * 1024 * 1024)\n"
    started = time.monotonic()
    result = await run_sandboxed(code, timeout_s=20.0, output_bytes=8 * 1024)
    assert result.exit_code == 0 and time.monotonic() - started < 15
    assert len(result.stdout) < 8 * 1024 + 200
    assert "[output truncated: 52428800 bytes, only the first 8192 are shown]" in result.stdout

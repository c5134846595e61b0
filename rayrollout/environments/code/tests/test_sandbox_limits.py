"""Attacks on the code environment's sandbox limits: disk, processes, network, memory, time, output.

The companion of ``test_sandbox_escape.py`` (files, secrets, identity, signals); the same
harness (``escape_kit``): the audit hook is switched off first, a control shows the attack
works without the sandbox where that is cheap and harmless, and the planted key is in no output.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from escape_kit import attack, control, processes_with, script

from rayrollout.environments.code import sandbox
from rayrollout.environments.code._bootstrap import BOOTSTRAP
from rayrollout.environments.code.sandbox import RunResult, run_sandboxed

pytestmark = pytest.mark.system_package("bubblewrap")  # every attack needs the sandbox


async def test_filling_the_disk_stops_at_the_work_dir_size():
    code = script(
        """
        written, chunk = 0, b"x" * (1024 * 1024)
        def fill():
            global written
            for n in range(1000):  # files of 1 MiB each: the tmpfs size, not RLIMIT_FSIZE, stops it
                with open(f"fill-{n}", "wb") as file:
                    file.write(chunk)
                    written += len(chunk)
        print(attempt(fill))
        print(written // (1024 * 1024))
        print(attempt(lambda: open("/dev/shm/fill", "wb")))
        """
    )
    lines = (await attack(code, workdir_bytes=8 * 1024 * 1024)).stdout.splitlines()
    assert lines[0] == "blocked: OSError: [Errno 28] No space left on device"
    assert int(lines[1]) <= 8
    assert lines[2].startswith("blocked: OSError: [Errno 30] Read-only file system")


async def test_a_fork_bomb_is_bounded_and_the_call_returns():
    code = script(
        """
        import time
        children = 0
        def bomb():
            global children
            while True:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
                children += 1
        print(attempt(bomb))
        print(children)
        """
    )
    started = time.monotonic()
    result = await attack(code, timeout_s=10)
    lines = result.stdout.splitlines()
    assert lines[0] == "blocked: BlockingIOError: [Errno 11] Resource temporarily unavailable"
    assert int(lines[1]) < 16  # RLIMIT_NPROC: max_tasks for the run's uid
    # The sleepers died with the sandbox: the call did not wait out their 60 s (a bound far
    # from either side, so a busy machine's slow start does not decide it).
    assert time.monotonic() - started < 30


async def test_an_exponential_fork_bomb_is_killed_at_the_timeout():
    code = script("while True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    timeout_s = 2
    started = time.monotonic()
    result = await attack(code, timeout_s=timeout_s)
    # The children never end on their own, so the call returns only because the sandbox was
    # killed. On a busy machine that is later than timeout_s by design: the code's clock
    # leaves out the time it waited for a CPU (which its own forks hold), up to
    # CPU_WAIT_LIMIT_S, after a start of up to START_LIMIT_S; the teardown waits at most
    # timeout_s + 10 for the namespace to empty, then 30 s for bwrap.
    start_and_run = sandbox.START_LIMIT_S + timeout_s + sandbox.CPU_WAIT_LIMIT_S
    bound = start_and_run + (timeout_s + 10) + 30
    assert result.timed_out and time.monotonic() - started < bound


@pytest.mark.parametrize("ends", ["exits", "times-out"])
async def test_no_process_outlives_the_call(ends, tmp_path):
    marker = f"sandbox-daemon-{uuid.uuid4().hex}"
    daemons = """
        quiet = os.open(os.devnull, os.O_RDWR)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:  # a daemon: double fork, new session, argv[0] as a marker
                for fd in (0, 1, 2):
                    os.dup2(quiet, fd)
                os.execv("/bin/sleep", ["$marker", "60"])
            os._exit(0)
        os.wait()
        subprocess.Popen(["$marker", "60"], executable="/bin/sleep", start_new_session=True,
                         stdin=quiet, stdout=quiet, stderr=quiet)
        print("started")
        if $wait:
            __import__("time").sleep(60)
        """
    # Exiting, the script has 30 s for its forks on a busy machine; waiting, 2 s before it is
    # killed (its sleep is 60 s).
    timeout_s = 2 if ends == "times-out" else 30
    result = await attack(
        script(daemons, marker=marker, wait=ends == "times-out"), timeout_s=timeout_s
    )
    assert result.timed_out == (ends == "times-out")
    assert [Path(f"/proc/{p}/cmdline").read_bytes() for p in processes_with(marker)] == []
    control(script(daemons, marker=marker, wait=False), tmp_path)
    survivors = processes_with(marker)  # the control's daemons do outlive their parent
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert survivors


async def test_code_cannot_reach_the_network(listening_port, tmp_path):
    code = script(
        """
        import socket
        print(attempt(lambda: socket.create_connection(("127.0.0.1", $port), 2)))
        print(attempt(lambda: socket.getaddrinfo("example.com", 80)))
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        print(attempt(lambda: udp.sendto(b"x", ("8.8.8.8", 53))))
        """,
        port=listening_port.getsockname()[1],
    )
    lines = (await attack(code, timeout_s=10)).stdout.splitlines()
    assert lines[0].startswith(("blocked: ConnectionRefusedError", "blocked: OSError: [Errno 101]"))
    assert lines[1].startswith("blocked: gaierror")
    assert lines[2] == "blocked: OSError: [Errno 101] Network is unreachable"
    with pytest.raises(BlockingIOError):
        listening_port.accept()  # nobody connected
    assert control(code, tmp_path).startswith("ESCAPED")
    listening_port.accept()[0].close()  # the control did


async def test_a_memory_bomb_fails_inside_the_limit():
    code = script("data = bytearray(2 * 1024**3)\nprint('ESCAPED', len(data))\n")
    result = await attack(code, memory_bytes=512 * 1024 * 1024)
    assert result.exit_code == 1 and "MemoryError" in result.stderr
    assert "ESCAPED" not in result.stdout


@pytest.mark.parametrize(
    "code", ["while True:\n    pass\n", "import time\ntime.sleep(60)\n"], ids=["loop", "sleep"]
)
async def test_code_running_past_the_time_limit_is_killed(code):
    started = time.monotonic()
    result = await attack(script(code), timeout_s=1.0)
    assert result.timed_out and result.exit_code is None
    assert time.monotonic() - started < 30  # killed at its limit, not left to its 60 s sleep


async def test_a_flood_of_output_is_capped():
    code = script("import sys\nfor _ in range(50):\n    sys.stdout.write('x' * 1024 * 1024)\n")
    result = await attack(code, timeout_s=20.0, output_bytes=8 * 1024)
    assert result.exit_code == 0  # drained to its end: a writer blocked on a full pipe times out
    assert "[output truncated: 52428800 bytes, only the first 8192 are shown]" in result.stdout


async def test_kernel_settings_cannot_be_written():
    code = script('print(attempt(lambda: open("/proc/sys/vm/drop_caches", "w").write("3")))')
    assert (await attack(code)).stdout.startswith("blocked: PermissionError")


async def test_the_audit_hook_still_refuses_honest_code_with_a_clear_message():
    code = script("print(attempt(lambda: open('/tmp/x', 'w')))", unhook=False)
    assert "sandbox: writing outside the working directory" in (await attack(code)).stdout


async def test_writing_inside_the_work_dir_still_works():
    code = (
        "import os, pathlib, tempfile\n"
        "pathlib.Path('data').mkdir()\n"
        "pathlib.Path('data/a.txt').write_text('hello')\n"
        "os.rename('data/a.txt', 'b.txt')\n"
        "tempfile.NamedTemporaryFile().write(b'x')\n"
        "print(open('b.txt').read(), open(os.devnull, 'w').write('quiet'))\n"
    )
    result = await run_sandboxed(code)
    assert (result.exit_code, result.stdout.strip()) == (0, "hello 5")


def test_the_code_starts_after_the_start_byte_with_the_start_pipe_closed(tmp_path):
    """The host's time limit starts on the bootstrap's byte, written before the code runs;
    the pipe is closed by then, so the code cannot send it itself."""
    read, write = os.pipe()
    (tmp_path / "main.py").write_text(
        f"import os\ntry:\n    os.fstat({write})\nexcept OSError:\n    print('closed')\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-B", "-c", BOOTSTRAP, str(write)],
        cwd=tmp_path,
        pass_fds=(write,),
        capture_output=True,
        text=True,
        timeout=60,
    )
    os.close(write)
    assert os.read(read, 16) == b"1"
    os.close(read)
    assert (done.returncode, done.stdout) == (0, "closed\n"), done.stderr


async def test_a_sandbox_that_does_not_start_in_time_is_killed_as_timed_out(monkeypatch):
    monkeypatch.setattr(sandbox, "START_LIMIT_S", 0.0)
    marker = f"sandbox-late-{uuid.uuid4().hex}"
    result = await run_sandboxed(f"# {marker}\nprint('ran')\n", timeout_s=30)
    assert result == RunResult(exit_code=None, stdout="", stderr="", timed_out=True)
    assert processes_with(marker) == []


SPIN_CPU_S = 1.0
SPINNER = f"import time\nwhile time.process_time() < {SPIN_CPU_S}:\n    pass\nprint('done')\n"


@pytest.fixture
def one_crowded_cpu():
    """This thread (and so every process it starts, the sandbox included) on one CPU, with
    three busy loops beside it there: a program gets at most a quarter of it. Each loop has a
    session of its own, as the sandbox does: the kernel's autogroups share a CPU between
    sessions first."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(3)
    ]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
        os.sched_setaffinity(0, before)


@pytest.mark.usefixtures("one_crowded_cpu")
async def test_time_spent_waiting_for_a_cpu_is_not_the_codes_own_time():
    timeout_s = 2.5
    started = time.monotonic()
    result = await run_sandboxed(SPINNER, timeout_s=timeout_s)
    assert (result.exit_code, result.stdout, result.timed_out) == (0, "done\n", False)
    # A quarter of a CPU at most: a second of CPU took more wall time than the limit.
    assert time.monotonic() - started > timeout_s


@pytest.mark.usefixtures("one_crowded_cpu")
async def test_waiting_for_a_cpu_has_a_bound_of_its_own(monkeypatch):
    monkeypatch.setattr(sandbox, "CPU_WAIT_LIMIT_S", 0.0)
    result = await run_sandboxed(SPINNER, timeout_s=2.5)
    assert result.timed_out and result.exit_code is None

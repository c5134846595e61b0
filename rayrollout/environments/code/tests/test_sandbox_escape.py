"""Attacks on the code environment's sandbox by code that knows it is sandboxed; each fails.

Most attacks first switch the in-process audit hook off (``UNHOOK`` rewrites its closure
cells through ``gc``), so what they test is bubblewrap, the boundary. Where it is cheap and
harmless, the same code also runs as a control in a plain child of this process with the
audit hook alone (the sandbox this one replaced), and succeeds there: each assertion on the
sandbox is one a weaker sandbox would fail. A key planted as ``OPENAI_API_KEY`` must be in
no output of any attack (``attack`` checks every one).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

import pytest
from escape_kit import REPO, attack, control, script

from rayrollout.environments.code.sandbox import UID_RANGE, RunResult

pytestmark = pytest.mark.system_package("bubblewrap")  # every attack needs the sandbox

READ_ONLY = "OSError: [Errno 30] Read-only file system"
ABSENT = "FileNotFoundError: [Errno 2]"
WRITE_TARGETS = {  # where: (folder, how the sandbox refuses it)
    "tmp": (Path("/tmp"), READ_ONLY),
    "repo": (REPO / "rayrollout" / "environments" / "code", ABSENT),
    "interpreter-site-packages": (
        Path(sysconfig.get_paths(vars={"base": sys.base_prefix})["purelib"]),
        READ_ONLY,
    ),
    "venv-site-packages": (Path(sysconfig.get_paths()["purelib"]), ABSENT),
}


@pytest.mark.parametrize("where", WRITE_TARGETS)
async def test_switching_the_audit_hook_off_does_not_allow_writes_outside(where, tmp_path):
    folder, refusal = WRITE_TARGETS[where]
    target = folder / f"escape-{uuid.uuid4().hex}"
    code = script("print(attempt(lambda: open('$target', 'w').write('x')))", target=target)
    assert (await attack(code)).stdout.startswith(f"blocked: {refusal}")
    assert not target.exists()
    assert control(code, tmp_path).startswith("ESCAPED")  # the hook alone: it gets out
    target.unlink()


async def test_an_os_open_with_dir_fd_cannot_create_files_outside(tmp_path):
    target = Path("/tmp") / f"escape-{uuid.uuid4().hex}"
    code = script(
        """
        tmp = os.open("/tmp", os.O_RDONLY)
        print(attempt(lambda: os.open("$name", os.O_CREAT | os.O_WRONLY, dir_fd=tmp)))
        """,
        unhook=False,  # the hook judges "escape-..." relative to the work dir: it lets it pass
        name=target.name,
    )
    assert "blocked: OSError: [Errno 30] Read-only" in (await attack(code)).stdout
    assert not target.exists()
    assert control(code, tmp_path).startswith("ESCAPED")
    target.unlink()


# Each hunt prints what it finds that looks like a planted key, and only that (the controls
# read real processes of this machine, whose other variables are none of this test's business).
SECRET_HUNTS = {
    "parent environ": "print(attempt(lambda: keys(read(f'/proc/{os.getppid()}/environ')), True))",
    "replica environ by pid": "print(attempt(lambda: keys(read('/proc/$replica/environ')), True))",
    "every environ": """
        for pid in filter(str.isdigit, os.listdir("/proc")):
            print(pid, attempt(lambda: keys(read(f"/proc/{pid}/environ")), True))
        """,
    "own environment": "print(keys(str(os.environ)))",
    "parent memory": """
        def read_stack():
            maps = open(f"/proc/{os.getppid()}/maps").read().splitlines()
            stack = next(line for line in maps if "[stack]" in line).split()[0]
            start, end = (int(x, 16) for x in stack.split("-"))
            with open(f"/proc/{os.getppid()}/mem", "rb") as mem:
                mem.seek(start)
                return keys(mem.read(end - start).decode("latin-1"))
        print(attempt(read_stack, True))
        """,
}
KEYS = """\
import re
def keys(text):
    return re.findall(r"sk-planted-[0-9a-f]+", text)
def read(path):
    return open(path).read()
"""
# A stand-in for an environment replica that got the run's key from its parent: it runs each
# hunt through the sandbox and, as the control, as a plain child of itself.
REPLICA = """\
import asyncio, json, os, pathlib, sys, tempfile
sys.path.insert(0, sys.argv[1])
from rayrollout.environments.code.sandbox import run_sandboxed
from escape_kit import control, script
from test_sandbox_escape import KEYS, SECRET_HUNTS
async def main():
    out = {}
    for name, hunt in SECRET_HUNTS.items():
        code = script(KEYS + textwrap_dedent(hunt), replica=os.getpid())
        result = await run_sandboxed(code)
        plain = control(code, pathlib.Path(tempfile.mkdtemp()))
        out[name] = [result.stdout + result.stderr, plain]
    print(json.dumps(out))
from textwrap import dedent as textwrap_dedent
asyncio.run(main())
"""


async def test_no_secret_hunt_finds_the_key_planted_in_its_replica():
    key = f"sk-planted-{uuid.uuid4().hex}"
    command = [sys.executable, "-c", REPLICA, str(Path(__file__).parent)]
    env = {**os.environ, "OPENAI_API_KEY": key}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    outputs = json.loads(done.stdout.splitlines()[-1])
    assert set(outputs) == set(SECRET_HUNTS)
    assert [name for name, (sandboxed, _) in outputs.items() if key in sandboxed] == []
    leaked = {name for name, (_, plain) in outputs.items() if key in plain}
    assert {"parent environ", "replica environ by pid", "every environ"} <= leaked


async def test_an_episode_cannot_read_or_write_a_concurrent_episodes_files(tmp_path):
    victim_code = script(
        """
        import time
        open("secret.txt", "w").write("episode-A-secret")
        time.sleep(2)
        print(open("secret.txt").read(), sorted(os.listdir(".")))
        """
    )
    thief_code = script(
        """
        import glob
        found = {}
        places = ["/tmp/rayrollout-code-*", "/proc/*/cwd", "/proc/*/root/tmp/rayrollout-code-*"]
        for where in places:
            for path in glob.glob(f"{where}/secret.txt"):
                found[path] = attempt(lambda: open(path).read(40), True)
                attempt(lambda: open(path, "a").write("pwned"))
        print(json.dumps(found))
        """
    )

    async def thief() -> RunResult:
        await asyncio.sleep(0.5)
        return await attack(thief_code)

    episode, stolen = await asyncio.gather(attack(victim_code), thief())
    assert episode.stdout == "episode-A-secret ['main.py', 'secret.txt']\n"
    assert "episode-A-secret" not in stolen.stdout
    assert json.loads(stolen.stdout) == {}  # it sees no other episode's folder at all
    other = Path("/tmp") / f"rayrollout-code-control-{uuid.uuid4().hex}"  # the control
    other.mkdir()
    try:
        (other / "secret.txt").write_text("episode-A-secret")
        assert "episode-A-secret" in control(thief_code, tmp_path / "thief")
    finally:
        (other / "secret.txt").unlink()
        other.rmdir()


@pytest.mark.parametrize(
    "path",
    ["/root/.bashrc", "/etc/shadow", str(REPO / "pyproject.toml")],
    ids=["root", "shadow", "repo"],
)
async def test_files_of_the_host_cannot_be_read(path, tmp_path):
    code = script("print(attempt(lambda: len(open('$path').read())))", path=path)
    assert (await attack(code)).stdout.startswith("blocked: FileNotFoundError")
    assert control(code, tmp_path).startswith("ESCAPED")


async def test_links_to_files_outside_do_not_reach_them(outside, tmp_path):
    code = script(
        """
        print(attempt(lambda: os.link("$outside", "hard")))
        print(attempt(lambda: os.link("/usr/bin/env", "hard-usr")))
        os.symlink("$outside", "soft")
        print(attempt(lambda: open("soft").read(), True))
        print(attempt(lambda: open("soft", "a").write("x")))
        """,
        outside=outside,
    )
    assert (await attack(code)).stdout.splitlines() == [
        f"blocked: FileNotFoundError: [Errno 2] No such file or directory: '{outside}' -> 'hard'",
        "blocked: OSError: [Errno 18] Invalid cross-device link: '/usr/bin/env' -> 'hard-usr'",
        "blocked: FileNotFoundError: [Errno 2] No such file or directory: 'soft'",
        "blocked: FileNotFoundError: [Errno 2] No such file or directory: 'soft'",
    ]
    plain = control(code, tmp_path / "ctl").splitlines()
    assert (plain[0], plain[2]) == ("ESCAPED", "ESCAPED: 'outside-secret'")
    assert outside.read_text() == "outside-secretx"  # the control wrote through the symlink


SYMLINK_RACE = """
import threading, time
# two directories swap names under "cur": in one "link" points inside, in the other outside
os.makedirs("good"); os.makedirs("evil"); open("inside.txt", "w").close()
os.symlink(os.path.abspath("inside.txt"), "good/link"); os.symlink("$target", "evil/link")
os.rename("good", "cur")
def flip():
    while True:
        os.rename("cur", "good"); os.rename("evil", "cur")
        os.rename("cur", "evil"); os.rename("good", "cur")
threading.Thread(target=flip, daemon=True).start()
deadline = time.monotonic() + 1.5
while time.monotonic() < deadline:
    try:
        with open("cur/link", "a") as file:
            file.write("raced")
    except OSError:
        pass
print("done")
"""


async def test_a_symlink_race_against_the_audit_hook_writes_nothing_outside(tmp_path):
    target = tmp_path / "raced.txt"
    code = script(SYMLINK_RACE, unhook=False, target=target)  # the hook on: the race beats it
    result = await attack(code, timeout_s=10)
    assert result.stdout == "done\n" and not target.exists()
    control(code, tmp_path / "ctl")
    assert target.exists()  # with the hook alone, the race wrote outside


async def test_ptrace_and_proc_mem_cannot_reach_other_processes(victim, tmp_path):
    trace = """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        def seize(pid):  # PTRACE_SEIZE: traces without stopping; the tracer's exit detaches
            if libc.ptrace(0x4206, pid, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        print(attempt(lambda: seize($victim)))
        print(attempt(lambda: open("/proc/$victim/mem", "rb")))
        """
    code = script(trace + "print(attempt(lambda: seize(os.getppid())))\n", victim=victim.pid)
    result = await attack(code)
    lines = result.stdout.splitlines()
    assert len(lines) == 3, result
    assert lines[0] == "blocked: ProcessLookupError: [Errno 3] No such process"  # not in its ns
    assert lines[1].startswith("blocked: FileNotFoundError")
    assert lines[2] == "blocked: PermissionError: [Errno 1] Operation not permitted"  # its init
    plain = control(script(trace, victim=victim.pid), tmp_path).splitlines()
    assert plain == ["ESCAPED", "ESCAPED"]
    assert victim.poll() is None


async def test_signals_cannot_reach_other_processes(victim, tmp_path):
    code = script(
        """
        import signal
        print(attempt(lambda: os.kill($victim, 0)))
        print(attempt(lambda: os.kill($victim, signal.SIGKILL)))
        print(attempt(lambda: os.kill($host_pid, signal.SIGKILL)))
        print(attempt(lambda: os.kill(os.getppid(), signal.SIGKILL)))
        print(attempt(lambda: os.kill(1, signal.SIGKILL)))  # its init, not the host's
        print(attempt(lambda: os.kill(-1, signal.SIGKILL)))  # all it may signal: none but itself
        """,
        victim=victim.pid,
        host_pid=os.getpid(),
    )
    lines = (await attack(code)).stdout.splitlines()
    assert lines[:3] == ["blocked: ProcessLookupError: [Errno 3] No such process"] * 3
    assert lines[3:5] == ["blocked: PermissionError: [Errno 1] Operation not permitted"] * 2
    assert lines[5] == "blocked: ProcessLookupError: [Errno 3] No such process"
    assert victim.poll() is None
    probe = script("print(attempt(lambda: os.kill($victim, 0)))", victim=victim.pid)
    assert control(probe, tmp_path) == "ESCAPED\n"


async def test_code_runs_as_an_unprivileged_uid_and_cannot_become_root(tmp_path):
    code = script(
        """
        print(os.getuid(), os.getgid(), os.getgroups())
        print(attempt(lambda: os.setuid(0)))
        caps = [l for l in open("/proc/self/status") if l.startswith(("CapEff", "CapBnd", "NoNew"))]
        print(json.dumps(caps))
        """
    )
    lines = (await attack(code)).stdout.splitlines()
    uid, gid, groups = lines[0].split(" ", 2)
    assert int(uid) in UID_RANGE and gid == uid and groups == "[]"
    assert lines[1] == "blocked: PermissionError: [Errno 1] Operation not permitted"
    assert json.loads(lines[2]) == [
        "CapEff:\t0000000000000000\n",
        "CapBnd:\t0000000000000000\n",
        "NoNewPrivs:\t1\n",
    ]
    assert control(code, tmp_path).startswith("0 0 ")  # as root without the sandbox


async def test_a_user_namespace_of_its_own_cannot_remount_the_root_writable():
    code = script(
        """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        def check(result):
            if result != 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        print(attempt(lambda: check(libc.unshare(0x10000000 | 0x00020000))))  # user + mount
        MS_REMOUNT, MS_BIND = 32, 4096
        print(attempt(lambda: check(libc.mount(None, b"/usr", None, MS_REMOUNT | MS_BIND, None))))
        print(attempt(lambda: open("/usr/escape", "w")))
        """
    )
    result = await attack(code)
    lines = result.stdout.splitlines()
    assert len(lines) == 3, result  # a failure shows the run: timed out, or what it printed
    assert lines[1] == "blocked: PermissionError: [Errno 1] Operation not permitted"  # locked
    assert lines[2].startswith("blocked: OSError: [Errno 30] Read-only file system")
    assert not Path("/usr/escape").exists()


async def test_environment_injection_does_not_reach_the_code(monkeypatch, tmp_path):
    injected = {
        "LD_PRELOAD": "/nonexistent/evil.so",
        "PYTHONSTARTUP": "/nonexistent/startup.py",
        "BASH_ENV": "/nonexistent/bashrc",
    }
    for name, value in injected.items():
        monkeypatch.setenv(name, value)
    code = script("print(json.dumps(sorted(os.environ)))")
    result = await attack(code)
    assert json.loads(result.stdout) == ["HOME", "LANG", "PATH", "PWD", "TMPDIR"]
    assert "ld.so" not in result.stderr
    assert "cannot be preloaded" in control(code, tmp_path, env=dict(os.environ))

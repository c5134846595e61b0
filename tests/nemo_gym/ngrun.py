"""NeMo Gym 0.7.0 as the ``nemo_gym`` tier uses it: its venv, its unpacked wheel, ``ng_run``.

NeMo Gym pins its own openai/fastapi/ray versions, so it lives in its own venv
(``.venv-nemo-gym``, or ``$NEMO_GYM_VENV``; ``.ci/nemo_gym`` builds it), with the unpacked
wheel (its servers, agents, configs and example datasets) in ``<venv>/src``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from rayrollout.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
NG_VENV = Path(os.environ.get("NEMO_GYM_VENV", ROOT / ".venv-nemo-gym"))
NG_SRC = NG_VENV / "src"
READY = re.compile(r"All \d+ / \d+ servers ready")
FINISHED = "NeMo Gym finished!"  # ng_run's line once every server it started has ended
LEFTOVER_GRACE_S = 15.0
READY_TIMEOUT_S = 300.0  # measured 10-12 s for three servers on an idle machine; loads of 20+ here
# Ray's own start-up limit (30 s for its raylet, fixed in Ray) is what ng_run's Ray misses on an
# overloaded machine; ng_run then exits before starting any server, so it is started again.
RAY_START_FAILED = "The current node timed out during startup"
START_ATTEMPTS = 3


def server_config(kind: str, name: str) -> dict[str, Any]:
    """The ``kind`` blocks (e.g. ``resources_servers``) of a NeMo Gym server's own config."""
    path = NG_SRC / kind / name / "configs" / f"{name}.yaml"
    config = yaml.safe_load(path.read_text())
    return {
        top: block
        for top, block in config.items()
        if isinstance(block, dict) and kind in block and name in block[kind]
    }


def resources_server_block(name: str, port: int) -> dict[str, Any]:
    """NeMo Gym's own config of resources server ``name`` alone, pinned to 127.0.0.1:port."""
    blocks = server_config("resources_servers", name)
    if not blocks:
        raise LookupError(f"resources server {name!r} has no config block in {NG_SRC}")
    top, block = next(iter(blocks.items()))
    block["resources_servers"][name].update({"host": "127.0.0.1", "port": port})
    return {top: block}


def front_model_block(front_port: int) -> dict[str, Any]:
    """A ``policy_model`` block: NeMo Gym's ``openai_model`` model server pointed at
    rayrollout's gateway front on 127.0.0.1:``front_port`` (which reads each episode's key
    from the metadata, so the block's key is unused)."""
    return policy_model_block(f"http://127.0.0.1:{front_port}/v1", "unused")


def policy_model_block(base_url: str, api_key: str = "not-needed") -> dict[str, Any]:
    """A ``policy_model`` block: NeMo Gym's ``openai_model`` model server pointed at the
    OpenAI-compatible ``base_url`` (the scripted policy's), sending ``api_key``."""
    model = {
        "entrypoint": "app.py",
        "openai_base_url": base_url,
        "openai_api_key": api_key,
        "openai_model": "scripted",
        "openai_default_headers": {},
    }
    return {"policy_model": {"responses_api_models": {"openai_model": model}}}


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # the session id; zombies are gone
            pids.append(int(entry.name))
    return pids


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return f"pid {pid} (gone)"


def _default_sigint() -> None:
    """In ng_run's process before it starts: SIGINT back to its default. A shell ignores
    SIGINT in the commands it starts in the background (``pytest ... &``), the ignoring is
    inherited through exec, and a Python started with SIGINT ignored never raises
    KeyboardInterrupt: ng_run then slept through ``stop``'s SIGINT, was killed a minute later
    without shutting its servers down, and the Ray of ``rayrollout env serve`` outlived it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class NemoGymRun:
    """NeMo Gym's ``ng_run`` serving the given config blocks, in a session of its own.

    uv is not on this machine, so every server's per-server venv is a symlink to the one
    venv NeMo Gym is installed in (``+skip_venv_if_present``). ``RAY_ADDRESS=local`` keeps
    ng_run off any Ray the test session started. Stopping sends SIGINT (ng_run's graceful
    shutdown), then ends whatever is left in the session by PID (``stop``).
    """

    def __init__(
        self,
        blocks: dict[str, Any],
        workdir: Path,
        extra_env: dict[str, str] | None = None,
        access_log: bool = True,
    ) -> None:
        self.blocks = blocks
        self.access_log = access_log
        self.extra_env = extra_env or {}
        self.workdir = workdir
        self.head_port = free_port()
        self.log_path = workdir / "ng_run.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.leftovers: dict[int, str] = {}
        self.watched: set[int] = set()

    def _venv_links(self) -> Path:
        venvs = self.workdir / "venvs"
        for block in self.blocks.values():
            for kind, servers in block.items():
                for name in servers:
                    link = venvs / kind / name / ".venv"
                    link.parent.mkdir(parents=True, exist_ok=True)
                    if not link.exists():
                        link.symlink_to(NG_VENV)
        return venvs

    def environment(self) -> dict[str, str]:
        """The environment NeMo Gym's commands run in: its venv first, its own Ray."""
        env = {**os.environ, "RAY_ADDRESS": "local", "RAY_USAGE_STATS_ENABLED": "0"}
        env["PATH"] = f"{NG_VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(NG_VENV)
        env.pop("PYTHONPATH", None)
        return {**env, **self.extra_env}

    def start(self) -> NemoGymRun:
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return self._start_once()
            except RuntimeError as exc:
                if RAY_START_FAILED not in str(exc) or attempt == START_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _start_once(self) -> NemoGymRun:
        config = self.workdir / "ng_config.yaml"
        config.write_text(yaml.safe_dump(self.blocks))
        env = self.environment()
        command = [
            str(NG_VENV / "bin" / "ng_run"),
            f"+config_paths=[{config}]",
            "+skip_venv_if_present=true",
            f"+uv_venv_dir={self._venv_links()}",
            f"+head_server={{host: 127.0.0.1, port: {self.head_port}}}",
        ]
        if self.access_log:  # lines for 200s too: tests count the requests each server answered
            command.append("+uvicorn_logging_show_200_ok=true")
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            command,
            cwd=NG_SRC,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_default_sigint,
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if READY.search(self.log_path.read_text(errors="replace")):
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.5)
        tail = self.log_path.read_text(errors="replace")[-4000:]
        self.stop()
        raise RuntimeError(f"ng_run did not get its servers ready:\n{tail}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def collect_rollouts(
        self, agent: str, tasks: Path, output: Path
    ) -> subprocess.CompletedProcess[str]:
        """NeMo Gym's own ``ng_collect_rollouts`` of ``tasks`` through ``agent``, into ``output``;
        past 10 minutes it fails the test with ng_run's log."""
        try:
            return self._collect_rollouts(agent, tasks, output)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"ng_collect_rollouts hung; ng_run's log:\n{self.log()[-5000:]}"
            ) from exc

    def _collect_rollouts(
        self, agent: str, tasks: Path, output: Path
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                str(NG_VENV / "bin" / "ng_collect_rollouts"),
                f"+agent_name={agent}",
                f"+input_jsonl_fpath={tasks}",
                f"+output_jsonl_fpath={output}",
                f"+head_server={{host: 127.0.0.1, port: {self.head_port}}}",
            ],
            cwd=self.workdir,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=600,
        )

    def server_pid(self, process_name: str) -> int:
        """The PID ng_run printed for the server under top-level key ``process_name``."""
        pattern = rf"'pid': (\d+),\s*'port': \d+,\s*'process_name': '{process_name}'"
        deadline = time.monotonic() + 30  # the table is printed just after "servers ready"
        while (found := re.search(pattern, self.log())) is None:
            if time.monotonic() > deadline:
                raise LookupError(f"ng_run printed no pid for {process_name!r}")
            time.sleep(0.2)
        return int(found.group(1))

    def watch(self, pids: set[int]) -> set[int]:
        """Have ``stop`` give these processes (a test's own servers and their children)
        ``LEFTOVER_GRACE_S`` to end after ng_run's shutdown; returns them."""
        self.watched |= pids
        return pids

    def stop(self) -> None:
        """SIGINT (ng_run's graceful shutdown), then what is left of the session recorded in
        ``leftovers`` and killed.

        ng_run prints ``NeMo Gym finished!`` once every server it started has ended, then
        shuts down its own Ray, which can take a minute: the wait ends at that line. Only the
        processes a test ``watch``es get the grace to end on their own; the rest of the
        session is killed at once (a minute or more per ng_run otherwise, in every test).
        """
        if self.process is None:
            return
        sid = self.process.pid
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            deadline = time.monotonic() + 60
            while self.process.poll() is None and time.monotonic() < deadline:
                if FINISHED in self.log():
                    break
                time.sleep(0.2)
        # Daemons that watch their parent (Ray's) take a few seconds to notice it is gone.
        deadline = time.monotonic() + LEFTOVER_GRACE_S
        while self.watched & set(_session_pids(sid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        self.leftovers = {pid: _command(pid) for pid in _session_pids(sid)}
        for pid in _session_pids(sid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=10)
        self.process = None

    def __enter__(self) -> NemoGymRun:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

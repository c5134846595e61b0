"""NeMo Gym's own ``simple_agent`` as the agent of a ``rayrollout collect``: the ``nemo_gym``
agent (rayrollout/agents/nemo_gym.py) and the gateway front (rayrollout/agentkit/gateway_front.py).

``ng_run`` starts NeMo Gym 0.7.0's ``simple_agent``, its ``openai_model`` model server
(``openai_base_url``: the front's port) and a rayrollout environment as resources server;
``rayrollout collect`` with ``agent: nemo_gym`` then has simple_agent play every row, each
model call recorded by the episode's gateway. The parts without NeMo Gym are tested in the
default tier (tests/test_gateway_front.py).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import yaml
from aiohttp import web
from ngrun import NemoGymRun, free_port, front_model_block
from typer.testing import CliRunner

from rayrollout import read_trajectories
from rayrollout.agentkit.gateway_front import (
    GATEWAY_FIELD,
    KEY_FIELD,
)
from rayrollout.cli.commands import app as cli_app
from rayrollout.cli.env_commands import descendants
from rayrollout.envkit.nemo_gym.ng_run_config import nemo_gym_root

ROOT = Path(__file__).resolve().parents[2]
WEATHER_ROWS = ROOT / "rayrollout" / "environments" / "weather" / "tasks_nemo_gym.jsonl"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _ng_config(environment: str, env_port: int, agent_port: int, front_port: int) -> dict:
    """What a NeMo Gym user runs: ``rayrollout env nemo-gym-config`` (the environment as
    resources server, its simple_agent) plus NeMo Gym's openai_model pointed at the front."""
    printed = CliRunner().invoke(
        cli_app, ["env", "nemo-gym-config", environment, "--port", str(env_port)]
    )
    assert printed.exit_code == 0, printed.output
    blocks = yaml.safe_load(printed.output)
    agent = blocks[f"{environment}_simple_agent"]["responses_api_agents"]["simple_agent"]
    agent.update({"host": "127.0.0.1", "port": agent_port})
    return {**front_model_block(front_port), **blocks}


def _port_is_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port``. SO_REUSEADDR, so that the front's
    closed connections (TIME_WAIT, a minute on Linux) do not count as the front."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _listener(port: int) -> str:
    """The command line of the process listening on 127.0.0.1:``port`` (for a failure)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # LISTEN
            inodes.add(fields[9])
    for entry in Path("/proc").iterdir():
        try:
            for fd in (entry / "fd").iterdir():
                target = fd.readlink().name
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    return (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return "none found"


def _wait_port_free(port: int, timeout_s: float = 60.0) -> bool:
    """Whether ``port`` is free within ``timeout_s``: ray.kill ends an actor asynchronously."""
    deadline = time.monotonic() + timeout_s
    while not _port_is_free(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def test_collect_plays_every_row_with_nemo_gyms_simple_agent(serve_session, ng_src, tmp_path):
    rows = [json.loads(line) for line in WEATHER_ROWS.read_text().splitlines() if line.strip()]
    env_port, agent_port, front_port = free_port(), free_port(), free_port()
    roots = {"NEMO_GYM_EXTRA_ROOTS": str(nemo_gym_root())}
    run = NemoGymRun(_ng_config("weather", env_port, agent_port, front_port), tmp_path, roots)
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "namespace": "ng-agent-by-url",
                "ray": {"serve_port": serve_session},
                "agent": "nemo_gym",
                "agent_settings": {
                    "nemo_gym": {
                        "args": {
                            "url": f"http://127.0.0.1:{agent_port}",
                            "gateway_port": front_port,
                        }
                    }
                },
            }
        )
    )
    out = tmp_path / "run"
    try:
        run.start()
        # env serve and its Ray: stop() gives them time to end on their own
        ours = run.watch(descendants(run.server_pid("rayrollout_weather")))
        collected = CliRunner().invoke(
            cli_app,
            [
                "collect",
                str(WEATHER_ROWS),
                "--env",
                "weather",
                "--policy",
                "scripted",
                "--out",
                str(out),
                "--config",
                str(config),
            ],
        )
        log = run.log()
    finally:
        run.stop()
    assert collected.exit_code == 0, f"{collected.output}\n--- ng_run:\n{log[-4000:]}"
    trajectories = sorted(read_trajectories(out), key=lambda t: t.task_id)
    assert len(trajectories) == len(rows)
    for trajectory in trajectories:
        where = f"{trajectory.task_id}: {trajectory.error}"
        assert trajectory.status == "ok", where
        assert trajectory.played_by == "nemo_gym", where
        assert trajectory.reward == 1.0, where  # simple_agent's verify, through /run
        # The gateway's records: simple_agent's two model calls (the tool call, the answer).
        assert len(trajectory.turns) == 2, where
        assert trajectory.turns[0].completion_tokens > 0, where
        # simple_agent sends its input plus each reply back: one token sequence.
        assert [t.extends_previous for t in trajectory.turns] == [False, True], where
        roles = [m.role for m in trajectory.messages]
        assert roles == ["system", "user", "assistant", "tool", "assistant"], where
        (call,) = trajectory.messages[2].tool_calls or []
        assert call.function.name == "get_weather", where
        assert trajectory.messages[-1].content, where
        dumped = json.dumps(trajectory.to_row(), default=str)
        assert KEY_FIELD not in dumped and GATEWAY_FIELD not in dumped, where
    # The run ended the worker actor that hosted the front, and ng_run's shutdown ended
    # `rayrollout env serve` and the Ray it started.
    assert _wait_port_free(front_port), f"the front outlived the run: {_listener(front_port)}"
    left = {pid: command for pid, command in run.leftovers.items() if pid in ours}
    assert not left, left

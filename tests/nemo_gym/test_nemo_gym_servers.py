"""``collect --env-url`` against NeMo Gym 0.7.0's own resources servers, started by ``ng_run``.

The servers, their configs and their ``example.jsonl`` rows are NeMo Gym's; only the
policy's judgement is a double (rayrollout's scripted policy on Serve, speaking the real
Chat Completions protocol). Each server must see every episode seeded, verified (its verify
request model accepts our body) and closed (0.7.0's close body), and ``math_with_code``
must release the Python worker each episode started.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml
from ngrun import NemoGymRun, free_port, resources_server_block
from typer.testing import CliRunner

from rayrollout.cli import app as cli_app

SERVERS = ("example_single_tool_call", "example_multi_step", "math_with_code")


@pytest.fixture(scope="module")
def ng_servers(ng_src: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The three servers in one ``ng_run``: name -> (url, the run)."""
    blocks: dict = {}
    ports = {}
    for name in SERVERS:
        ports[name] = free_port()
        blocks.update(resources_server_block(name, ports[name]))
    run = NemoGymRun(blocks, tmp_path_factory.mktemp("ng_servers"))
    run.start()
    try:
        yield {name: (f"http://127.0.0.1:{port}", run) for name, port in ports.items()}
    finally:
        run.stop()


def _children(pid: int) -> set[int]:
    """PIDs of every descendant of ``pid``."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _server_pid(run: NemoGymRun, name: str) -> int:
    """The PID ng_run printed for server ``name`` (its launch shell)."""
    match = re.search(rf"'name': '{name}',\s*'pid': (\d+)", run.log())
    assert match, f"ng_run did not print the pid of {name}"
    return int(match.group(1))


def _requests(run: NemoGymRun, name: str, route: str) -> list[str]:
    """Status codes of the access-log lines of ``POST /route`` on server ``name``."""
    prefix = re.escape(name)
    pattern = rf"\({prefix}[^)]*\) INFO:\s+\S+ - \"POST /{route} HTTP/1.1\" (\d+)"
    return re.findall(pattern, run.log())


@pytest.mark.parametrize("name", SERVERS)
def test_collect_plays_nemo_gyms_own_server_on_its_own_example_data(
    name: str, ng_servers: dict, ng_src: Path, serve_session: int, tmp_path: Path
) -> None:
    url, run = ng_servers[name]
    tasks = ng_src / "resources_servers" / name / "data" / "example.jsonl"
    rows = [json.loads(line) for line in tasks.read_text().splitlines() if line.strip()]
    workers_before = _children(_server_pid(run, name))
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump({"namespace": f"ng-{name}", "ray": {"serve_port": serve_session}})
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli_app,
        [
            "collect",
            str(tasks),
            "--env",
            name,
            "--env-url",
            f"{name}={url}",
            "--out",
            str(out),
            "--config",
            str(config),
        ],
    )
    assert result.exit_code == 0, result.output
    frame = pd.read_parquet(out)

    assert len(frame) == len(rows)
    assert (frame["status"] != "error").all(), frame["error"].tolist()
    assert frame["close_error"].isna().all(), frame["close_error"].tolist()
    # Every episode went through the server's own verify: its answer's fields are recorded.
    for verification in frame["verification"]:
        assert json.loads(verification), "verify answered nothing beyond the reward"
    # The server's own access log: one seed, one verify and one close per episode, all 200.
    for route in ("seed_session", "verify", "close_session"):
        codes = _requests(run, name, route)
        assert codes.count("200") >= len(rows), (route, codes)
        assert set(codes) == {"200"}, (route, codes)
    if name == "math_with_code":
        # Its tool starts a Python worker per session; verify must have released each one.
        assert frame["metrics"].map(lambda m: m["tool_calls"]).sum() >= len(rows)
        assert _children(_server_pid(run, name)) <= workers_before

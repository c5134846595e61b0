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

from rayrollout.cli.commands import app as cli_app
from rayrollout.cli.env_commands import descendants

SERVERS = ("example_single_tool_call", "example_multi_step", "math_with_code")


@pytest.fixture(scope="module")
def ng_servers(ng_src: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The three servers in one ``ng_run``: name -> (url, the run, ng_run's process name)."""
    blocks: dict = {}
    servers = {}
    for name in SERVERS:
        port = free_port()
        block = resources_server_block(name, port)
        blocks.update(block)
        servers[name] = (f"http://127.0.0.1:{port}", next(iter(block)))  # url, ng_run's key
    run = NemoGymRun(blocks, tmp_path_factory.mktemp("ng_servers"))
    run.start()
    try:
        yield {name: (url, run, key) for name, (url, key) in servers.items()}
    finally:
        run.stop()


def _requests(run: NemoGymRun, name: str, route: str) -> list[str]:
    """Status codes of the access-log lines of ``POST /route`` on server ``name``."""
    prefix = re.escape(name)
    pattern = rf"\({prefix}[^)]*\) INFO:\s+\S+ - \"POST /{route} HTTP/1.1\" (\d+)"
    return re.findall(pattern, run.log())


@pytest.mark.parametrize("name", SERVERS)
def test_collect_plays_nemo_gyms_own_server_on_its_own_example_data(
    name: str, ng_servers: dict, ng_src: Path, serve_session: int, tmp_path: Path
) -> None:
    url, run, process_name = ng_servers[name]
    tasks = ng_src / "resources_servers" / name / "data" / "example.jsonl"
    rows = [json.loads(line) for line in tasks.read_text().splitlines() if line.strip()]
    workers_before = descendants(run.server_pid(process_name))
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
        assert descendants(run.server_pid(process_name)) <= workers_before

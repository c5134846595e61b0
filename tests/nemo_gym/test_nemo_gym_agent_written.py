"""NeMo Gym rows whose prompt NeMo Gym's own agent writes, played by the ``nemo_gym`` agent.

scicode's rows hold no prompt (``"input": []``): NeMo Gym 0.7.0's ``scicode_agent`` writes
one per sub-step from the row's ``sub_steps``, calls the model for each, and sends the
code it collected to its resources server's ``/verify``. Here ``ng_run`` starts that agent
as it ships, its ``openai_model`` model server pointed at rayrollout's gateway front, and
``rayrollout collect`` plays scicode's own ``example.jsonl`` with no ``--agent``: the rows
name the ``nemo_gym`` agent themselves. scicode's own verifier needs SciCode's
``test_data.h5``, which is not shipped, so the agent's resources server is a stand-in that
scores 1 when every sub-step the agent played has its code: what is checked is that NeMo
Gym's agent wrote the prompts and every model call it made was recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from ngrun import NemoGymRun, free_port, front_model_block, server_config
from typer.testing import CliRunner, Result

from rayrollout import read_trajectories
from rayrollout.cli.commands import app as cli_app

STAND_IN = "scicode_stand_in"
STAND_IN_APP = '''"""scicode_agent's /verify: 1 when every sub-step it played has its code."""

from pydantic import ConfigDict

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


class Config(BaseResourcesServerConfig):
    pass


class Request(BaseVerifyRequest):
    model_config = ConfigDict(extra="allow")
    solutions: dict[str, str]
    step_usage: list[dict]


class Answer(BaseVerifyResponse):
    model_config = ConfigDict(extra="allow")


class StandIn(SimpleResourcesServer):
    ray_enabled = False
    config: Config

    async def verify(self, body: Request) -> Answer:
        played = [s for s in body.step_usage if s["status"] == "generated"]
        solved = len(body.solutions) == len(played) > 0
        return Answer(**body.model_dump(), reward=float(solved), steps_played=len(played))


if __name__ == "__main__":
    StandIn.run_webserver()
'''


def _blocks(agent_port: int, verify_port: int, front_port: int) -> dict:
    """scicode_agent's own config, its resources server the stand-in, its model the front."""
    blocks = server_config("responses_api_agents", "scicode_agent")
    agent = blocks["scicode_agent"]["responses_api_agents"]["scicode_agent"]
    agent["resources_server"]["name"] = STAND_IN
    agent.update({"host": "127.0.0.1", "port": agent_port})
    stand_in = {
        "entrypoint": "app.py",
        "domain": "coding",
        "verified": False,
        "description": "scores scicode_agent's collected code by its presence",
        "host": "127.0.0.1",
        "port": verify_port,
    }
    # Declared, so its venv is linked like the others' (ng_run adds it otherwise).
    relay = {
        "entrypoint": "app.py",
        "agent_server": {"type": "responses_api_agents", "name": "scicode_agent"},
    }
    return {
        **blocks,
        "scicode_agent_environment_server": {"environment_servers": {"legacy_agent": relay}},
        **front_model_block(front_port),
        STAND_IN: {"resources_servers": {STAND_IN: stand_in}},
    }


def test_scicode_rows_are_played_by_nemo_gyms_own_agent_with_no_agent_flag(
    serve_session: int, ng_src: Path, tmp_path: Path
) -> None:
    example = ng_src / "resources_servers" / "scicode" / "data" / "example.jsonl"
    rows = [json.loads(line) for line in example.read_text().splitlines() if line.strip()]
    root = tmp_path / "root"
    (root / "resources_servers" / STAND_IN).mkdir(parents=True)
    (root / "resources_servers" / STAND_IN / "app.py").write_text(STAND_IN_APP)
    agent_port, verify_port, front_port = free_port(), free_port(), free_port()
    run = NemoGymRun(
        _blocks(agent_port, verify_port, front_port),
        tmp_path,
        {"NEMO_GYM_EXTRA_ROOTS": str(root)},
    )

    def collect(max_turns: int, out: Path) -> Result:
        config = tmp_path / f"run-{max_turns}.yaml"
        args = {"url": f"http://127.0.0.1:{agent_port}", "gateway_port": front_port}
        config.write_text(
            yaml.safe_dump(
                {
                    "namespace": f"ng-agent-written-{max_turns}",
                    "ray": {"serve_port": serve_session},
                    "episode": {"max_turns": max_turns},
                    "agent_settings": {"nemo_gym": {"args": args}},
                }
            )
        )
        return CliRunner().invoke(
            cli_app,
            ["collect", str(example), "--env", "scicode",
             "--env-url", f"scicode=http://127.0.0.1:{verify_port}", "--policy", "scripted",
             "--out", str(out), "--config", str(config)],
        )  # fmt: skip

    out, cut = tmp_path / "run", tmp_path / "cut"
    try:
        run.start()
        collected = collect(30, out)  # scicode_agent: a model call per sub-step, 11 at most
        log = run.log()
        cut_short = collect(4, cut)
    finally:
        run.stop()
    assert collected.exit_code == 0, (
        f"{collected.output}\n{collected.exception!r}\n--- ng_run:\n{log[-4000:]}"
    )
    trajectories = list(read_trajectories(out))
    assert len(trajectories) == len(rows) == 5
    by_problem = {t.task_fields["problem_id"]: t for t in trajectories}
    for row in rows:
        trajectory = by_problem[row["problem_id"]]
        where = f"{row['problem_id']}: {trajectory.error}"
        assert trajectory.status == "ok", where
        assert trajectory.played_by == "nemo_gym", where
        assert trajectory.reward == 1.0, where  # every sub-step played had its code
        played = trajectory.verification["steps_played"]
        # One recorded model call per sub-step the agent played, each a prompt it wrote
        # from the row's sub_steps (the row itself carries none).
        assert len(trajectory.turns) == played >= 1, where
        prompts = [m.content or "" for m in trajectory.messages if m.role == "user"]
        descriptions = [s["step_description_prompt"][:60] for s in row["sub_steps"]]
        assert any(d in p for d in descriptions for p in prompts), (where, prompts[:1])
    # NeMo Gym's access log: one /verify per row, each from scicode_agent's /run.
    assert log.count('POST /verify HTTP/1.1" 200') == len(rows), log[-3000:]
    # Cut at 4 model calls, the 11-step problem has no verdict: max_turns, naming the fix.
    assert cut_short.exit_code == 0, f"{cut_short.output}\n{cut_short.exception!r}"
    statuses = {t.task_fields["problem_id"]: t for t in read_trajectories(cut)}
    assert statuses["10"].status == "max_turns", statuses["10"].error
    assert "raise episode.max_turns" in (statuses["10"].error or "")
    assert len(statuses["10"].turns) == 4
    assert all(statuses[p].status == "ok" for p in ("1", "3", "4", "6"))

"""NeMo Gym 0.7.0's rows opened by ``/seed_session``, against its own servers and agent.

toolsandbox is NeMo Gym's own server (the vendored apple/ToolSandbox: ``/seed_session``
answers a scenario's system prompt and first user turn with its tools, ``/step`` runs the
model's tool calls in the sandbox or hands its text to a simulated user, ``/close`` scores
the milestones, ``/verify`` answers that score), started by its own ``ng_run`` with the
scripted policy as its simulated user's model. Its own example rows are read by
``collect`` and played from the server's first observation; the same rows and the same
scripted policy through NeMo Gym's own ``toolsandbox_agent`` give the same rewards.

The other two seeded datasets cannot be played here: aviary's server needs the ``fhaviary``
package and downloads its GSM8k split from the Hugging Face hub when it starts (so its
protocol is checked against aviary's own pydantic models instead), and terminal_bench_4's
seeds a Docker sandbox of a task it downloads (its rows are read and each episode refused,
naming the sandbox, before any request is sent).

ToolSandbox's own dependencies (polars, rouge-score, ...) are not NeMo Gym's: ``.ci/nemo_gym``
installs them into its venv, or ``TOOLSANDBOX_DEPS`` names a folder that holds them.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest
import requests
import yaml
from cli_run import collect_tasks
from ngrun import NemoGymRun, free_port, policy_model_block, resources_server_block
from served_policy import scripted_policy_on_serve

from rayrollout.data.tasks import UNSUPPORTED

SERVER = "toolsandbox"
SOLVE_0 = json.dumps(
    [
        {
            "tool": "add_contact",
            "arguments": {"name": "Stephen Sondheim", "phone_number": "+19876543210"},
        },
        "Stephen Sondheim has been added to your contacts.",
    ]
)
DEPS = os.environ.get("TOOLSANDBOX_DEPS")
# What ToolSandbox's server imports beside NeMo Gym (its requirements.txt).
IMPORTS = "polars, networkx, rouge_score, rapidfuzz, strenum, phonenumbers, geopy, holidays, pint"


@pytest.fixture(scope="module")
def toolsandbox_env(ng_python: Path) -> dict[str, str]:
    env = {"PYTHONPATH": DEPS} if DEPS else {}
    found = subprocess.run(
        [str(ng_python), "-c", f"import {IMPORTS}"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )
    if found.returncode != 0:
        pytest.fail(
            "ToolSandbox's dependencies are not installed beside NeMo Gym "
            f"({found.stderr.strip().splitlines()[-1]}): run `bash .ci/nemo_gym install`, or "
            "set TOOLSANDBOX_DEPS to a folder holding them"
        )
    return env


@pytest.fixture(scope="module")
def policy_url(serve_session: int) -> Iterator[str]:
    # NeMo Gym's openai_model sends its openai_api_key (below) as the bearer token.
    with scripted_policy_on_serve("ng-seed-policy", serve_session, "not-needed") as url:
        yield url


def _blocks(ng_src: Path, port: int, policy_url: str) -> dict:
    """toolsandbox, its own toolsandbox_agent, and the scripted policy as ``policy_model``
    (the agent's model and the simulated user's)."""
    blocks = resources_server_block(SERVER, port)
    own = ng_src / "resources_servers" / SERVER / "configs" / f"{SERVER}.yaml"
    config = yaml.safe_load(own.read_text())
    # Its agent's block is in the agent's own config (config_paths), overridden by toolsandbox's.
    agent_yaml = ng_src / "responses_api_agents" / "toolsandbox_agent" / "configs"
    agent = yaml.safe_load((agent_yaml / "toolsandbox_agent.yaml").read_text())
    settings = agent["toolsandbox_agent"]["responses_api_agents"]["toolsandbox_agent"]
    settings.update(config["toolsandbox_agent"]["responses_api_agents"]["toolsandbox_agent"])
    settings["resources_server"] = {"type": "resources_servers", "name": SERVER}
    settings["datasets"] = [d for d in settings["datasets"] if d["name"] == "example"]
    blocks["toolsandbox_agent"] = agent["toolsandbox_agent"]
    blocks["toolsandbox_agent_environment_server"] = config["toolsandbox_agent_environment_server"]
    blocks.update(policy_model_block(policy_url))
    return blocks


def _collect(tmp_path: Path, tasks: Path, url: str, port: int, exit_code: int = 0) -> pd.DataFrame:
    namespace = f"ng-seed-{tmp_path.name[-8:]}"
    config = {"namespace": namespace, "ray": {"serve_port": port}, "episode": {"max_turns": 30}}
    flags = ["--env", SERVER, "--env-url", f"{SERVER}={url}", "--agent", "reset_step"]
    return pd.read_parquet(collect_tasks(tmp_path, tasks, config, *flags, exit_code=exit_code))


def test_toolsandbox_rows_play_from_its_seed_and_score_as_its_own_agent(
    ng_src: Path, toolsandbox_env: dict, policy_url: str, serve_session: int, tmp_path: Path
) -> None:
    example = ng_src / "resources_servers" / SERVER / "data" / "example.jsonl"
    rows = [json.loads(line) for line in example.read_text().splitlines() if line.strip()]
    # Row 0's scenario (add a contact, then say so) played right: the scripted replies ride in
    # the row's own `instructions`, which both agents put before the server's observation.
    rows[0]["responses_create_params"]["instructions"] = f"Help the user. [[replies={SOLVE_0}]]"
    tasks = tmp_path / "toolsandbox.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    run = NemoGymRun(_blocks(ng_src, port, policy_url), tmp_path, extra_env=toolsandbox_env)
    output = tmp_path / "rollouts.jsonl"
    try:
        run.start()
        # What the server opens each scenario with, asked directly (then released).
        openings = {}
        for row in rows:
            seed = requests.post(f"{url}/seed_session", json=row, timeout=120)
            assert seed.status_code == 200, seed.text
            answer = seed.json()
            openings[row["task_idx"]] = (answer["obs"], answer["tools"], answer["scenario"])
            requests.post(f"{url}/close", json={"env_id": answer["env_id"]}, timeout=120)
        ours = _collect(tmp_path, tasks, url, serve_session)
        collected = run.collect_rollouts("toolsandbox_agent", tasks, output)
        assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    finally:
        run.stop()

    theirs = {
        json.loads(line)["task_idx"]: json.loads(line)
        for line in output.read_text().splitlines()
        if line.strip()
    }
    rewards = {json.loads(r["task_fields"])["task_idx"]: r["reward"] for _, r in ours.iterrows()}
    print(f"\ntoolsandbox rewards by task_idx, rayrollout: {rewards}")
    print(f"toolsandbox rewards by task_idx, NeMo Gym's toolsandbox_agent: "
          f"{ {i: t['reward'] for i, t in sorted(theirs.items())} }; turn counts "
          f"{ {i: t['turn_count'] for i, t in sorted(theirs.items())} }")  # fmt: skip
    assert len(ours) == len(rows)
    assert (ours["status"] == "ok").all(), ours["error"].tolist()
    assert ours["close_error"].isna().all(), ours["close_error"].tolist()
    assert sorted(theirs) == sorted(openings)
    assert rewards[0] > 0.0  # a scenario solved, not only failed ones compared
    for _, row in ours.iterrows():
        index = json.loads(row["task_fields"])["task_idx"]
        obs, tools, scenario = openings[index]
        lead = 1 if index == 0 else 0  # the instructions' system message
        messages = list(row["messages"])[lead:]
        # The first observation is the server's text, exactly, as environment messages
        # before the first model call (in its prompt, never sampled by the policy).
        assert [(m["role"], m["content"]) for m in messages[: len(obs)]] == [
            (o["role"], o["content"]) for o in obs
        ], index
        assert row["turns"][0]["prompt_message_count"] == lead + len(obs)
        assert [t["function"]["name"] for t in json.loads(row["tools"])] == [
            t["name"] for t in tools
        ]
        verification = json.loads(row["verification"])
        assert verification["scenario"] == scenario
        if index == 0:  # solved: the contact added, the user told (both milestones)
            assert row["reward"] == 1.0 and verification["milestone_similarity"] == 1.0
            continue
        # The same score as NeMo Gym's own agent gets with the same (scripted) model. (Row 0
        # is left out: the scripted policy's /v1/responses, which NeMo Gym's openai_model
        # calls, does not read `instructions`, so its agent never saw the scripted replies.)
        for key in ("reward", "milestone_similarity", "minefield_similarity", "turn_count"):
            ours_value = row["reward"] if key == "reward" else verification[key]
            assert ours_value == theirs[index][key], (index, key, ours_value, theirs[index])


class _Recorder(BaseHTTPRequestHandler):
    """Answers the preflight's GET; records any POST (a seed would be one)."""

    posts: list[str] = []

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def do_POST(self) -> None:
        self.posts.append(self.path)
        self.send_response(500)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_terminal_bench_4_rows_are_read_and_each_episode_refused_naming_the_sandbox(
    ng_src: Path, serve_session: int, tmp_path: Path
) -> None:
    example = ng_src / "resources_servers" / "terminal_bench_4" / "data" / "example.jsonl"
    rows = [line for line in example.read_text().splitlines() if line.strip()]
    tasks = tmp_path / "tb4.jsonl"
    tasks.write_text(example.read_text())
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        frame = _collect(tmp_path, tasks, url, serve_session, 3)  # 3: every episode failed
    finally:
        server.shutdown()
        thread.join(timeout=10)
    assert len(frame) == len(rows)
    assert (frame["status"] == "error").all()
    for error in frame["error"]:
        assert f"{UNSUPPORTED}: a task sandbox." in error and "Docker" in error, error
    assert _Recorder.posts == []  # refused before seeding: no sandbox was asked for


AVIARY_SEED = """
import json, sys
from nemo_gym.openai_utils import NeMoGymEasyInputMessage
from resources_servers.aviary.schemas import (
    AviaryEnvStateEasyInputMessage, AviarySeedSessionResponse, AviaryStepResponse,
)
seed = AviarySeedSessionResponse(
    env_id="env-1",
    obs=[
        AviaryEnvStateEasyInputMessage(role="user", content="Calculator ready.\\n"),
        NeMoGymEasyInputMessage(role="user", content="What is 2 + 3? Use the calculator."),
    ],
    tools=[{"type": "function", "name": "calculator", "strict": True,
            "parameters": {"type": "object", "properties": {"expr": {"type": "string"}},
                           "required": ["expr"], "additionalProperties": False}}],
)
step = AviaryStepResponse(
    obs=[{"type": "function_call_output", "call_id": "call_a", "output": "5"}],
    reward=1.0,
    done=True,
)
print(json.dumps({"seed": seed.model_dump(mode="json"), "step": step.model_dump(mode="json")}))
"""
AVIARY_CHECK = """
import json, sys
from resources_servers.aviary.schemas import (
    AviaryAgentVerifyRequest, AviaryCloseRequest, AviarySeedSessionRequest, AviaryStepRequest,
)
bodies = json.load(sys.stdin)
AviarySeedSessionRequest.model_validate(bodies["seed_session"])
step = AviaryStepRequest.model_validate(bodies["step"])
AviaryCloseRequest.model_validate(bodies["close"])
verify = AviaryAgentVerifyRequest.model_validate(bodies["verify"])
print(json.dumps({"action": [c.name for c in step.action], "env_id": verify.response.env_id,
                  "task_idx": verify.model_dump()["task_idx"]}))
"""


def test_aviary_answers_and_requests_match_nemo_gyms_own_aviary_schemas(
    ng_src: Path, ng_python: Path
) -> None:
    """aviary's server cannot start here (``fhaviary``, and its GSM8k split downloaded at
    start), so its protocol is checked against its own pydantic models: a seed and a step
    answer NeMo Gym builds are read, and the requests rayrollout sends back validate."""
    import asyncio

    from rayrollout.data.schema import FunctionCall, Message, ToolCall
    from rayrollout.data.tasks import parse_task_row
    from rayrollout.envkit.nemo_gym.seeded import SeededEpisode

    def ng(code: str, stdin: str = "") -> dict:
        done = subprocess.run(
            [str(ng_python), "-c", code], input=stdin, cwd=ng_src, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    answers = ng(AVIARY_SEED)
    example = ng_src / "resources_servers" / "aviary" / "data" / "example.jsonl"
    row = json.loads(example.read_text().splitlines()[2])
    task = parse_task_row(row, default_environment="aviary", source="aviary", line=3)
    sent: dict[str, object] = {"seed_session": task.fields}

    async def post(route: str, body: object, retry: bool) -> tuple[int, str]:
        sent[route] = body
        reply = {"step": answers["step"], "verify": {"reward": 1.0}}.get(route, {})
        return 200, json.dumps(reply)

    async def play() -> tuple[list[Message], float]:
        episode = SeededEpisode(post, "aviary", task, answers["seed"])
        opening = await episode.reset(list(task.prompt))
        call = ToolCall(
            id="call_a", function=FunctionCall(name="calculator", arguments='{"expr": "2+3"}')
        )
        action = Message(role="assistant", content=None, tool_calls=[call])
        result = await episode.step(action)
        messages = [*opening.messages, action, *result.observation]
        return messages, (await episode.verify(messages)).reward

    messages, reward = asyncio.run(play())
    # The observation as NeMo Gym wrote it, its env-state message included, text untouched.
    assert [(m.role, m.content) for m in messages[:2]] == [
        ("user", "Calculator ready.\n"),
        ("user", "What is 2 + 3? Use the calculator."),
    ]
    assert messages[-1].role == "tool" and messages[-1].content == "5"
    assert reward == 1.0
    checked = ng(AVIARY_CHECK, json.dumps(sent))
    assert checked == {"action": ["calculator"], "env_id": "env-1", "task_idx": row["task_idx"]}

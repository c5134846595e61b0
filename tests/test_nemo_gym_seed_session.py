"""NeMo Gym rows whose first observation is the server's ``/seed_session`` answer.

The server below is plain FastAPI speaking the protocol of NeMo Gym 0.7.0's aviary and
toolsandbox resources servers (their ``schemas.py``): ``/seed_session`` with the row's
``task_idx`` answers ``{env_id, obs, tools}``; ``/step`` with ``{env_id, action |
function_calls, text}`` answers ``{obs, reward, done}``; ``/close`` with ``{env_id}`` drops
(and, like toolsandbox, scores) the environment; ``/verify`` reads the reward of
``response.env_id``. Task 0 is a toolsandbox-like conversation (a simulated user answers
the model's text), task 1 an aviary-like one (the row names an aviary agent; rewards come
from the steps). The rows are NeMo Gym's own shapes, read by ``collect``.
"""

import json
import uuid
from collections import defaultdict

import pandas as pd
import pytest
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from netutil import ServedApp
from typer.testing import CliRunner

from rayrollout.cli.commands import app as cli_app
from rayrollout.data.tasks import UNSUPPORTED, parse_task_row

MULTIPLY = {
    "type": "function",
    "name": "multiply",
    "description": "Multiply two integers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "strict": True,
}
SUBMIT = {
    "type": "function",
    "name": "submit_answer",
    "description": "Submit the final answer.",
    "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}},
    "strict": False,
}
# What each environment opens with: the first observation, scripted replies in it (the
# scripted policy's directive), exactly as the test checks it in the trajectory.
OPENINGS = {
    0: [
        {"role": "system", "content": "You are a helpful assistant with a calculator."},
        {
            "role": "user",
            "content": "What is 6 times 7?\n  (answer me) "
            '[[replies=[{"tool": "multiply", "arguments": {"a": 6, "b": 7}}, "It is 42."]]]',
        },
    ],
    1: [
        {
            "type": "message",
            "role": "user",
            "is_env_state": True,
            "content": "Compute 2 + 3 and submit it. "
            '[[replies=[{"tool": "submit_answer", "arguments": {"answer": "5"}}]]]',
        }
    ],
}
ROWS = [
    {"task_idx": 0, "responses_create_params": {"input": []}},
    {
        "task_idx": 1,
        "responses_create_params": {"input": []},
        "agent_ref": {"type": "responses_api_agents", "name": "gsm8k_aviary_agent"},
    },
]
TB4_ROW = {
    "task_name": "terminal-bench/ks-solver-cpp",
    "task_ref": "sha256:d4ee",
    "dataset_ref": "sha256:39d9",
    "responses_create_params": {"input": [], "tools": []},
}


class SeededServer(ServedApp):
    """An aviary/toolsandbox-style resources server that records every call per env_id."""

    def __init__(self) -> None:
        self.calls: dict[str, list[str]] = defaultdict(list)
        self.steps: list[dict] = []
        self.verify_bodies: list[dict] = []
        self.seed_bodies: list[dict] = []
        self.envs: dict[str, dict] = {}
        self.scores: dict[str, float] = {}
        self.app = FastAPI()
        for route in ("seed_session", "step", "close", "verify", "close_session"):
            self.app.post(f"/{route}")(getattr(self, route))
        super().__init__(self.app)

    async def seed_session(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.seed_bodies.append(body)
        index = body["task_idx"]
        env_id = str(uuid.uuid4())
        self.envs[env_id] = {"task": index, "reward": 0.0, "said": []}
        self.calls[env_id].append("seed_session")
        answer = {"env_id": env_id, "obs": OPENINGS[index], "tools": [MULTIPLY, SUBMIT][index:][:1]}
        if index == 0:
            answer["scenario"] = "multiply_two_numbers"
        response = JSONResponse(answer)
        response.set_cookie("session", env_id)
        return response

    async def step(self, request: Request) -> dict:
        body = await request.json()
        self.steps.append(body)
        env = self.envs[body["env_id"]]
        self.calls[body["env_id"]].append("step")
        if env["task"] == 1:  # aviary reads `action`; the reward comes with the step
            (call,) = body["action"]
            answer = json.loads(call["arguments"])["answer"]
            reward = 1.0 if answer == "5" else 0.0
            env["reward"] += reward
            output = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
            return {"obs": [output], "reward": reward, "done": True}
        if body["function_calls"]:  # toolsandbox reads `function_calls`, else `text`
            obs = []
            for call in body["function_calls"]:
                args = json.loads(call["arguments"])
                output = str(args["a"] * args["b"])
                obs.append(
                    {"type": "function_call_output", "call_id": call["call_id"], "output": output}
                )
            return {"obs": obs, "reward": 0.0, "done": False}
        env["said"].append(body["text"])
        reply = {"type": "message", "role": "user", "content": "Thanks, that is all."}
        return {"obs": [reply], "reward": 0.0, "done": True}

    async def close(self, request: Request) -> dict:
        body = await request.json()
        env = self.envs.pop(body["env_id"])
        self.calls[body["env_id"]].append("close")
        said = " ".join(env["said"])
        self.scores[body["env_id"]] = env["reward"] if env["task"] == 1 else float("42" in said)
        return {"message": "Success", "success": True}

    async def verify(self, request: Request) -> dict:
        body = await request.json()
        self.verify_bodies.append(body)
        env_id = body["response"]["env_id"]
        self.calls[env_id].append("verify")
        return {**body, "reward": self.scores.pop(env_id, 0.0), "scored_env": env_id}

    async def close_session(self, request: Request) -> dict:
        env_id = request.cookies.get("session", "no-cookie")
        self.calls[env_id].append("close_session")
        return {}


def collect(tmp_path, port, tasks, url, *args, code=0):
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump({"namespace": f"seed-{tmp_path.name}", "ray": {"serve_port": port}})
    )
    out = tmp_path / "out"
    command = ["collect", str(tasks), "--env", "seeded", "--env-url", f"seeded={url}", *args]
    result = CliRunner().invoke(cli_app, [*command, "--out", str(out), "--config", str(config)])
    assert result.exit_code == code, result.output
    return pd.read_parquet(out)


def test_a_seeded_row_is_read_with_an_empty_prompt_and_its_seed_request():
    task = parse_task_row(ROWS[1], default_environment="seeded")
    assert task.opening == "seed_session" and task.prompt == []
    assert task.fields == ROWS[1]  # the seed request (task_idx) goes back to the server
    assert parse_task_row(TB4_ROW, default_environment="tb").opening == "seed_session"
    plain = parse_task_row(
        {"responses_create_params": {"input": "2+2?"}}, default_environment="seeded"
    )
    assert plain.opening == "prompt"


def test_seeded_rows_play_from_the_servers_first_observation(tmp_path, serve_session):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in [*ROWS, TB4_ROW]))
    with SeededServer() as server:
        frame = collect(tmp_path, serve_session, tasks, server.url, "--agent", "reset_step")

    by_idx = {json.loads(r["task_fields"]).get("task_idx"): r for _, r in frame.iterrows()}
    chat, aviary, tb4 = by_idx[0], by_idx[1], by_idx[None]
    for row in (chat, aviary):
        assert row["status"] == "ok", row["error"]
        assert pd.isna(row["close_error"]), row["close_error"]
    # The first observation is the server's, exactly, and comes before the first model call:
    # it is in that call's prompt (environment tokens), not in anything the policy sampled.
    for row, index in ((chat, 0), (aviary, 1)):
        opening = OPENINGS[index]
        messages = list(row["messages"])
        assert [(m["role"], m["content"]) for m in messages[: len(opening)]] == [
            (o["role"], o["content"]) for o in opening
        ]
        first = row["turns"][0]
        assert first["speaker"] == "policy" and first["prompt_message_count"] == len(opening)
        assert all(m["role"] != "assistant" for m in messages[: len(opening)])
        tools = json.loads(row["tools"])
        assert [t["function"]["name"] for t in tools] == [["multiply", "submit_answer"][index]]

    # Task 0 (toolsandbox-like): a call, its output, then the text went to the simulated user
    # whose reply ended it; the reward is /verify's, scored at /close.
    assert chat["reward"] == 1.0
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert chat["messages"][3]["content"] == "42"
    verification = json.loads(chat["verification"])
    assert verification["steps"] == 2 and verification["terminated"] is True
    assert verification["final_observation"] == ["Thanks, that is all."]
    assert verification["scored_env"] == verification["env_id"]
    # Task 1 (aviary-like): one step with its reward, kept on the turn that made it.
    assert aviary["reward"] == 1.0
    assert [t["step_reward"] for t in aviary["turns"]] == [1.0]

    # The server saw each episode's whole lifecycle, in NeMo Gym's harnesses' order.
    assert sorted(server.calls.values()) == sorted(
        [
            ["seed_session", "step", "step", "close", "verify", "close_session"],
            ["seed_session", "step", "close", "verify", "close_session"],
        ]
    )
    assert sorted(b["task_idx"] for b in server.seed_bodies) == [0, 1]  # none for tb4
    texts = [s["text"] for s in server.steps if s.get("text") is not None]
    assert texts == ["It is 42."]
    for body in server.verify_bodies:
        assert body["response"]["contains_transitions"] is False
        assert body["response"]["group_id"] == str(body["task_idx"])

    # terminal_bench_4's row was read, and its episode refused without seeding a sandbox.
    assert tb4["status"] == "error"
    assert f"{UNSUPPORTED}: a task sandbox." in tb4["error"], tb4["error"]
    assert "Docker" in tb4["error"]


@pytest.mark.parametrize("agent", ["tool_loop"])
def test_another_agent_fails_saying_which_agent_plays_a_seeded_row(tmp_path, serve_session, agent):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(ROWS[0]) + "\n")
    with SeededServer() as server:
        frame = collect(tmp_path, serve_session, tasks, server.url, "--agent", agent, code=3)
    (error,) = frame["error"]
    assert "reset_step" in error and "no messages" in error, error
    assert len(frame["turns"][0]) == 0  # no empty conversation reached the model
    # The environment it seeded was released all the same.
    (calls,) = server.calls.values()
    assert calls[0] == "seed_session" and "close" in calls and "close_session" in calls

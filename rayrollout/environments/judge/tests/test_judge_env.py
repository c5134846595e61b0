"""Judge environment: a judge model speaking Chat Completions grades the answers."""

import json
import re
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request

from rayrollout import RolloutEngine
from rayrollout.data.schema import Message
from rayrollout.data.tasks import parse_task_row
from rayrollout.environments.judge.env import JudgeEnv
from rayrollout.envkit import Episode
from rayrollout.ports import free_port

HERE = Path(__file__).resolve().parents[1]


SECTIONS = re.compile(r"Reference answer:\n(.*?)\n\nCandidate answer:\n(.*?)\n\nIs the", re.S)


class ScriptedJudge:
    """A judge model in miniature: CORRECT when the candidate contains the reference."""

    def __init__(self, reply: str | None = None) -> None:
        self.prompts: list[str] = []
        self.reply = reply
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.complete)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/v1"
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "ScriptedJudge":
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    async def complete(self, request: Request) -> dict:
        body = await request.json()
        prompt = body["messages"][-1]["content"]
        self.prompts.append(prompt)
        reference, candidate = SECTIONS.search(prompt).groups()
        verdict = "CORRECT" if reference.lower() in candidate.lower() else "INCORRECT"
        text = self.reply or f"The candidate says {candidate!r}.\nVERDICT: {verdict}"
        return {
            "id": "judge-1",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }


def with_judge(row: dict, url: str) -> dict:
    return {**row, "judge": {"base_url": url, "model": "tiny-judge"}}


ROWS = [json.loads(line) for line in (HERE / "example_tasks.jsonl").read_text().splitlines()]


def test_scripted_episodes_are_graded_by_the_judge(tmp_path, serve_session):
    config = {
        "namespace": "judge-tests",
        "output": {"dir": str(tmp_path / "out")},
        "ray": {"serve_port": serve_session},
    }
    with ScriptedJudge() as judge, RolloutEngine(config) as engine:
        result = engine.collect([with_judge(row, judge.url) for row in ROWS])
    by_id = {t.task_id: t for t in result.trajectories()}
    # The lookup finds the right note for the first two; for Turkey it picks Istanbul's.
    assert {i: t.reward for i, t in by_id.items()} == {
        "judge-0": 1.0,
        "judge-1": 1.0,
        "judge-2": 0.0,
    }
    wrong = by_id["judge-2"]
    assert wrong.status == "ok"
    assert wrong.verification["verdict"] == "incorrect"
    assert wrong.verification["judge_model"] == "tiny-judge"
    assert "VERDICT: INCORRECT" in wrong.verification["judge_reply"]
    assert len(judge.prompts) == 3
    assert all("Reference answer:" in p for p in judge.prompts)


def episode(row: dict, answer: str) -> Episode:
    task = parse_task_row(row)
    return Episode(task=task, messages=[*task.prompt, Message(role="assistant", content=answer)])


async def test_a_judge_reply_without_a_verdict_is_an_error_not_a_zero():
    with ScriptedJudge(reply="Hmm, hard to say.") as judge:
        env_episode = episode(with_judge(ROWS[0], judge.url), "Canberra")
        with pytest.raises(ValueError, match="gave no 'VERDICT: CORRECT'"):
            await JudgeEnv(env_episode.task).verify(env_episode)


async def test_without_a_judge_endpoint_verify_says_how_to_configure_one():
    env_episode = episode(ROWS[0], "Canberra")
    with pytest.raises(ValueError, match="no judge endpoint: give the task a 'judge'"):
        await JudgeEnv(env_episode.task).verify(env_episode)


async def test_lookup_returns_the_note_with_most_words_in_common():
    env = JudgeEnv(episode(ROWS[0], "").task)
    found = await env.call_tool("lookup", json.dumps({"query": "largest city"}))
    missing = await env.call_tool("lookup", json.dumps({"query": "zebra"}))
    assert found.content == "Sydney is the largest city in Australia."
    assert missing.is_error and "no note matches" in missing.content

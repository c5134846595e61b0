"""Runs to export and the checks of the readers that load exports (``test_export_*`` use it).

A real ``rayrollout collect`` (scripted policy on Serve), hand-built parts written by the
writer, and how each export's reader reads the result: SFT and DPO files load with Hugging
Face ``datasets`` and have the columns and message shapes TRL's trainers take (TRL itself
pulls in torch, so its two checks used here are mirrored below, with their source).
(A plain module, like ``trajectories``: test files import it by name.)
"""

import json
from pathlib import Path

import datasets
import yaml
from jinja2.sandbox import ImmutableSandboxedEnvironment
from trajectories import write_through
from typer.testing import CliRunner

from rayrollout.cli.commands import app
from rayrollout.data.schema import EpisodeMetrics, FunctionCall, Message, ToolCall, Trajectory
from rayrollout.data.writer import make_sink
from rayrollout.deployments.vllm.tiny_model import CHAT_TEMPLATE

ROOT = Path(__file__).resolve().parents[1]
NEMO_GYM_TASKS = ROOT / "rayrollout" / "environments" / "weather" / "tasks_nemo_gym.jsonl"
MATH_TASKS = ROOT / "rayrollout" / "environments" / "math" / "tasks.jsonl"
runner = CliRunner()


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def load(path):
    """The file as TRL's users load it (the cache beside it, not in the home folder)."""
    kind = "parquet" if path.suffix == ".parquet" else "json"
    cache = str(path.parent / ".hf-cache")
    return datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=cache)


def is_conversational(example):
    """``trl.data_utils.is_conversational`` (TRL 1.16): a supported key holding role messages."""
    keys = [k for k in ("prompt", "chosen", "rejected", "completion", "messages") if k in example]
    return bool(keys) and all(
        isinstance(example[k], list) and isinstance(example[k][0], dict) and "role" in example[k][0]
        for k in keys
    )


def render(messages, tools, add_generation_prompt=False):
    """What ``tokenizer.apply_chat_template(..., tokenize=False)`` renders with the tiny model's
    ChatML template (Qwen2.5 tool style), in a sandbox as transformers runs it."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    template = env.from_string(CHAT_TEMPLATE)
    return template.render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt
    )


def write_parts(directory, trajectories, fmt="jsonl", rows_per_part=3, run_id="r"):
    """The trajectories as parts of run ``run_id``, through the real sink and part writer."""
    write_through(make_sink(directory, fmt, run_id), trajectories, rows_per_part)
    return directory


CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def math_trajectory(task_id, sample_index, reward, answer, status="ok", few_shot=False):
    """A two-turn calculator episode as the engine writes it (one assistant message a turn)."""
    prompt = [Message(role="system", content="Answer in one line.")]
    if few_shot:
        prompt += [
            Message(role="user", content="What is 1 + 1?"),
            Message(role="assistant", content="2"),
        ]
    prompt.append(Message(role="user", content=f"What is 6 * 7? ({task_id})"))
    call = ToolCall(
        id=f"call_{sample_index}",
        function=FunctionCall(name="calculator", arguments='{"expression": "6 * 7"}'),
    )
    return Trajectory(
        task_id=task_id,
        sample_index=sample_index,
        group_id=task_id,
        environment="math",
        model="scripted",
        reward=reward,
        status=status,
        tools=[CALCULATOR],
        messages=[
            *prompt,
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", tool_call_id=call.id, name="calculator", content="42"),
            Message(role="assistant", content=f"The answer is {answer}."),
        ],
        metrics=EpisodeMetrics(turns=2, tool_calls=1, tokens_in=30, tokens_out=12),
        task_fields={"expected_answer": "42"},
        verification={"predicted": answer},
    )


def real_task_lines():
    """Two NeMo Gym weather rows (with their agent_ref) and two rayrollout math rows."""
    return NEMO_GYM_TASKS.read_text().splitlines()[:2] + MATH_TASKS.read_text().splitlines()[:2]


def collect_run(base, lines, serve_port, **config):
    """A real ``rayrollout collect`` of these task rows, 2 samples each, scripted policy on
    Serve; ``config`` adds to the run's config file (e.g. ``policy``). Returns the folder."""
    tasks = base / "tasks.jsonl"
    tasks.write_text("\n".join(lines) + "\n")
    path = base / "run.yaml"
    path.write_text(
        yaml.safe_dump({"namespace": "export-tests", "ray": {"serve_port": serve_port}, **config})
    )
    out = base / "run"
    args = ["--env", "weather", "--policy", "scripted", "-n", "2", "--out", out, "--config", path]
    code, output = invoke("collect", tasks, *args)
    assert code == 0, output
    return out


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]

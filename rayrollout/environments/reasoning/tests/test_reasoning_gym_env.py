"""reasoning-gym environment: generated tasks, the package's own scoring, real episodes."""

import json

import pytest

pytest.importorskip("reasoning_gym", reason="needs the [reasoning-gym] extra")

from typer.testing import CliRunner  # noqa: E402

from rayrollout import RolloutEngine  # noqa: E402
from rayrollout.cli.commands import app  # noqa: E402
from rayrollout.data.schema import Message  # noqa: E402
from rayrollout.data.tasks import parse_task_row  # noqa: E402
from rayrollout.environments.reasoning.env import ReasoningGymEnv, extract_answer, generate_tasks  # noqa: E402
from rayrollout.envkit import Episode  # noqa: E402

DATASETS = ["leg_counting", "basic_arithmetic", "word_sorting"]


def episode(row: dict, answer: str) -> Episode:
    task = parse_task_row(row)
    return Episode(task=task, messages=[*task.prompt, Message(role="assistant", content=answer)])


def test_generation_is_reproducible_by_seed_and_rows_are_valid_tasks():
    first = list(generate_tasks(DATASETS, size=3, seed=7))
    again = list(generate_tasks(DATASETS, size=3, seed=7))
    other = list(generate_tasks(DATASETS, size=3, seed=8))
    assert first == again != other
    assert len(first) == 9
    assert [r["task_id"] for r in first[:2]] == ["rg-leg_counting-7-0", "rg-leg_counting-7-1"]
    for row in first:
        task = parse_task_row(json.loads(json.dumps(row)))  # as read back from a file
        assert task.environment == "reasoning_gym"
        assert task.prompt[0].role == "system" and "<answer>" in task.prompt[0].content


@pytest.mark.parametrize("dataset", DATASETS)
async def test_the_generators_own_answers_score_one_and_wrong_ones_less(dataset):
    for row in generate_tasks(dataset, size=3, seed=1):
        row = json.loads(json.dumps(row))
        right = episode(row, f"Let me think.\n<answer>{row['answer']}</answer>")
        wrong = episode(row, "<answer>definitely not it</answer>")
        assert (await ReasoningGymEnv(right.task).verify(right)).reward == 1.0
        assert (await ReasoningGymEnv(wrong.task).verify(wrong)).reward < 1.0


def test_the_answer_is_read_from_the_last_answer_tags_else_the_whole_text():
    assert extract_answer("x <answer>1</answer> then <answer> 2 </answer>") == "2"
    assert extract_answer("  42 \n") == "42"


def test_env_tasks_prints_generated_rows_as_jsonl():
    result = CliRunner().invoke(
        app, ["env", "tasks", "reasoning_gym", "--dataset", "leg_counting", "--size", "4"]
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows == json.loads(json.dumps(list(generate_tasks("leg_counting", size=4, seed=0))))
    unknown = CliRunner().invoke(app, ["env", "tasks", "reasoning_gym", "--dataset", "nope"])
    assert unknown.exit_code == 2 and "unknown reasoning-gym dataset 'nope'" in unknown.output


def test_scripted_episodes_run_through_the_scoring_path(tmp_path, serve_session):
    """The scripted policy has no strategy without tools: it answers, and scores 0."""
    config = {
        "namespace": "rg-tests",
        "output": {"dir": str(tmp_path / "out")},
        "ray": {"serve_port": serve_session},
    }
    rows = list(generate_tasks(["leg_counting", "basic_arithmetic"], size=2, seed=3))
    with RolloutEngine(config) as engine:
        result = engine.collect(rows)
    trajectories = result.trajectories()
    assert len(trajectories) == 4
    for trajectory in trajectories:
        assert trajectory.status == "ok", trajectory.error
        assert trajectory.reward == 0.0
        assert trajectory.verification["extracted_answer"].startswith("I have no tools")
        assert trajectory.verification["dataset"] in ("leg_counting", "basic_arithmetic")

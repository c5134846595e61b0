"""Checks before start (``rayrollout.api.preflight``), as a user meets them on the command line:
each mistake is one ``error:`` line naming the fix and exit 2, a tasks file without rows is
one notice and exit 0, and in every case nothing was started.

"Nothing was started" is shown two ways, never by a stopwatch: in-process (typer's
``CliRunner``), ``RolloutEngine._start`` (which starts Ray) is replaced by one that records
the call and raises ``Started``; through the real ``rayrollout`` binary, Ray's temporary
folder (``RAY_TMPDIR``) stays empty. A check that lets a good setup through is shown the
same way: that run reaches the start.

The endpoint probe meets real HTTP servers on 127.0.0.1 (answering 401, 403, 404 or a model
list) and a port nothing listens on.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from hidden_programs import path_without
from netutil import free_port
from typer.testing import CliRunner

from rayrollout.api.preflight import probe_policy
from rayrollout.api.rollout_engine import RolloutEngine
from rayrollout.cli.commands import app
from rayrollout.data.config import RunConfig
from rayrollout.envkit import Environment, Episode, Verification

ROOT = Path(__file__).resolve().parents[1]
RAYROLLOUT = Path(sys.executable).parent / "rayrollout"
KEY = "sk-preflight-test-5150"
runner = CliRunner()


class Started(Exception):
    """Raised where the run would start Ray: the checks let it through."""


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every attempt to start Ray and the engine, recorded (and stopped with ``Started``)."""
    calls: list[str] = []

    def start(self: RolloutEngine, *args: Any, **kwargs: Any) -> RolloutEngine:
        calls.append(self.config.output.dir)
        raise Started

    monkeypatch.setattr(RolloutEngine, "_start", start)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return calls


def collect(*args: Any) -> tuple[int, str, BaseException | None]:
    """``rayrollout collect ARGS`` in-process: exit code, output, and an escaped exception."""
    result = runner.invoke(app, ["collect", *(str(a) for a in args)])
    return result.exit_code, result.output, result.exception


def one_error_line(output: str) -> str:
    """The one ``error:`` line of a refused command (never a traceback)."""
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


def tasks_file(folder: Path, *environments: str) -> Path:
    path = folder / "tasks.jsonl"
    rows = [
        {"task_id": f"t{i}", "prompt": "hi", "environment": e} for i, e in enumerate(environments)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def config_file(folder: Path, **data: Any) -> Path:
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def refused(code: int, output: str, exception: BaseException | None, starts: list[str]) -> str:
    """The error line of a run the checks refused: exit 2, nothing started."""
    assert code == 2 and starts == [] and not isinstance(exception, Started), output
    return one_error_line(output)


Run = Callable[..., subprocess.CompletedProcess]


def process_runner(folder: Path, prefix: list[str]) -> Run:
    """Runs the real ``rayrollout collect ARGS`` (after ``prefix``), without ``RAY_ADDRESS``
    or ``OPENAI_API_KEY``, with Ray's temporary folder at ``folder/ray-tmp``: a Ray that
    started would have made it."""

    def run(*args: Any) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "OPENAI_API_KEY")}
        env.update(HOME=str(folder), RAY_TMPDIR=str(folder / "ray-tmp"))
        command = [*prefix, str(RAYROLLOUT), "collect", *(str(a) for a in args)]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)

    return run


@pytest.fixture
def real_cli(tmp_path: Path) -> tuple[Path, Run]:
    """A folder and the real ``rayrollout`` run as this user (``process_runner``)."""
    return tmp_path, process_runner(tmp_path, [])


@pytest.fixture
def other_user(tmp_path: Path) -> Iterator[tuple[Path, Run]]:
    """A folder and the real ``rayrollout`` run as a user that file modes bind: this one,
    unless it is root (root reads and writes whatever the mode says); then ``nobody``
    through ``setpriv``, in a folder that user can reach."""
    if os.geteuid() != 0:
        yield tmp_path, process_runner(tmp_path, [])
        return
    if not shutil.which("setpriv"):
        pytest.skip("root ignores file modes, and setpriv is missing to drop to nobody")
    folder = Path(tempfile.mkdtemp(prefix="rr-preflight-"))
    folder.chmod(0o777)
    try:
        yield (
            folder,
            process_runner(folder, ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]),
        )
    finally:
        shutil.rmtree(folder)  # root removes whatever the modes say


def refused_in_a_process(run: subprocess.CompletedProcess, folder: Path) -> str:
    """The error line of a real ``rayrollout`` the checks refused: exit 2, Ray never started."""
    assert run.returncode == 2, run.stderr
    assert not (folder / "ray-tmp").exists(), "Ray started"
    return one_error_line(run.stderr)


# The tasks path.


def test_a_directory_without_task_shards_is_one_line_saying_what_a_shard_set_is(tmp_path, starts):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a shard")
    line = refused(*collect(folder, "--out", tmp_path / "out"), starts)
    assert f"no task shards in {folder}: a shard set is a directory or a glob of" in line
    tasks_file(folder, "weather")  # now a shard set of one: it reaches the start
    code, output, exception = collect(folder, "--out", tmp_path / "out")
    assert isinstance(exception, Started), output


def test_a_tasks_file_without_rows_is_one_notice_and_exit_0(tmp_path, starts):
    for text in ("", "\n  \n\n"):
        tasks = tmp_path / "empty.jsonl"
        tasks.write_text(text)
        code, output, exception = collect(tasks, "--out", tmp_path / "out")
        assert code == 0 and exception is None, output
        assert output.strip().splitlines() == [
            f"nothing to run: {tasks} has no tasks (not one row); nothing was started and no "
            "output folder was made"
        ]
        assert starts == [] and not (tmp_path / "out").exists()


def test_the_real_command_on_a_file_without_rows_starts_no_ray(real_cli):
    folder, run = real_cli
    tasks = folder / "empty.jsonl"
    tasks.write_text("")
    completed = run(tasks, "--out", folder / "out")
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr.startswith(f"nothing to run: {tasks} has no tasks"), completed.stderr
    assert not (folder / "ray-tmp").exists() and not (folder / "out").exists()


def test_python_collect_of_a_file_without_rows_starts_nothing(tmp_path, starts):
    tasks = tmp_path / "empty.jsonl"
    tasks.write_text("")
    engine = RolloutEngine({"output": {"dir": str(tmp_path / "out")}})
    result = engine.collect(tasks)
    assert result.summary.rows_written == 0 and result.trajectories() == []
    assert starts == [] and engine.engine is None and not (tmp_path / "out").exists()


# The output folder.


def test_an_output_folder_that_is_a_file_is_refused(tmp_path, starts):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    tasks = tasks_file(tmp_path, "weather")
    line = refused(*collect(tasks, "--out", blocker), starts)
    assert f"output folder {blocker} is a file, not a folder: pass another --out" in line
    line = refused(*collect(tasks, "--out", blocker / "deeper" / "out"), starts)
    assert f"cannot create output folder {blocker / 'deeper' / 'out'}: {blocker} is a file" in line


def test_an_output_folder_that_cannot_be_written_or_made_is_refused(other_user):
    folder, run = other_user
    tasks = tasks_file(folder, "weather")
    locked = folder / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    line = refused_in_a_process(run(tasks, "--out", locked), folder)
    assert f"output folder {locked} is not writable (Permission denied)" in line
    assert "pass another --out" in line
    line = refused_in_a_process(run(tasks, "--out", locked / "run1"), folder)
    assert f"cannot create output folder {locked / 'run1'}: {locked} refuses a new folder" in line
    assert list(locked.iterdir()) == []  # the checks left nothing behind


def test_an_unreadable_tasks_file_is_refused(other_user):
    folder, run = other_user
    tasks = tasks_file(folder, "weather")
    tasks.chmod(0o000)
    line = refused_in_a_process(run(tasks, "--out", folder / "out"), folder)
    assert f"cannot read tasks file {tasks}: Permission denied" in line
    assert not (folder / "out").exists()


# Environment names.


def test_an_unknown_env_flag_is_refused_even_when_every_row_names_its_own(tmp_path, starts):
    tasks = tasks_file(tmp_path, "weather", "weather")
    config = config_file(tmp_path, environments={"echo": {"path": "fixture_envs:EchoEnv"}})
    args = (tasks, "--env", "atlantis", "--out", tmp_path / "out", "--config", config)
    line = refused(*collect(*args), starts)
    assert "unknown environment 'atlantis' in --env" in line
    known = line.split("Known environments: ")[1].split(" (")[0].split(", ")
    assert {"weather", "math", "echo"} <= set(known)  # the registry's and the config's
    assert "atlantis" not in known


def test_rows_naming_an_unknown_environment_list_the_known_ones(tmp_path, starts):
    tasks = tasks_file(tmp_path, "weather", "atlantis")
    code, output, exception = collect(tasks, "--out", tmp_path / "out")
    assert "1 invalid row(s)" in refused(code, output, exception, starts)
    assert "tasks.jsonl line 2, field 'environment': unknown environment 'atlantis'" in output
    assert "Known environments: " in output and "weather" in output.split("Known")[1]
    assert not (tmp_path / "out").exists()


# Environments this machine cannot run.


class NeedsFrobnicator(Environment):
    """An environment that needs a system package this machine lacks."""

    async def verify(self, episode: Episode) -> Verification:
        return Verification(reward=1.0)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return "it needs the frobnicator: apt-get install frobnicator"


NEEDY = {"environments": {"needy": {"path": "test_preflight:NeedsFrobnicator"}}}


def test_rows_naming_an_environment_this_machine_cannot_run_are_one_line_naming_the_fix(
    tmp_path, starts
):
    tasks = tasks_file(tmp_path, "weather", "needy", "needy")
    config = config_file(tmp_path, **NEEDY)
    for flags in ((), ("--skip-invalid",)):  # the machine's problem, never one row's
        line = refused(
            *collect(tasks, "--out", tmp_path / "out", "--config", config, *flags), starts
        )
        assert line == (
            "error: environment 'needy' cannot run on this machine: it needs the frobnicator: "
            "apt-get install frobnicator. Nothing was started"
        )
    assert not (tmp_path / "out").exists()


def test_an_environment_that_cannot_run_here_is_not_asked_when_the_run_joins_a_cluster(
    tmp_path, starts, monkeypatch
):
    tasks = tasks_file(tmp_path, "needy")
    config = config_file(tmp_path, **NEEDY)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # its replicas run on the cluster's nodes
    code, output, exception = collect(tasks, "--out", tmp_path / "out", "--config", config)
    assert isinstance(exception, Started), output


def test_the_real_command_refuses_code_tasks_without_bubblewrap_before_ray_starts(
    real_cli, monkeypatch
):
    """The code environment's sandbox needs bubblewrap: hidden from ``PATH`` here (CI has it)."""
    folder, run = real_cli
    monkeypatch.setenv("PATH", path_without("bwrap", folder / "bin"))
    tasks = ROOT / "rayrollout" / "environments" / "code" / "tasks.jsonl"
    line = refused_in_a_process(run(tasks, "--policy", "scripted", "--out", folder / "out"), folder)
    assert line.startswith("error: environment 'code' cannot run on this machine: ")
    assert "`bwrap` is not on PATH" in line and "(`apt-get install bubblewrap`)" in line
    assert not (folder / "out").exists()


# Agent names.


def agent_rows(folder: Path, *agents: str | None) -> Path:
    """Weather rows, the i-th naming ``agents[i]`` (None: no agent field)."""
    path = folder / "tasks.jsonl"
    rows = [
        {"task_id": f"t{i}", "prompt": "hi", "environment": "weather"} | ({"agent": a} if a else {})
        for i, a in enumerate(agents)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_an_unknown_agent_flag_is_refused_even_when_every_row_names_its_own(tmp_path, starts):
    tasks = agent_rows(tmp_path, "tool_loop", "tool_loop")
    config = config_file(tmp_path, agent_settings={"once": {"path": "fixture_agents:answer_once"}})
    args = (tasks, "--agent", "nope", "--out", tmp_path / "out", "--config", config)
    line = refused(*collect(*args), starts)
    assert "unknown agent 'nope' in --agent (the config's 'agent')" in line
    known = line.split("Known agents: ")[1].split(" (")[0].split(", ")
    assert {"tool_loop", "once"} <= set(known)  # the registry's and the config's
    assert "to add one, register it under the 'rayrollout.agents' entry point" in line


def test_rows_naming_an_unknown_agent_are_one_line_naming_them(tmp_path, starts):
    tasks = agent_rows(tmp_path, None, "nope", "nope", "tool_loop")
    for flags in ((), ("--skip-invalid",)):  # a missing agent is the run's, not a row's
        line = refused(*collect(tasks, "--out", tmp_path / "out", *flags), starts)
        assert (
            "unknown agent 'nope' in the 'agent' field of 2 row(s) of tasks.jsonl "
            "(first: task_id 't1')"
        ) in line
        assert "Known agents: " in line and "tool_loop" in line.split("Known agents: ")[1]
    assert not (tmp_path / "out").exists()


def test_an_agent_path_that_does_not_import_is_refused_naming_it(tmp_path, starts):
    tasks = agent_rows(tmp_path, "no_such_module:Agent")
    line = refused(*collect(tasks, "--out", tmp_path / "out"), starts)
    assert "agent 'no_such_module:Agent' in the 'agent' field of 1 row(s)" in line
    assert "cannot import agent 'no_such_module:Agent': No module named" in line
    line = refused(*collect(tasks, "--agent", "fixture_envs:EchoEnv"), starts)
    assert "'fixture_envs:EchoEnv' is not a subclass of rayrollout.agentkit.Agent" in line


def test_known_agents_by_name_config_or_path_are_let_through(tmp_path, starts):
    tasks = agent_rows(tmp_path, "tool_loop", "once", "fixture_agents:Raises", None)
    config = config_file(tmp_path, agent_settings={"once": {"path": "fixture_agents:answer_once"}})
    code, output, exception = collect(
        tasks, "--agent", "once", "--out", tmp_path / "out", "--config", config
    )
    assert isinstance(exception, Started), output


def test_python_collect_of_a_file_checks_its_agents_and_rows_in_memory_do_not(tmp_path, starts):
    from rayrollout.agentkit.registry import UnknownAgentError

    engine = RolloutEngine({"output": {"dir": str(tmp_path / "out")}})
    with pytest.raises(UnknownAgentError, match="unknown agent 'nope' in the 'agent' field"):
        engine.collect(agent_rows(tmp_path, "nope"))
    assert starts == []
    with pytest.raises(Started):  # in memory: the row's own episode will fail, not the run
        engine.collect([{"prompt": "hi", "environment": "weather", "agent": "nope"}])


def test_the_real_command_refuses_an_unknown_agent_before_ray_starts(real_cli):
    folder, run = real_cli
    tasks = agent_rows(folder, None)
    line = refused_in_a_process(run(tasks, "--agent", "nope", "--out", folder / "out"), folder)
    assert "unknown agent 'nope' in --agent" in line
    assert not (folder / "out").exists()


# Environment sources: what each can check of its args and rows before the start.

NEAR_IDS = [f"aaa:{i}" for i in range(6)] + [
    "game:GuessTheNumber-v0-easy",
    "game:GuessTheNumber-v0-hard",
    "game:Mastermind-v0-easy",
    "rg:leg_counting",
]


def source_rows(folder: Path, environment: str, *fields: dict[str, Any]) -> Path:
    """Rows of ``environment``, the i-th with ``fields[i]`` (an id, a seed) added."""
    path = folder / "tasks.jsonl"
    rows = [
        {"task_id": f"t{i}", "prompt": "hi", "environment": environment, **extra}
        for i, extra in enumerate(fields)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def gem_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """GEM as installed, with the registry ``NEAR_IDS`` (GEM itself needs a venv of its own)."""
    from rayrollout.envkit.reset_step.gem import GemEnvironment

    monkeypatch.setattr(GemEnvironment, "unavailable_reason", classmethod(lambda cls: None))
    monkeypatch.setattr(GemEnvironment, "known_ids", classmethod(lambda cls: NEAR_IDS))


def test_a_gem_id_that_is_not_registered_is_one_line_with_the_nearest_ids(
    tmp_path, starts, gem_registry
):
    good, wrong = (
        {"env_id": "game:GuessTheNumber-v0-easy"},
        {"env_id": "game:GuessTheNumbr-v0-easy"},
    )
    tasks = source_rows(tmp_path, "gem", good, wrong, wrong)
    for flags in ((), ("--skip-invalid",)):  # every row sharing the id would fail: the run's
        line = refused(*collect(tasks, "--out", tmp_path / "out", *flags), starts)
        assert line.startswith(
            "error: environment 'gem': GEM environment id 'game:GuessTheNumbr-v0-easy' is not "
            "registered; did you mean 'game:GuessTheNumber-v0-easy'"
        )
        assert "aaa:" not in line  # the near match, not the first ids alphabetically
        assert line.endswith("(2 row(s) of tasks.jsonl, first: task_id 't1'). Nothing was started")
    assert not (tmp_path / "out").exists()


def test_a_gem_id_in_the_config_and_a_bad_seed_in_a_row_are_refused(tmp_path, starts, gem_registry):
    source = "rayrollout.envkit.reset_step.gem:GemEnvironment"
    config = config_file(
        tmp_path,
        environments={"guess": {"path": source, "args": {"env_id": "game:Mastermnd-v0-easy"}}},
    )
    tasks = source_rows(tmp_path, "guess", {})
    line = refused(*collect(tasks, "--out", tmp_path / "out", "--config", config), starts)
    assert "environment 'guess': GEM environment id 'game:Mastermnd-v0-easy'" in line
    assert "did you mean 'game:Mastermind-v0-easy'" in line  # the nearest first
    tasks = source_rows(tmp_path, "gem", {"env_id": "game:GuessTheNumber-v0-easy", "seed": -3})
    line = refused(*collect(tasks, "--out", tmp_path / "out"), starts)
    assert "the seed must be a whole number >= 0 (GEM's own rule), got -3" in line


def test_gem_rows_with_registered_ids_reach_the_start(tmp_path, starts, gem_registry):
    tasks = source_rows(tmp_path, "gem", {"env_id": "game:GuessTheNumber-v0-easy", "seed": 3})
    code, output, exception = collect(tasks, "--out", tmp_path / "out")
    assert isinstance(exception, Started), output


def test_gem_not_installed_is_one_line_naming_the_extra(tmp_path, starts):
    if importlib.util.find_spec("gem") is not None:
        pytest.skip("GEM is installed here")
    tasks = source_rows(tmp_path, "gem", {"env_id": "game:GuessTheNumber-v0-easy"})
    line = refused(*collect(tasks, "--out", tmp_path / "out"), starts)
    assert line == (
        "error: environment 'gem' cannot run on this machine: the 'gem' package (GEM) is not "
        "installed; pip install 'rayrollout[gem]'. Nothing was started"
    )


def test_a_skyrl_gym_env_class_that_is_not_registered_is_one_line_with_the_nearest(
    tmp_path, starts
):
    pytest.importorskip("skyrl_gym", reason="skyrl-gym is not installed")
    good, wrong = {"env_class": "gsm8k"}, {"env_class": "gsm8k_multiturn"}
    tasks = source_rows(tmp_path, "skyrl_gym", good, wrong)
    line = refused(*collect(tasks, "--out", tmp_path / "out"), starts)
    assert line == (
        "error: environment 'skyrl_gym': skyrl-gym environment id 'gsm8k_multiturn' is not "
        "registered; did you mean 'gsm8k_multi_turn'? (1 row(s) of tasks.jsonl, first: "
        "task_id 't1'). Nothing was started"
    )
    tasks = source_rows(tmp_path, "skyrl_gym", {})  # no env_class, no env_id argument
    line = refused(*collect(tasks, "--out", tmp_path / "out"), starts)
    assert "no id; give the rows the field 'env_class' or set environments.NAME.args.env_id" in line


def test_a_skyrl_gym_env_id_in_the_config_that_is_not_registered_is_refused(tmp_path, starts):
    pytest.importorskip("skyrl_gym", reason="skyrl-gym is not installed")
    source = "rayrollout.envkit.reset_step.skyrl_gym:SkyrlGymEnvironment"
    config = config_file(
        tmp_path, environments={"sql": {"path": source, "args": {"env_id": "text2sq"}}}
    )
    line = refused(
        *collect(source_rows(tmp_path, "sql", {}), "--out", tmp_path / "out", "--config", config),
        starts,
    )
    assert line == (
        "error: environment 'sql': skyrl-gym environment id 'text2sq' is not registered; did "
        "you mean 'text2sql'? Nothing was started"
    )


OPENENV = "rayrollout.envkit.openenv:OpenEnvEnvironment"


def openenv_config(folder: Path, **args: Any) -> Path:
    return config_file(folder, environments={"counter": {"path": OPENENV, "args": args}})


def test_an_openenv_url_that_does_not_answer_or_is_no_openenv_server_is_refused(tmp_path, starts):
    tasks = source_rows(tmp_path, "counter", {})
    port = free_port()
    config = openenv_config(tmp_path, url=f"http://127.0.0.1:{port}")
    line = refused(*collect(tasks, "--out", tmp_path / "out", "--config", config), starts)
    assert line == (
        f"error: environment 'counter': OpenEnv server at http://127.0.0.1:{port} does not "
        f"answer (GET http://127.0.0.1:{port}/schema: Connection refused): start the server, "
        "or fix environments.NAME.args.url. Nothing was started"
    )
    with Endpoint(status=404) as endpoint:  # an HTTP server, not OpenEnv's
        config = openenv_config(tmp_path, url=endpoint.base_url)
        line = refused(*collect(tasks, "--out", tmp_path / "out", "--config", config), starts)
    assert "answers HTTP 404 to GET /schema: is it an OpenEnv server" in line


def test_an_openenv_class_or_module_that_does_not_import_is_refused_with_the_nearest_name(
    tmp_path, starts
):
    pytest.importorskip("openenv", reason="OpenEnv is not installed")
    tasks = source_rows(tmp_path, "counter", {})
    config = openenv_config(tmp_path, env_class="openenv_envs:CountEnv")
    line = refused(*collect(tasks, "--out", tmp_path / "out", "--config", config), starts)
    assert line == (
        "error: environment 'counter': OpenEnv env_class 'openenv_envs:CountEnv': module "
        "'openenv_envs' has no 'CountEnv'; did you mean 'openenv_envs:CounterEnv'? Nothing was "
        "started"
    )
    config = openenv_config(tmp_path, env_class="openenv_env:CounterEnv")
    line = refused(*collect(tasks, "--out", tmp_path / "out", "--config", config), starts)
    assert "env_class 'openenv_env:CounterEnv' cannot be imported: ModuleNotFoundError" in line
    config = openenv_config(tmp_path, env_class="openenv_envs:GuessAction")
    line = refused(*collect(tasks, "--out", tmp_path / "out", "--config", config), starts)
    assert "is not a subclass of OpenEnv's Environment" in line
    config = openenv_config(tmp_path, env_class="openenv_envs:CounterEnv")
    code, output, exception = collect(tasks, "--out", tmp_path / "out", "--config", config)
    assert isinstance(exception, Started), output


def test_an_openenv_class_without_the_openenv_package_names_the_extra(
    tmp_path, starts, monkeypatch
):
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:  # openenv uninstalled, for this process
        return None if name == "openenv" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    tasks = source_rows(tmp_path, "counter", {})
    config = openenv_config(tmp_path, env_class="openenv_envs:CounterEnv")
    line = refused(*collect(tasks, "--out", tmp_path / "out", "--config", config), starts)
    assert line == (
        "error: environment 'counter': OpenEnv environment openenv_envs:CounterEnv: the "
        "'openenv' package is not installed; pip install 'rayrollout[openenv]'. Nothing was "
        "started"
    )


def test_the_args_of_an_environment_are_not_probed_when_the_run_joins_a_cluster(
    tmp_path, starts, monkeypatch
):
    tasks = source_rows(tmp_path, "counter", {})
    config = openenv_config(tmp_path, url=f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # the cluster's nodes reach the server
    code, output, exception = collect(tasks, "--out", tmp_path / "out", "--config", config)
    assert isinstance(exception, Started), output


def test_verifiers_rows_without_verifiers_installed_are_one_line(tmp_path, starts):
    if importlib.util.find_spec("verifiers") is not None:
        pytest.skip("verifiers is installed here")
    tasks = source_rows(tmp_path, "verifiers", {"vf_env": "my_tool_env"})
    line = refused(*collect(tasks, "--out", tmp_path / "out"), starts)
    assert line.startswith("error: environment 'verifiers' cannot run on this machine: ")
    assert "pip install 'rayrollout[verifiers]'" in line


def test_a_row_past_the_head_naming_an_unknown_id_stops_the_run_naming_its_line(gem_registry):
    from rayrollout.api.collect_plan import TaskCheck
    from rayrollout.api.preflight import EnvironmentCheckError
    from rayrollout.data.schema import Task

    check = TaskCheck(RunConfig(), head=[])
    fields = {"env_id": "game:GuessTheNumber-v0-easy"}
    prompt = [{"role": "user", "content": "hi"}]
    row = {"task_id": "t", "prompt": prompt, "environment": "gem", "fields": fields}
    check(Task.model_validate(row), "tasks.jsonl line 1500")  # a registered id passes
    row["fields"] = {"env_id": "game:GuessTheNumbr-v0-easy"}
    with pytest.raises(EnvironmentCheckError, match="at tasks.jsonl line 1501: GEM environment"):
        check(Task.model_validate(row), "tasks.jsonl line 1501")


# An external policy: its key and one probe of its endpoint.


class Endpoint:
    """A tiny OpenAI-ish server on 127.0.0.1: ``GET /v1/models`` answers ``status`` with
    ``models`` listed; records each request's path and Authorization header."""

    def __init__(
        self, status: int = 200, models: tuple[str, ...] = (), slow_first_s: float = 0.0
    ) -> None:
        self.requests: list[tuple[str, str | None]] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the http.server name)
                endpoint.requests.append((self.path, self.headers.get("Authorization")))
                if len(endpoint.requests) == 1:
                    time.sleep(slow_first_s)  # a busy server: the first answer comes late
                answer, body = endpoint.answer(self.path)
                data = json.dumps(body).encode()
                self.send_response(answer)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.status, self.models = status, models
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, path: str) -> tuple[int, dict[str, Any]]:
        if path != "/v1/models":
            return 404, {"error": {"message": "no such route"}}
        if self.status != 200:
            return self.status, {"error": {"message": "invalid key"}}
        return 200, {"object": "list", "data": [{"id": m} for m in self.models]}

    def __enter__(self) -> Endpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def external(tmp_path: Path, base_url: str, *flags: Any, model: str = "m1") -> tuple:
    tasks = tasks_file(tmp_path, "weather")
    return (tasks, "--out", tmp_path / "out", "--base-url", base_url, "--model", model, *flags)


def test_no_key_names_the_variable_to_set_and_how_to_say_none_is_needed(
    tmp_path, starts, monkeypatch
):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with Endpoint(models=("m1",)) as endpoint:
        line = refused(*collect(*external(tmp_path, endpoint.base_url)), starts)
        assert f"no API key for the policy at {endpoint.base_url}: set OPENAI_API_KEY" in line
        assert "OPENAI_API_KEY=EMPTY" in line and 'policy.api_key_env: ""' in line
        config = config_file(tmp_path, policy={"api_key_env": "MY_ENDPOINT_KEY"})
        line = refused(*collect(*external(tmp_path, endpoint.base_url, "--config", config)), starts)
        assert "set MY_ENDPOINT_KEY" in line
        assert endpoint.requests == []  # refused before the probe


def test_an_endpoint_that_needs_no_key_says_so_with_an_empty_api_key_env(
    tmp_path, starts, monkeypatch
):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = config_file(tmp_path, policy={"api_key_env": ""})
    with Endpoint(models=("m1", "m2")) as endpoint:
        code, output, exception = collect(
            *external(tmp_path, endpoint.base_url, "--config", config)
        )
    assert isinstance(exception, Started), output  # every check passed: the run starts
    assert endpoint.requests == [("/v1/models", None)]  # probed once, no key sent


def test_a_server_that_is_there_but_slow_to_answer_passes_on_a_patient_second_try():
    """A busy server (vLLM generating on a loaded machine) may list its models late: its
    first probe timing out is followed by one patient try, not a refused run."""
    with Endpoint(models=("m1",), slow_first_s=1.0) as endpoint:
        config = RunConfig.model_validate(
            {"policy": {"base_url": endpoint.base_url, "model": "m1", "api_key_env": ""}}
        )
        probe_policy(config, None, timeout_s=0.2)
    assert [path for path, _ in endpoint.requests] == ["/v1/models", "/v1/models"]


def test_nothing_listening_is_refused_before_ray_starts(real_cli):
    folder, run = real_cli
    base_url = f"http://127.0.0.1:{free_port()}/v1"  # bound once, closed: nothing listens
    tasks = tasks_file(folder, "weather")
    config = config_file(folder, policy={"api_key_env": ""})  # no key, none needed
    completed = run(tasks, "--out", folder / "out", "--base-url", base_url, "--config", config)
    line = refused_in_a_process(completed, folder)
    assert f"the policy endpoint {base_url} does not answer" in line
    assert "Connection refused" in line and "pass the right --base-url" in line
    assert not (folder / "out").exists()


def test_a_key_the_endpoint_refuses_is_refused_without_showing_the_key(
    tmp_path, starts, monkeypatch
):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    for status in (401, 403):
        with Endpoint(status=status) as endpoint:
            code, output, exception = collect(*external(tmp_path, endpoint.base_url))
        line = refused(code, output, exception, starts)
        assert f"the policy endpoint {endpoint.base_url} refused the API key" in line
        assert f"in OPENAI_API_KEY (HTTP {status} on GET /models)" in line
        assert endpoint.requests == [("/v1/models", f"Bearer {KEY}")]
        assert KEY not in output


def test_a_model_the_endpoint_does_not_list_is_refused_naming_those_it_does(
    tmp_path, starts, monkeypatch
):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with Endpoint(models=("qwen-7b", "llama-8b")) as endpoint:
        line = refused(*collect(*external(tmp_path, endpoint.base_url, model="gpt-x")), starts)
        assert f"model 'gpt-x' is not served at {endpoint.base_url}" in line
        assert "(GET /models lists qwen-7b, llama-8b): pass --model with one of them" in line
        code, output, exception = collect(*external(tmp_path, endpoint.base_url, model="qwen-7b"))
        assert isinstance(exception, Started), output
    assert starts == [str(tmp_path / "out")]


def test_an_endpoint_without_a_models_route_is_let_through(tmp_path, starts, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with Endpoint(models=("m1",)) as endpoint:  # answers 404 anywhere but /v1/models
        code, output, exception = collect(*external(tmp_path, f"{endpoint.base_url}/x"))
    assert isinstance(exception, Started), output
    assert endpoint.requests == [("/v1/x/models", f"Bearer {KEY}")]


def test_python_collect_probes_the_endpoint_and_needs_a_key_only_if_it_is_refused(
    tmp_path, starts, monkeypatch
):
    from rayrollout.api.preflight import PolicyCheckError

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    tasks = tasks_file(tmp_path, "weather")
    for status, outcome in ((401, PolicyCheckError), (200, Started)):
        with Endpoint(status=status, models=("m1",)) as endpoint:
            policy = {"kind": "openai", "base_url": endpoint.base_url, "model": "m1"}
            engine = RolloutEngine({"policy": policy, "output": {"dir": str(tmp_path / "out")}})
            with pytest.raises(outcome) as caught:
                engine.collect(tasks)
        if outcome is PolicyCheckError:
            assert "needs an API key (HTTP 401 on GET /models, none was sent): set " in str(
                caught.value
            )
            assert "OPENAI_API_KEY" in str(caught.value) and starts == []
    assert len(starts) == 1  # the keyless server that answered: the run starts


# Agents' settings: each agent the rows will be played by binds its args before the run.


def test_rows_naming_an_agent_whose_required_args_are_not_set_are_one_line_naming_the_key(
    tmp_path, starts
):
    # A NeMo Gym row whose prompt NeMo Gym's own agent writes is played by `nemo_gym`.
    row = {"task_id": "g1", "environment": "weather", "responses_create_params": {"input": []}}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(row) + "\n")
    line = refused(*collect(tasks, "--out", tmp_path / "out"), starts)
    print(f"\nNEMO_GYM ROW {line}")
    assert "agent 'nemo_gym'" in line and "needs 'url', 'gateway_port'" in line
    assert "set agent_settings.nemo_gym.args.url, agent_settings.nemo_gym.args.gateway_port" in line
    assert "the 'agent' field of 1 row(s) of tasks.jsonl (first: task_id 'g1')" in line
    assert not (tmp_path / "out").exists()
    # Given its settings, the same row reaches the start.
    config = config_file(
        tmp_path,
        agent_settings={"nemo_gym": {"args": {"url": "http://127.0.0.1:1", "gateway_port": 9}}},
    )
    code, output, exception = collect(tasks, "--out", tmp_path / "out", "--config", config)
    assert isinstance(exception, Started), output


def test_the_agent_an_environment_defaults_to_and_the_run_agent_are_checked_too(tmp_path, starts):
    env = "fixture_envs:NemoGymPlayedEnv"
    tasks = tasks_file(tmp_path, env, env)
    line = refused(*collect(tasks, "--out", tmp_path / "out"), starts)
    assert f"the default agent of environment '{env}', playing 2 row(s) of tasks.jsonl" in line
    assert "set agent_settings.nemo_gym.args.url" in line
    # The run's --agent wins over the environment's default: then that one is checked.
    code, output, exception = collect(tasks, "--agent", "tool_loop", "--out", tmp_path / "out")
    assert isinstance(exception, Started), output
    starts.clear()
    config = config_file(tmp_path, agent_settings={"tool_loop": {"args": {"patience": 3}}})
    line = refused(*collect(tasks, "--agent", "tool_loop", "--config", config), starts)
    assert "agent_settings.tool_loop.args ['patience'] do not fit" in line
    assert "--agent (the config's 'agent')" in line


# --env-url alone.


def test_one_env_url_alone_is_the_environment_of_rows_that_name_none(tmp_path, monkeypatch):
    chosen: list[str | None] = []

    def start(self: RolloutEngine, *args: Any, **kwargs: Any) -> RolloutEngine:
        chosen.append(self.config.environment)
        raise Started

    monkeypatch.setattr(RolloutEngine, "_start", start)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"task_id": f"t{i}", "prompt": "hi"}) + "\n" for i in range(2))
    )
    with Endpoint() as server, Endpoint() as other:
        url, other_url = server.base_url.removesuffix("/v1"), other.base_url.removesuffix("/v1")
        out = ("--out", tmp_path / "out")
        code, output, exception = collect(tasks, "--env-url", f"gym={url}", *out)
        assert isinstance(exception, Started) and chosen == ["gym"], output
        # An explicit --env (flag or config) still wins.
        code, output, exception = collect(
            tasks, "--env-url", f"gym={url}", "--env", "weather", *out
        )
        assert isinstance(exception, Started) and chosen[-1] == "weather", output
        config = config_file(tmp_path, environment="weather")
        code, output, exception = collect(
            tasks, "--env-url", f"gym={url}", "--config", config, *out
        )
        assert isinstance(exception, Started) and chosen[-1] == "weather", output
        # Two servers and rows that name neither: which one is the user's to say.
        code, output, exception = collect(
            tasks, "--env-url", f"gym={url}", "--env-url", f"other={other_url}", *out
        )
        assert code == 2 and len(chosen) == 3, output
        print(f"\nTWO URLS {one_error_line(output)}")

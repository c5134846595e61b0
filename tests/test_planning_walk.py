"""One planning pass, measured: the walk of a setting from ``rayrollout collect`` to the workers.

A real ``collect`` (an external scripted policy by ``--base-url``, ``-c 3``) runs with a call
profiler on the driver's main thread. The walk of a setting is the rayrollout functions it is
handed to, in call order, up to ``start_workers`` (the hand-off to the worker actors that use
``concurrency`` and the policy's URL): a function is handed the setting when an argument holds
it (the run's config, the policy's settings, the flags naming it, the value itself, or an
object keeping the config as ``config``); a generator resumed is the call that made it, not
a new one. A method of the config itself only reads it, and is
not a step. Consecutive calls in one module are one stay; a stay in a part of higher rank than
the one before (``test_layers.RANKS``) is a climb back up; a module with two stays is entered
twice. One pass down the layers is at most one climb (the command line takes the loaded
config back from ``data``) and no module entered twice.

``pytest -s tests/test_planning_walk.py`` prints each walk, stay by stay.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from test_layers import PLUGINS, RANKS
from typer.testing import CliRunner

from rayrollout.cli.commands import app
from rayrollout.data.config import PolicyConfig, RunConfig

HANDOFF = ("rayrollout.engine.engine_actor", "start_workers")
"""Where the walk ends: the driver hands the config and the policy's URL to the workers."""


_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _rank(module: str) -> int:
    part = module.split(".")[1]
    return 2 if part in PLUGINS else RANKS[part]


@dataclass
class Walk:
    """The stays of one setting: ``(module, [functions])`` in the order they were entered."""

    stays: list[tuple[str, list[str]]] = field(default_factory=list)

    def add(self, module: str, function: str) -> None:
        if self.stays and self.stays[-1][0] == module:
            self.stays[-1][1].append(function)
        else:
            self.stays.append((module, [function]))

    @property
    def calls(self) -> int:
        return sum(len(functions) for _, functions in self.stays)

    @property
    def files(self) -> int:
        return len({module for module, _ in self.stays})

    @property
    def climbs(self) -> list[tuple[str, str]]:
        return [
            (a, b)
            for (a, _), (b, _) in zip(self.stays, self.stays[1:], strict=False)
            if _rank(b) > _rank(a)
        ]

    @property
    def entered_twice(self) -> dict[str, int]:
        counts = Counter(module for module, _ in self.stays)
        return {module: n for module, n in counts.items() if n > 1}

    def figures(self) -> str:
        return (
            f"{len(self.stays)} stays ({self.calls} calls) in {self.files} files, "
            f"{len(self.climbs)} climbs back up, entered twice: {self.entered_twice or 'none'}"
        )

    def text(self) -> str:
        return "\n".join(f"  {m}: {', '.join(f)}" for m, f in self.stays)


def _holds_concurrency(value: Any) -> bool:
    if isinstance(value, RunConfig):
        return True
    if isinstance(value, dict):
        return "concurrency" in value
    return _keeps_config(value)


def _keeps_config(value: Any) -> bool:
    """An object keeping the run's config as its ``config`` attribute (read from its
    ``__dict__``: a property or ``__getattr__`` of an arbitrary argument is never run)."""
    try:
        kept = object.__getattribute__(value, "__dict__").get("config")
    except AttributeError:
        return False
    return isinstance(kept, RunConfig)


def _holds_base_url(value: Any) -> bool:
    if isinstance(value, (RunConfig, PolicyConfig)):
        return True
    if isinstance(value, dict):
        policy = value.get("policy")
        return "policy__base_url" in value or (isinstance(policy, dict) and "base_url" in policy)
    return _keeps_config(value)


class WalkRecorder:
    """A profiler of the main thread recording each setting's walk up to ``HANDOFF``."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.concurrency, self.policy_url = Walk(), Walk()
        self.done = False
        self._handoff: FrameType | None = None
        self._resumable: list[FrameType] = []  # generators met: a resume is not a new call

    def __enter__(self) -> WalkRecorder:
        self._thread = threading.get_ident()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)

    def _profile(self, frame: FrameType, event: str, arg: object) -> None:
        if self.done or event not in ("call", "return"):
            return
        if event == "return":
            if frame is self._handoff:
                self.done = True
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("rayrollout.") or frame.f_code.co_name.startswith("<"):
            return
        if frame.f_code.co_flags & _RESUMABLE:
            if any(frame is seen for seen in self._resumable):
                return
            self._resumable.append(frame)
        args = _arguments(frame)
        if args is None:  # the config's own method: reading it is not a step
            return
        function = frame.f_code.co_name
        if any(_holds_concurrency(v) for v in args.values()) or _is_int(args.get("concurrency")):
            self.concurrency.add(module, function)
        url = any(type(v) is str and v == self.base_url for v in args.values())
        if url or any(_holds_base_url(v) for v in args.values()):
            self.policy_url.add(module, function)
        if (module, function) == HANDOFF:
            self._handoff = frame


def _is_int(value: object) -> bool:
    return type(value) is int


def _arguments(frame: FrameType) -> dict[str, Any] | None:
    """A call's arguments by name; None for a method of a pydantic model (the config's)."""
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    args = {name: frame.f_locals.get(name) for name in names}
    first = args.get(names[0]) if names else None
    if names and names[0] in ("self", "cls"):
        model = first if isinstance(first, type) else type(first)
        if isinstance(model, type) and issubclass(model, BaseModel):
            return None
    return args


def run_walk(tmp_path: Path, port: int) -> WalkRecorder:
    """``rayrollout collect`` with an external scripted policy, its walks recorded."""
    from ray import serve

    from rayrollout.auth import RouteAuth
    from rayrollout.deployments.scripted import scripted_policy_app

    app_ = scripted_policy_app(model="walk-model", auth=RouteAuth.bearer("sk-walk"))
    serve.run(app_, name="walk-policy", route_prefix="/walk")
    tasks = tmp_path / "tasks.jsonl"
    rows = [{"task_id": f"w{i}", "prompt": f"echo {i}", "environment": "echo"} for i in range(3)]
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "namespace": f"walk-{tmp_path.name}",
                "ray": {"serve_port": port},
                "environments": {"echo": {"path": "fixture_envs:EchoEnv"}},
                "policy": {"api_key_env": "RAYROLLOUT_WALK_KEY"},
            }
        )
    )
    base_url = f"http://127.0.0.1:{port}/walk/v1"
    flags = ["--out", str(tmp_path / "out"), "-c", "3", "--num-workers", "1"]
    flags += ["--model", "walk-model", "--base-url", base_url, "--config", str(config)]
    os.environ["RAYROLLOUT_WALK_KEY"] = "sk-walk"
    try:
        with WalkRecorder(base_url) as recorder:
            result = CliRunner().invoke(app, ["collect", str(tasks), *flags])
    finally:
        serve.delete("walk-policy")
        os.environ.pop("RAYROLLOUT_WALK_KEY", None)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    assert recorder.done, "the walk never reached the workers' hand-off"
    return recorder


@pytest.fixture(scope="module")
def walks(tmp_path_factory, serve_session) -> WalkRecorder:
    """One recorded ``collect``, both settings' walks."""
    return run_walk(tmp_path_factory.mktemp("walk"), serve_session)


PLANNING = (
    "rayrollout.cli.collect",
    "rayrollout.cli.terminal_run",
    "rayrollout.api.collect",
    "rayrollout.api.collect_plan",
    "rayrollout.api.spec_feed",
)
"""The modules whose job is reading, checking and planning the run."""


def _described(walk: Walk, setting: str) -> str:
    described = f"{setting}: {walk.figures()}\n{walk.text()}"
    print(described)
    return described


@pytest.mark.parametrize("setting", ["concurrency", "policy_url"])
def test_a_setting_walks_from_collect_to_the_workers_through_each_planning_module_once(
    walks, setting
):
    walk: Walk = getattr(walks, setting)
    described = _described(walk, setting)
    assert walk.stays[0][0] == "rayrollout.cli.collect", described
    assert any(m == HANDOFF[0] and HANDOFF[1] in f for m, f in walk.stays), described
    assert not set(walk.entered_twice) & set(PLANNING), described
    assert not walk.entered_twice, described
    assert len(walk.stays) <= 12 and len(walk.climbs) <= 2, described


@pytest.mark.parametrize("setting", ["concurrency", "policy_url"])
def test_a_setting_walks_down_in_one_pass(walks, setting):
    walk: Walk = getattr(walks, setting)
    described = _described(walk, setting)
    assert len(walk.climbs) <= 1, described
    assert not walk.entered_twice, described


VLLM_ATTACHED = {"kind": "vllm", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
VLLM_DEPLOYED = {"kind": "vllm", "vllm_config": "rayrollout/deployments/vllm/cpu.yaml"}


@pytest.mark.parametrize(
    ("policy", "refused"),
    [
        (VLLM_ATTACHED, None),
        (VLLM_DEPLOYED, None),
        ({**VLLM_ATTACHED, "vllm_config": "cpu.yaml"}, "not both"),
        ({**VLLM_DEPLOYED, "api": "responses"}, "no /v1/responses"),
    ],
)
def test_the_planner_asks_a_kind_with_checks_without_handing_it_the_config(policy, refused):
    """The walk above runs kind ``openai``, which has no checks of its own; a kind with
    some (``vllm``: its settings model's validators) is asked the same way: no function
    of the policy layer or of a plugin is handed the config, its policy section or a
    setting, whether the kind accepts the section or refuses it."""
    from rayrollout.api.preflight import check_policy_kind
    from rayrollout.data.config import ConfigError

    config = RunConfig.model_validate({"policy": policy})
    handed: list[tuple[str, str]] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        module = frame.f_globals.get("__name__", "")
        if event != "call" or not module.startswith("rayrollout."):
            return
        args = _arguments(frame)
        if args is not None and any(
            _holds_concurrency(v) or _holds_base_url(v) for v in args.values()
        ):
            handed.append((module, frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        if refused is None:
            checked = check_policy_kind(config)
        else:
            with pytest.raises(ConfigError, match=refused):
                check_policy_kind(config)
    finally:
        sys.setprofile(None)
    assert handed == [("rayrollout.api.preflight", "check_policy_kind")]
    if refused is None:
        assert checked.kind.name == "vllm"
        assert checked.deploys is ("vllm_config" in policy)

"""Fast from the first second: ``--help`` and ``import rayrollout`` load no heavy library, and a
run starts only what it needs (no Serve for an external policy with inline or URL
environments). Facts about what is imported or started, never a duration: the seconds are
``benchmarks/startup.py``'s."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

# Libraries that cost seconds to import and that no --help needs.
HEAVY = ("ray", "pyarrow", "pandas", "fastapi", "openai", "transformers", "torch", "vllm")

# Every command's --help, and the app's, in one process: what is loaded after all of them.
_ALL_HELPS = """
import json, sys
from rayrollout.cli.commands import app

helps = [[], ["collect"], ["demo"], ["up"], ["status"], ["down"], ["show"], ["report"],
         ["export"], ["env"], ["env", "list"], ["env", "test"], ["env", "serve"],
         ["env", "nemo-gym-config"], ["env", "tasks"], ["agent"], ["agent", "list"],
         ["agent", "test"]]
for args in helps:
    try:
        app([*args, "--help"], standalone_mode=False)
    except SystemExit:
        pass
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def _loaded(code: str) -> set[str]:
    """Top-level packages loaded by ``code`` run in a fresh interpreter (it prints them)."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_every_help_imports_no_heavy_library():
    loaded = _loaded(_ALL_HELPS)
    assert "typer" in loaded  # the probe saw the app's imports at all
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_the_console_entry_help_imports_no_heavy_library():
    """``python -m rayrollout.cli --help`` as a user runs it: the package, the app, click's
    help text; ``-X importtime`` lists every module the interpreter imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rayrollout.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "collect" in done.stdout  # the help text was printed
    imported = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "rayrollout" in imported
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


def test_import_rayrollout_is_light_and_its_names_still_resolve():
    code = (
        "import json, sys, rayrollout\n"
        "light = sorted({n.split('.')[0] for n in sys.modules})\n"
        "from rayrollout import RolloutEngine, RunConfig, Task\n"
        "from rayrollout.api.rollout_engine import RolloutEngine as Home\n"
        "assert RolloutEngine is Home and RunConfig.__name__ == 'RunConfig', 'wrong object'\n"
        "print(json.dumps(light))\n"
    )
    loaded = _loaded(code)
    assert "rayrollout" in loaded
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_a_worker_loads_no_serve_openai_or_pandas():
    """What a worker actor imports when Ray builds it: Serve (for Serve-hosted environments),
    the openai SDK (the Responses API) wait until a run uses them, and pandas until the first
    rows are built (pyarrow imports it then), so every worker of an inline or URL run is up
    about 0.8 s sooner."""
    code = (
        "import json, sys\n"
        "from rayrollout.engine.worker import WorkerActor, WorkerRunner\n"
        "print(json.dumps(sorted(m for m in sys.modules if m in "
        "('ray.serve', 'openai', 'pandas', 'fastapi'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_an_unknown_name_is_an_attribute_error():
    import rayrollout

    with pytest.raises(AttributeError, match="no_such_name"):
        rayrollout.no_such_name  # noqa: B018
    assert "RolloutEngine" in dir(rayrollout)


def _no_serve(*args: object, **kwargs: object) -> None:
    raise AssertionError("Serve was started for a run that needs none")


# What the driver of `rayrollout collect` imports before it builds the engine
# (rayrollout.cli.collect.run_collect), then the policy kind looked up as the checks do.
_COLLECT_DRIVER = """
import json, sys
from rayrollout.cli.commands import app
from rayrollout.cli.failures import report_failures
from rayrollout.data.config import load_config
from rayrollout.api.collect import plan_collect
from rayrollout.api.rollout_engine import RolloutEngine
from rayrollout.cli.progress import RunProgress
from rayrollout.engine.startup import ensure_ray, prepare_policy
from rayrollout.policy.kinds import policy_kind
policy_kind("openai"), policy_kind("scripted")
print(json.dumps(sorted(m for m in sys.modules if m in ("ray.serve", "fastapi", "pandas"))))
"""


def test_a_collect_driver_loads_no_serve_before_it_deploys():
    """Ray Serve (with FastAPI and pandas, over a second of CPU before Ray starts) loads in
    the driver only on the way to deploying something: never for an external policy with
    inline or URL environments, and not for the checks that look a policy kind up."""
    assert _loaded(_COLLECT_DRIVER) == set()


def test_an_external_policy_starts_no_serve(monkeypatch):
    from ray import serve

    from rayrollout.auth import RouteAuth
    from rayrollout.data.config import RunConfig
    from rayrollout.engine import startup

    monkeypatch.setattr(startup, "ensure_serve", _no_serve)
    monkeypatch.setattr(serve, "run", _no_serve)
    monkeypatch.setattr(serve, "start", _no_serve)
    config = RunConfig.model_validate(
        {"policy": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "m"}}
    )
    assert startup.deploy_policy(config, RouteAuth.bearer("t")) == "http://127.0.0.1:1/v1"


@pytest.mark.parametrize("settings", [{}, {"url": "http://127.0.0.1:1"}])
def test_inline_and_url_environments_deploy_nothing(monkeypatch, settings):
    from ray import serve

    from rayrollout.auth import RouteAuth
    from rayrollout.data.config import RunConfig
    from rayrollout.engine import deploy, startup

    # deploy imports Serve only on the way to deploying: patch where it would be called.
    monkeypatch.setattr(startup, "ensure_serve", _no_serve)
    monkeypatch.setattr(serve, "run", _no_serve)
    monkeypatch.setattr(serve, "start", _no_serve)
    config = RunConfig.model_validate({"environments": {"weather": settings}})
    deployer = deploy.EnvironmentDeployer(config, RouteAuth.bearer("t"))
    asyncio.run(deployer.ensure_all(["weather"]))
    assert deployer.ready == {"weather"}


def test_the_help_names_the_real_rejects_file():
    """``collect --help`` spells the rejects file out so as not to import the output folder."""
    from rayrollout.cli import collect
    from rayrollout.data.run_folder import REJECTS_FILE

    assert collect._REJECTS_FILE == REJECTS_FILE


def test_a_deployed_policy_has_its_url_before_serve_runs_it(monkeypatch):
    """The driver hands the engine the policy's URL while Serve still deploys it
    (``prepare_policy``): nothing starts until the deploy call is made."""
    from ray import serve

    from rayrollout.auth import RouteAuth
    from rayrollout.data.config import RunConfig
    from rayrollout.engine import startup

    monkeypatch.setattr(startup, "ensure_serve", _no_serve)
    monkeypatch.setattr(serve, "run", _no_serve)
    config = RunConfig.model_validate(
        {"namespace": "ns", "policy": {"kind": "scripted"}, "ray": {"serve_port": 8123}}
    )
    url, deploy = startup.prepare_policy(config, RouteAuth.bearer("t"))
    assert url == "http://127.0.0.1:8123/ns/policy/v1"
    assert deploy is not None
    with pytest.raises(AssertionError, match="Serve was started"):
        deploy()


def test_inline_episodes_are_queued_while_a_serve_environment_deploys():
    """The engine's first batch names an inline and a Serve-hosted environment: the inline
    one is settled at once (its episodes go on the queue while the other's replicas start),
    the Serve-hosted one is left to deploy."""
    from rayrollout.auth import RouteAuth
    from rayrollout.data.config import RunConfig
    from rayrollout.engine.deploy import EnvironmentDeployer

    served = {"path": "rayrollout.environments.weather.env:WeatherEnv", "hosting": "serve"}
    config = RunConfig.model_validate({"environments": {"weather": {}, "served": served}})
    deployer = EnvironmentDeployer(config, RouteAuth.bearer("t"))
    assert deployer.to_deploy(["weather", "served", "no_such_env", "weather"]) == {"served"}
    assert deployer.ready == {"weather", "no_such_env"}
    assert deployer.missing(["weather", "served"]) == {"served"}

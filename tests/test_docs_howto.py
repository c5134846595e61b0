"""The how-to pages' code blocks run or load as written.

The pages of the service, the environment sources, OpenEnv, NeMo Gym and the trainers are
read block by block, in order, in an empty folder (docs_blocks.py reads them, as for the
tutorials):

- a block with a title is a file the reader saves: it is written, then checked by its kind
  (a ``.yaml`` file loads through the config loader it is meant for, a ``.jsonl`` file
  through the task reader, a ``.py`` file compiles);
- a ``yaml`` block loads through the loader it is meant for: rayrollout's run config
  (``load_config``, every key checked against the config model), a vLLM deployment file
  (``load_vllm_config``), or NeMo Gym's config of the rollout service's relay (compared with
  what ``service_agent_block`` writes);
- a ``json`` block parses, line by line;
- a ``bash`` block runs in bash, a ``python`` block in this Python, with this venv's scripts
  on PATH, and must exit 0.

A block the default tier cannot run (an install, a command that needs a model server, a
GPU, NeMo Gym or a trainer's own venv) carries ``<!-- docs-test: skip (why) -->`` on the
line before it; its Python still compiles and its bash still parses (``bash -n``). A block
that needs an optional extra carries ``<!-- docs-test: requires MODULE -->`` and runs where
that module is installed. Any other block fails the test, so a page cannot grow a command
that nothing checks.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from docs_blocks import Block, blocks, reader_environment, run_block, save_block

ROOT = Path(__file__).resolve().parents[1]
HOW_TO = ROOT / "docs" / "how-to"
PAGES = [
    "service.md",
    "environment-sources.md",
    "openenv.md",
    "nemo-gym.md",
    "trainers.md",
    "verl.md",
]
NEMO_GYM_SERVER_KINDS = {
    "resources_servers",
    "responses_api_agents",
    "responses_api_models",
    "environment_servers",
}


def check_yaml(text: str, folder: Path, where: str) -> str:
    """Load one YAML block through the loader it is meant for; return which one it was."""
    from rayrollout.data.config import load_config
    from rayrollout.deployments.vllm.app import load_vllm_config

    data = yaml.safe_load(text)
    assert isinstance(data, dict), f"{where}: a YAML block that is not a mapping"
    probe = folder / ".docs-test-block.yaml"
    probe.write_text(text, encoding="utf-8")
    try:
        if "model_id" in data or "model_source" in data:
            load_vllm_config(probe)
            return "vllm"
        if all(isinstance(v, dict) and set(v) & NEMO_GYM_SERVER_KINDS for v in data.values()):
            check_nemo_gym_config(data, where)
            return "nemo_gym"
        config = load_config(probe)
    finally:
        probe.unlink()
    from rayrollout.api.preflight import check_policy_kind

    check_policy_kind(config)  # the kind's own keys (vllm_config), checked by the kind
    vllm_config = config.policy.settings.get("vllm_config")
    if vllm_config is not None:  # the deployment file a page names must load too
        deployment = folder / vllm_config
        assert deployment.is_file(), (
            f"{where}: policy.vllm_config names {vllm_config}, which no block before it saves"
        )
        load_vllm_config(deployment)
    return "run"


def check_nemo_gym_config(data: dict[str, Any], where: str) -> None:
    """A page's NeMo Gym config of the service's relay is what ``service_agent_block``
    writes for the same settings (its ``description`` aside)."""
    from rayrollout.envkit.nemo_gym.ng_run_config import AGENT_FOLDER, service_agent_block

    for name, servers in data.items():
        relay = servers.get("responses_api_agents", {}).get(AGENT_FOLDER)
        if relay is None:
            continue
        written = service_agent_block(
            name, relay["url"], relay.get("token_file"), relay.get("host", "127.0.0.1")
        )
        written[name]["responses_api_agents"][AGENT_FOLDER].pop("description")
        expected = {key: data.get(key) for key in written}
        assert expected == written, f"{where}: the relay's config differs from service_agent_block"
        return
    raise AssertionError(f"{where}: a NeMo Gym config without the rayrollout_service relay")


def check_file(path: Path, where: str) -> None:
    """A saved file, checked by its kind."""
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        check_yaml(text, path.parent, where)
    elif path.suffix == ".jsonl":
        from rayrollout.data.tasks import read_tasks

        assert list(read_tasks(path, default_environment="docs")), f"{where}: no task rows"
    elif path.suffix == ".py":
        compile(text, str(path), "exec")
    elif path.suffix == ".json":
        json.loads(text)
    else:
        raise AssertionError(f"{where}: a file {path.name} of a kind this test cannot check")


def check_skipped(block: Block, where: str) -> None:
    """A skipped block says why, and its code still parses."""
    assert block.skip_reason, (
        f"{where}: a docs-test skip without a reason: <!-- docs-test: skip (why) -->"
    )
    if block.language == "python":
        compile(block.code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    elif block.language == "bash":
        done = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
        assert done.returncode == 0, f"{where}: bash cannot parse it: {done.stderr}"
    elif block.language == "yaml":
        yaml.safe_load(block.code)


def play_page(path: Path, folder: Path) -> dict[str, int]:
    """Every block of a page, in order, in ``folder``; returns how many blocks went which
    way (run, loaded, written, skipped)."""
    env = reader_environment()
    counts = {"run": 0, "loaded": 0, "written": 0, "skipped": 0}
    for block in blocks(path):
        where = f"{path.name} line {block.line}"
        if block.requires and importlib.util.find_spec(block.requires) is None:
            block.skip_reason = f"{block.requires} is not installed"
            block.skipped = True
        if block.skipped:
            check_skipped(block, where)
            counts["skipped"] += 1
            continue
        if block.title is not None:
            check_file(save_block(block, folder), where)
            counts["written"] += 1
            continue
        if block.language == "yaml":
            check_yaml(block.code, folder, where)
            counts["loaded"] += 1
            continue
        if block.language == "json":
            for line in block.code.splitlines():
                if line.strip():
                    json.loads(line)
            counts["loaded"] += 1
            continue
        if not run_block(block, folder, env, where, timeout=300):
            raise AssertionError(
                f"{where}: a {block.language or 'plain'} block this test can neither run nor "
                "load; give it a title, or a <!-- docs-test: skip (why) --> comment"
            )
        counts["run"] += 1
    return counts


@pytest.mark.parametrize("name", PAGES)
def test_the_how_to_page_runs_or_loads_as_written(name, tmp_path):
    counts = play_page(HOW_TO / name, tmp_path)
    assert sum(counts.values()) > 0
    # Every page keeps something checked beyond parsing: a file saved, a config loaded or a
    # command run.
    assert counts["run"] + counts["loaded"] + counts["written"] > 0, counts


def test_each_trainer_section_names_its_install_and_a_run_config(tmp_path):
    page = (HOW_TO / "trainers.md").read_text(encoding="utf-8")
    sections = {s.split("\n", 1)[0].strip(): s for s in page.split("\n## ")[1:]}
    for trainer in ("SkyRL", "TRL", "OpenRLHF"):
        section = sections[trainer]
        assert "pip install" in section, f"{trainer}: no install line"
        assert 'title="run.yaml"' in section, f"{trainer}: no run.yaml"
    assert "verl.md" in sections["verl"]
    verl = (HOW_TO / "verl.md").read_text(encoding="utf-8")
    assert "pip install" in verl and 'title="run.yaml"' in verl


def test_an_unmarked_block_that_cannot_run_fails_and_a_marked_one_parses(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```text\nsome output\n```\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="can neither run nor load"):
        play_page(page, tmp_path)
    page.write_text("<!-- docs-test: skip -->\n```bash\nnvidia-smi\n```\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="without a reason"):
        play_page(page, tmp_path)
    page.write_text(
        "<!-- docs-test: skip (needs a GPU) -->\n```python\nprint(1\n```\n", encoding="utf-8"
    )
    with pytest.raises(SyntaxError):
        play_page(page, tmp_path)
    page.write_text(
        "<!-- docs-test: skip (needs a GPU) -->\n```bash\nnvidia-smi\n```\n", encoding="utf-8"
    )
    assert play_page(page, tmp_path)["skipped"] == 1
    page.write_text(
        "<!-- docs-test: requires no_such_module_here -->\n```bash\nexit 1\n```\n",
        encoding="utf-8",
    )
    assert play_page(page, tmp_path)["skipped"] == 1
    page.write_text("<!-- docs-test: requires json -->\n```bash\nexit 1\n```\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="exited 1"):
        play_page(page, tmp_path)


def test_a_yaml_block_with_a_key_the_config_model_lacks_fails(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```yaml\nepisode:\n  max_turn: 4\n```\n", encoding="utf-8")
    with pytest.raises(Exception, match=r"episode\.max_turn"):
        play_page(page, tmp_path)
    page.write_text(
        '```yaml title="run.yaml"\npolicy: {kind: vllm, vllm_config: vllm.yaml}\n```\n',
        encoding="utf-8",
    )
    with pytest.raises(AssertionError, match="no block before it saves"):
        play_page(page, tmp_path)


def test_an_indented_block_under_a_list_item_is_read():
    found = blocks(HOW_TO / "nemo-gym.md")
    indented = [b for b in found if "toolsandbox/data/example.jsonl" in b.code]
    assert indented and not indented[0].code.startswith(" ")


def test_python_m_rayrollout_is_the_rayrollout_command(tmp_path):
    """``python -m rayrollout``, which the verifiers page runs from a venv without the
    script, answers as the ``rayrollout`` script does."""
    env = reader_environment()
    env["COLUMNS"] = "200"

    def run(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    by_module = run(sys.executable, "-m", "rayrollout", "env", "list")
    by_script = run(str(Path(sys.executable).parent / "rayrollout"), "env", "list")
    assert by_module.returncode == 0, by_module.stderr
    assert by_module.stdout == by_script.stdout and "weather" in by_module.stdout
    usage = run(sys.executable, "-m", "rayrollout", "--help")
    assert usage.returncode == 0 and "python -m rayrollout" in usage.stdout
    wrong = run(sys.executable, "-m", "rayrollout", "no-such-command")
    assert wrong.returncode == 2

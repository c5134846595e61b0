"""Sweep NeMo Gym 0.7.0's resources servers: which start offline, and how rayrollout plays them.

Run as a script (not a pytest test), from the repository root, in rayrollout's venv::

    python tests/nemo_gym/sweep.py [--only NAME,...] [--out FILE.json] [--batch N]

1. Every resources server in the unpacked wheel is classified from its own config block,
   its code and its requirements: it needs an LLM judge (or another model server), the
   network or an outside service (API keys, containers, downloads at run time), or a GPU;
   the rest are "offline".
2. Each offline server's entry module is imported in NeMo Gym's venv first (one process
   each), so a missing package is named per server instead of failing a whole ``ng_run``.
3. The importable ones are started in batches by NeMo Gym's own ``ng_run``
   (``ngrun.NemoGymRun``); rayrollout plays each server's own ``data/example.jsonl`` against
   it with the scripted policy double, one Ray + Serve + policy for the whole sweep and one
   ``RolloutEngine`` per batch, reading rows exactly as ``collect --env NAME --env-url
   NAME=URL`` does.
4. Per server it records rows read and refused by the task reader, episode statuses and
   every protocol error: a 4xx/5xx answer to ``/seed_session``, ``/verify`` or
   ``/close_session`` or a 5xx from a tool route (from the server's own access log), and the
   episodes' ``error``/``close_error`` texts. The JSON summary goes to stdout (and --out).
   (ng_run merges its servers' output, so now and then an access line loses its server
   prefix: access counts are a lower bound; the episodes' errors name every failed call.)

The ng_run processes get a dead HTTP(S) proxy and Hugging Face's offline switches, so a
server that reaches outside by surprise fails here instead of reaching the network.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ngrun import NG_SRC, NG_VENV, NemoGymRun, free_port, resources_server_block  # noqa: E402

SERVERS_DIR = NG_SRC / "resources_servers"
MODEL_KINDS = ("responses_api_models",)
SERVER_KINDS = ("responses_api_models", "responses_api_agents", "resources_servers")
BATCH = 12
IMPORT_TIMEOUT_S = 120
PROTOCOL = ("seed_session", "verify", "close_session")
# Flags that switch a configured judge off (math_with_judge, polymath: math-verify alone).
JUDGE_OFF_FLAGS = ("should_use_judge", "use_judge", "enable_llm_judge")
# Config keys naming a model endpoint directly instead of a model server.
MODEL_URL_KEYS = ("judge_base_url", "judge_model", "judge_model_name", "vllm_base_url")

# Code that needs the world outside the machine (or a container runtime) at run time.
NETWORK_CODE = [
    (r"\bgit\b[\"', ]+clone\b|[\"']clone[\"']", "clones a git repository at run time"),
    (r"nltk\.download\(", "downloads NLTK data at run time"),
    (r"hf_hub_download\(|snapshot_download\(|\bload_dataset\(", "downloads from the HF Hub"),
    (r"\.from_pretrained\(", "loads a Hugging Face model or tokenizer (download)"),
    (r"tiktoken\.(get_encoding|encoding_for_model)\(", "tiktoken encodings (downloaded)"),
    (r"urllib\.request\.urlopen\(", "downloads with urllib"),
    (r"requests\.(get|post)\(", "HTTP requests with requests"),
    (r"\bdocker\b|apptainer|singularity", "runs containers (docker/apptainer/singularity)"),
    (r"playwright", "drives a Chromium browser (playwright)"),
    (r"(environ|getenv)\W{1,4}\w*(API_KEY|_TOKEN)\b", "reads an API key from the environment"),
    (r"googleapis\.com|api\.sec-api\.io|tavily|openrouter", "calls an outside web API"),
    (r"SANDBOX_HOST", "needs an outside code sandbox service (NEMO_SKILLS_SANDBOX_HOST)"),
    (
        r"[\"']uv[\"'],\s*[\"'](venv|pip)[\"']|[\"']pip[\"'],\s*[\"']install[\"']",
        "installs packages at run time",
    ),
    (r"get_human_eval_plus\(|get_mbpp_plus\(", "evalplus downloads its datasets on first use"),
]
GPU_CODE = [(r"\.cuda\(|device\s*=\s*[\"']cuda|torch\.cuda\.", "uses CUDA")]
GPU_REQUIREMENTS = re.compile(r"^(torch|vllm|torchvision|unbabel-comet|flash-attn)\b", re.I)
# Files of a server's folder that are not part of the running server: tests, data preparation.
NOT_SERVER_CODE = re.compile(
    r"(^|/)(tests?|scripts|misc|data)/|(^|/)(conftest|prepare_\w*|generate_\w*|create_\w*|"
    r"\w*preprocess\w*|gen_eval\w*|seed_prompt\w*|\w*_test_prep)\.py$"
)
# Small PyPI requirements of offline servers pip-installed into .venv-nemo-gym for this
# sweep (not among nemo-gym 0.7.0's own dependencies); the sweep does not install them.
INSTALLED = [
    "math-verify==0.8.0 (math_with_judge, polymath; brings latex2sympy2_extended, sympy)",
    "editdistance (ruler2)",
    "toml (structeval)",
    "xmltodict==1.0.2 (structured_outputs)",
    "openapi-schema-validator==0.6.3 (terminal_multi_harness)",
    "gymnasium==1.1.1 (grl_tetris, tales)",
    "assaybench==0.2.0 (assaybench)",
]
# Harness protocols other than the resources-server one rayrollout speaks.
OTHER_PROTOCOL = re.compile(r"class \w+\((GymnasiumServer)\)")


@dataclass
class Server:
    """One resources server: how it was classified and what happened when it ran."""

    name: str
    category: str = "offline"  # offline | judge | network | gpu | no_config
    reasons: list[str] = field(default_factory=list)
    config: str = ""  # the config file its block came from
    top: str = ""  # the block's top-level name (ng_run's process name)
    placeholders: list[str] = field(default_factory=list)  # unused model refs to satisfy
    notes: list[str] = field(default_factory=list)
    started: bool | None = None
    not_started: str = ""
    rows: int = 0
    read: int = 0
    refused: list[str] = field(default_factory=list)
    episodes: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    rewards: list[float] = field(default_factory=list)
    access: dict[str, dict[str, int]] = field(default_factory=dict)  # route -> status -> n
    protocol_errors: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # distinct episode error texts
    close_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


# --- classification ---------------------------------------------------------------------


def _server_refs(value: Any, path: str = "") -> list[tuple[str, dict[str, str]]]:
    """Every server reference (``{type: responses_api_models, name: ...}``) in a config."""
    if isinstance(value, dict):
        if value.get("type") in SERVER_KINDS and isinstance(value.get("name"), str):
            return [(path, value)]
        return [r for k, v in value.items() for r in _server_refs(v, f"{path}.{k}".strip("."))]
    if isinstance(value, list):
        return [r for i, v in enumerate(value) for r in _server_refs(v, f"{path}[{i}]")]
    return []


def _strings(value: Any, path: str = "") -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(v, f"{path}.{k}".strip("."))]
    if isinstance(value, list):
        return [s for i, v in enumerate(value) for s in _strings(v, f"{path}[{i}]")]
    return [(path, value)] if isinstance(value, str) else []


def find_block(name: str) -> tuple[Path, str, dict[str, Any]] | None:
    """The config file, top-level name and block of resources server ``name``.

    Its own ``configs/<name>.yaml`` first, else the first other config (sorted) that defines
    ``resources_servers.<name>`` (``structured_outputs``, ``arena``, ... have no own one).
    """
    configs = SERVERS_DIR / name / "configs"
    own = configs / f"{name}.yaml"
    paths = [own] if own.exists() else []
    paths += sorted(p for p in configs.glob("*.yaml") if p != own) if configs.is_dir() else []
    for path in paths:
        try:
            config = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            continue
        for top, block in (config or {}).items():
            if isinstance(block, dict) and name in (block.get("resources_servers") or {}):
                return path, top, block["resources_servers"][name]
    return None


def server_code(name: str) -> dict[str, str]:
    """The server's own Python files (tests and data-preparation scripts left out)."""
    root = SERVERS_DIR / name
    code = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if not NOT_SERVER_CODE.search(rel):
            code[rel] = path.read_text(errors="replace")
    return code


def requirements(name: str) -> list[str]:
    """The server's requirements.txt lines, or its pyproject.toml's dependencies."""
    path = SERVERS_DIR / name / "requirements.txt"
    if path.exists():
        lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
        return [line for line in lines if line]
    pyproject = SERVERS_DIR / name / "pyproject.toml"
    if pyproject.exists():
        import tomllib

        project = tomllib.loads(pyproject.read_text()).get("project", {})
        return list(project.get("dependencies", []))
    return []


def _code_hits(code: dict[str, str], patterns: list[tuple[str, str]]) -> list[str]:
    hits = []
    for pattern, what in patterns:
        files = []
        for rel, text in code.items():
            lines = [
                line
                for line in text.splitlines()
                if re.search(pattern, line) and not line.lstrip().startswith("#")
            ]
            if lines:
                files.append(rel)
        if files:
            hits.append(f"{what} ({', '.join(files[:3])}{', ...' if len(files) > 3 else ''})")
    return hits


def classify(name: str) -> Server:
    """Sort one server into offline / judge / network / gpu, with the evidence for it."""
    server = Server(name)
    found = find_block(name)
    if found is None:
        server.category = "no_config"
        server.reasons.append("no config block defines resources_servers." + name)
        return server
    path, top, block = found
    server.config, server.top = path.relative_to(NG_SRC).as_posix(), top
    judge, network, gpu = [], [], []

    judge_off = [flag for flag in JUDGE_OFF_FLAGS if block.get(flag) is False]
    for key, ref in _server_refs(block):
        if ref["type"] not in MODEL_KINDS:
            continue
        if judge_off and "judge" in key and "." not in key:
            server.placeholders.append(ref["name"])
            server.notes.append(
                f"{key} -> {ref['name']} is configured but off ({judge_off[0]}: false); "
                "a placeholder model server satisfies the reference"
            )
        else:
            judge.append(f"model server {key} -> {ref['name']}")
    for key in MODEL_URL_KEYS:
        if block.get(key) not in (None, "", "''"):
            judge.append(f"model endpoint {key}: {block[key]}")

    for key, value in _strings(block):
        leaf = key.rsplit(".", 1)[-1]
        if re.search(r"api_key|_token_env$", leaf) and leaf not in MODEL_URL_KEYS:
            if not key.startswith("judge"):
                network.append(f"API key {key}: {value}")
        if re.fullmatch(r"\$\{[A-Za-z_]+\}", value.strip()):
            network.append(f"{key} must be given ({value}: no default)")
        if re.search(r"image", leaf) and value:
            network.append(f"container image {key}: {value}")
        if leaf in ("sandbox_host",):
            network.append(f"needs an outside sandbox service ({key}: {value})")
    for key in ("sandbox_provider", "sandbox_config", "sandbox_spec"):
        if key in block:
            network.append(f"runs tasks in a sandbox provider ({key})")
            break
    if block.get("env") in ("singularity", "docker", "apptainer"):
        network.append(f"runs tasks in {block['env']} containers")
    if isinstance(block.get("workers"), (list, dict)) or "auth_token_env" in block:
        network.append("drives remote workers (workers, auth_token_env)")
    for key in ("comet_model",):
        if key in block:
            gpu.append(f"{key}: {block[key]} (a neural metric model)")

    reqs = requirements(name)
    for req in reqs:
        if "sandbox" in req and "nemo-gym[" in req:
            network.append(f"requirement {req.split(' @')[0]} (sandbox extra)")
        if GPU_REQUIREMENTS.match(req):
            gpu.append(f"requirement {req}")

    code = server_code(name)
    network += _code_hits(code, NETWORK_CODE)
    gpu += _code_hits(code, GPU_CODE)
    allowed = block.get("allowed_agents")
    if allowed:
        server.notes.append(f"allowed_agents: {', '.join(map(str, allowed))}")
    if any(OTHER_PROTOCOL.search(text) for text in code.values()):
        server.notes.append(
            "a GymnasiumServer: it serves /reset and /step (gymnasium_agent's protocol), not "
            "/seed_session + tools + /verify"
        )

    # One category each, the strongest requirement first; every reason is kept.
    for category, reasons in (("judge", judge), ("gpu", gpu), ("network", network)):
        if reasons:
            if server.category == "offline":
                server.category = category
            server.reasons += [f"{category}: {r}" for r in reasons]
    return server


# --- running ----------------------------------------------------------------------------


def _local_addresses() -> list[str]:
    names = {"127.0.0.1", "localhost", "::1", socket.gethostname()}
    try:
        names |= {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        pass
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5)
        names |= set(out.stdout.split())
    except (OSError, subprocess.SubprocessError):
        pass
    return sorted(names)


def offline_env() -> dict[str, str]:
    """What ng_run's processes get on top of ours: no way out but loopback and this host."""
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens, connections fail at once
    no_proxy = ",".join(_local_addresses())
    return {
        "HTTP_PROXY": dead,
        "HTTPS_PROXY": dead,
        "ALL_PROXY": dead,
        "http_proxy": dead,
        "https_proxy": dead,
        "all_proxy": dead,
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "GIT_TERMINAL_PROMPT": "0",
    }


_PROBE = """
import importlib, sys
sys.path[:0] = [{server_dir!r}, {src!r}]
importlib.import_module({module!r})
"""


def probe_import(server: Server, block: dict[str, Any]) -> str:
    """Import the server's entry module as ng_run would run it; '' or why it failed."""
    entry = Path(block.get("entrypoint", "app.py"))
    module = f"resources_servers.{server.name}.{'.'.join(entry.with_suffix('').parts)}"
    server_dir = SERVERS_DIR / server.name
    source = (server_dir / entry).read_text(errors="replace")
    if not re.search(r"__name__\s*==\s*[\"']__main__[\"']", source):
        said = block.get("description", "")
        return f"its entrypoint {entry} starts no server (no __main__){f': {said}' if said else ''}"
    code = _PROBE.format(server_dir=str(server_dir), src=str(NG_SRC), module=module)
    env = {**os.environ, **offline_env(), "PYTHONPATH": str(NG_SRC)}
    try:
        done = subprocess.run(
            [str(NG_VENV / "bin" / "python"), "-c", code],
            cwd=server_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"importing {module} took over {IMPORT_TIMEOUT_S} s"
    if done.returncode == 0:
        return ""
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit {done.returncode}"
    missing = re.search(r"No module named '([\w.]+)'", last)
    if missing:
        top = missing.group(1).split(".")[0]
        listed = [r for r in requirements(server.name) if re.split(r"[\[<>=~ @;]", r)[0]]
        hint = next(
            (r for r in listed if top.replace("_", "-") in r.lower().replace("_", "-")), None
        )
        last += f" (its requirements: {hint})" if hint else " (not in its requirements)"
    return f"import failed: {last[:400]}"


def _stub_model_block(name: str, port: int, policy_url: str) -> dict[str, Any]:
    """A NeMo Gym model server named ``name`` on the scripted policy: never called (judge off)."""
    return {
        name: {
            "responses_api_models": {
                "openai_model": {
                    "entrypoint": "app.py",
                    "openai_base_url": policy_url,
                    "openai_api_key": "unused",
                    "openai_model": "scripted",
                    "host": "127.0.0.1",
                    "port": port,
                }
            }
        }
    }


def server_blocks(server: Server, port: int) -> dict[str, Any]:
    """NeMo Gym's own block of the server, pinned to 127.0.0.1:port."""
    if server.config == f"resources_servers/{server.name}/configs/{server.name}.yaml":
        return resources_server_block(server.name, port)
    config = yaml.safe_load((NG_SRC / server.config).read_text())
    block = config[server.top]
    block["resources_servers"][server.name].update({"host": "127.0.0.1", "port": port})
    return {server.top: block}


# "(process) INFO:     127.0.0.1:5555 - "POST /route HTTP/1.1" 200 OK": the process name
# right before INFO, as lines of several servers can run together in ng_run's output.
_ACCESS = re.compile(r"\(([^()\s]+)\) INFO:\s+[\w.:\[\]]+ - \"POST /([^ ?\"]+)[^\"]*\" (\d{3})")
_HTTP_ERROR = re.compile(r"answered HTTP (\d{3}) to POST /(\S+?):")


def access_log(log: str) -> dict[str, dict[str, dict[str, int]]]:
    """process -> route -> status -> count, from ng_run's uvicorn access lines."""
    counts: dict[str, dict[str, dict[str, int]]] = {}
    for process, route, status in _ACCESS.findall(log):
        by_route = counts.setdefault(process, {}).setdefault(route, {})
        by_route[status] = by_route.get(status, 0) + 1
    return counts


def _failed_process(log: str) -> str | None:
    match = re.search(r"Process `([^`]+)` finished unexpectedly", log)
    return match.group(1) if match else None


_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Exit)\b")


def _start_failure(log: str, server: Server) -> str:
    """The exception a failed server died of: the last traceback through its own folder."""
    unprefixed = [line for line in log.splitlines() if not line.startswith("(")]
    blocks: list[list[str]] = []
    for line in unprefixed:
        if line.startswith("Traceback (most recent call last)"):
            blocks.append([])
        elif blocks:
            blocks[-1].append(line)
    own = f"resources_servers/{server.name}/"
    for block in reversed(blocks):
        text = "\n".join(block)
        if own in text and "nemo_gym/cli/" not in text:
            ends = [line for line in block if _EXCEPTION_LINE.match(line)]
            if ends:
                return ends[-1].strip()[:400]
    prefixed = [
        line.split(") ", 1)[1]
        for line in log.splitlines()
        if line.startswith(f"({server.top})") and ") " in line
    ]
    errors = [line for line in prefixed if re.search(r"(Error|Exception)\b", line)]
    return (errors or prefixed or ["no output"])[-1].strip()[:400]


class SweepRun(NemoGymRun):
    """``NemoGymRun`` whose config may also carry ng_run's top-level settings (timeouts)."""

    def _venv_links(self) -> Path:
        blocks = self.blocks
        self.blocks = {k: v for k, v in blocks.items() if isinstance(v, dict)}
        try:
            return super()._venv_links()
        finally:
            self.blocks = blocks


class Sweep:
    """One Ray + Serve + scripted policy; ng_run and a RolloutEngine per batch."""

    def __init__(self, workdir: Path, serve_port: int) -> None:
        self.workdir = workdir
        self.serve_port = serve_port
        self.policy_url = ""

    def base_config(self) -> dict[str, Any]:
        return {
            "namespace": "ngsweep",
            "policy": {"kind": "scripted"},
            "ray": {"serve_port": self.serve_port},
            "agents": {"num_agents": 1},
            "concurrency": 64,
        }

    def start_policy(self) -> None:
        from rayrollout.data.config import RunConfig
        from rayrollout.engine.services import deploy_policy, ensure_ray

        config = RunConfig.model_validate(self.base_config())
        ensure_ray(config)
        self.policy_url = deploy_policy(config)

    def start_servers(self, batch: list[Server], index: int) -> tuple[NemoGymRun | None, dict]:
        """ng_run for the batch; a server that makes ng_run fail is dropped and noted."""
        live = list(batch)
        attempt = 0
        while live:
            attempt += 1
            blocks: dict[str, Any] = {
                "server_spinup_timeout_seconds": 180,
                "model_endpoint_readiness_timeout_seconds": 30,
            }
            urls = {}
            for server in live:
                port = free_port()
                blocks.update(server_blocks(server, port))
                urls[server.name] = f"http://127.0.0.1:{port}"
                for model in server.placeholders:
                    blocks.update(_stub_model_block(model, free_port(), self.policy_url))
            workdir = self.workdir / f"ng{index}-{attempt}"
            workdir.mkdir(parents=True)
            run = SweepRun(blocks, workdir)
            saved = {k: os.environ.get(k) for k in offline_env()}
            os.environ.update(offline_env())  # only ng_run's processes see these
            try:
                run.start()
                return run, urls
            except RuntimeError:
                log = run.log()
                culprit = _failed_process(log)
                names = {s.top: s for s in live}
                if culprit in names:
                    bad = names[culprit]
                    bad.started, bad.not_started = False, _start_failure(log, bad)
                    live.remove(bad)
                    continue
                timed_out = re.search(r"waiting for Gym servers to become ready: (.+)", log)
                waiting = timed_out.group(1) if timed_out else ""
                slow = [s for s in live if s.top in waiting]
                for server in slow or live:
                    server.started = False
                    server.not_started = (
                        f"not ready within 180 s: {_start_failure(log, server)}"
                        if slow
                        else "ng_run failed: " + log.strip().splitlines()[-1][:300]
                    )
                live = [s for s in live if s.started is not False]
                if not slow:
                    return None, {}
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
        return None, {}

    def play(self, batch: list[Server], urls: dict[str, str], index: int) -> None:
        """Every live server's example rows, in one collection; results per server."""
        from rayrollout.api.rollout_engine import RolloutEngine
        from rayrollout.data.tasks import read_tasks

        tasks = []
        for server in batch:
            if server.name not in urls:
                continue
            path = SERVERS_DIR / server.name / "data" / "example.jsonl"
            server.rows = sum(1 for line in path.read_text().splitlines() if line.strip())
            refused = []
            for task in read_tasks(
                path,
                default_environment=server.name,
                check_environment=lambda env, name=server.name: env == name,
                on_invalid=lambda exc, raw, out=refused: out.append(str(exc)),
            ):
                tasks.append(task)
                server.read += 1
            server.refused = refused
        if not tasks:
            return
        config = self.base_config()
        config["output"] = {"dir": str(self.workdir / f"out{index}")}
        config["environments"] = {
            name: {"url": url, "timeout_s": 60, "max_retries": 1} for name, url in urls.items()
        }
        with RolloutEngine(config) as engine:
            result = engine.collect(tasks)
            by_env: dict[str, list[Any]] = collections.defaultdict(list)
            for trajectory in result.trajectories():
                by_env[trajectory.environment].append(trajectory)
        for server in batch:
            for t in by_env.get(server.name, []):
                server.episodes += 1
                server.statuses[t.status] = server.statuses.get(t.status, 0) + 1
                if t.status != "error":
                    server.rewards.append(round(t.reward, 4))
                if t.error and t.error not in server.errors:
                    server.errors.append(t.error)
                if t.close_error and t.close_error not in server.close_errors:
                    server.close_errors.append(t.close_error)

    def record_access(self, batch: list[Server], run: NemoGymRun) -> None:
        counts = access_log(run.log())
        for server in batch:
            if server.started is False:
                continue
            server.access = counts.get(server.top, {})
            for route, statuses in server.access.items():
                for status, n in statuses.items():
                    code = int(status)
                    if (route in PROTOCOL and code >= 400) or code >= 500:
                        server.protocol_errors.append(f"POST /{route} -> {status} x{n}")
            for text in server.errors + server.close_errors:
                for status, route in _HTTP_ERROR.findall(text):
                    note = f"POST /{route} -> {status} (episode error)"
                    logged = server.access.get(route, {}).get(status)
                    if not logged and note not in server.protocol_errors:
                        server.protocol_errors.append(note)
                if "did not answer" in text and "no answer (episode error)" not in (
                    server.protocol_errors
                ):
                    server.protocol_errors.append("no answer (episode error)")

    def run_batch(self, batch: list[Server], index: int) -> None:
        started = time.monotonic()
        run, urls = self.start_servers(batch, index)
        if run is None:
            return
        try:
            for server in batch:
                if server.name in urls and server.started is None:
                    server.started = True
            self.play(batch, urls, index)
        except Exception as exc:  # one batch's failure must not end the sweep
            for server in batch:
                if server.started:
                    server.errors.append(f"sweep: {type(exc).__name__}: {exc}"[:500])
        finally:
            run.stop()
            self.record_access(batch, run)
            for server in batch:
                server.seconds = round((time.monotonic() - started) / max(1, len(batch)), 1)


def reason_not_clean(server: Server) -> str | None:
    """One line on why a server did not run cleanly; None when it did."""
    if server.category != "offline":
        return f"{server.category}: " + "; ".join(r.split(": ", 1)[1] for r in server.reasons[:3])
    if server.started is False:
        return f"did not start: {server.not_started}"
    if server.started is None:
        return "not run"
    if server.read == 0:
        first = server.refused[0] if server.refused else "no rows"
        return f"every row refused by the task reader: {first}"
    if server.protocol_errors:
        first = (server.errors or server.close_errors or [""])[0]
        other = [n for n in server.notes if "GymnasiumServer" in n]
        why = f" [{other[0]}]" if other else ""
        return f"protocol errors {', '.join(server.protocol_errors)}{why}: {first[:300]}"
    if server.statuses.get("error"):
        return f"{server.statuses['error']} episode error(s): {server.errors[0][:300]}"
    if server.episodes < server.read:
        return f"only {server.episodes} of {server.read} episodes came back"
    return None


def tool_4xx(server: Server) -> dict[str, dict[str, int]]:
    """4xx answers of tool routes: not protocol errors, the model reads them as tool errors."""
    return {
        f"/{route}": codes
        for route, codes in server.access.items()
        if route not in PROTOCOL and any(code.startswith("4") for code in codes)
    }


def summary(servers: list[Server], seconds: float) -> dict[str, Any]:
    categories = collections.Counter(s.category for s in servers)
    started = [s for s in servers if s.category == "offline" and s.started]
    played = [s for s in started if s.episodes]
    return {
        "counts": {
            "total": len(servers),
            "offline": categories["offline"],
            "judge": categories["judge"],
            "network": categories["network"],
            "gpu": categories["gpu"],
            "no_config": categories["no_config"],
            "started": len(started),
            "played": len(played),  # started, and the task reader let rows through
            "played_with_0_protocol_errors": sum(1 for s in played if not s.protocol_errors),
            "clean": sum(1 for s in played if reason_not_clean(s) is None),
        },
        "wall_s": round(seconds, 1),
        "not_clean": {s.name: r for s in servers if (r := reason_not_clean(s)) is not None},
        # A tool the row offers that the server does not serve answers 404 (so it would to
        # NeMo Gym's own agents): shown to the model as a tool error, not a protocol error.
        "tool_4xx": {s.name: t for s in servers if (t := tool_4xx(s))},
        "allowed_agents": {
            s.name: n.split(": ", 1)[1]
            for s in started
            for n in s.notes
            if n.startswith("allowed_agents")
        },
        "installed_into_nemo_gym_venv": INSTALLED,
        "clean": [s.name for s in servers if reason_not_clean(s) is None],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated server names (default: all)")
    parser.add_argument("--out", type=Path, help="write the summary and per-server details here")
    parser.add_argument("--batch", type=int, default=BATCH, help="servers per ng_run")
    parser.add_argument("--workdir", type=Path, help="keep ng_run logs and outputs here")
    parser.add_argument("--classify-only", action="store_true", help="classify, start nothing")
    args = parser.parse_args()
    began = time.monotonic()

    names = sorted(p.name for p in SERVERS_DIR.iterdir() if p.is_dir() and p.name[0] not in "._")
    if args.only:
        wanted = {n.strip() for n in args.only.split(",") if n.strip()}
        unknown = wanted - set(names)
        if unknown:
            parser.error(f"no such resources server: {', '.join(sorted(unknown))}")
        names = [n for n in names if n in wanted]
    servers = [classify(name) for name in names]
    offline = [s for s in servers if s.category == "offline"]
    print(f"{len(servers)} servers, {len(offline)} offline", file=sys.stderr, flush=True)

    if not args.classify_only and offline:
        with ThreadPoolExecutor(2) as pool:
            blocks = [find_block(s.name)[2] for s in offline]
            failures = list(pool.map(probe_import, offline, blocks))
        for server, failure in zip(offline, failures, strict=True):
            if failure:
                server.started, server.not_started = False, failure
        runnable = [s for s in offline if s.started is None]
        print(f"{len(runnable)} import cleanly", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="ngsweep-") as tmp:
            workdir = args.workdir or Path(tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            sweep = Sweep(workdir, free_port())
            sweep.start_policy()
            for index in range(0, len(runnable), args.batch):
                batch = runnable[index : index + args.batch]
                print(
                    f"batch {index // args.batch + 1}: {', '.join(s.name for s in batch)}",
                    file=sys.stderr,
                    flush=True,
                )
                sweep.run_batch(batch, index // args.batch)

    result = summary(servers, time.monotonic() - began)
    print(json.dumps(result, indent=2))
    if args.out:
        details = {s.name: asdict(s) for s in servers}
        args.out.write_text(json.dumps({**result, "servers": details}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

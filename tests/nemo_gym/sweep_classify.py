"""The sweep's classification of NeMo Gym's resources servers (see ``sweep.py``).

Each server is sorted from its own config block, its code and its requirements: it needs an
LLM judge (or another model server), the network or an outside service (API keys,
containers, downloads at run time), or a GPU; the rest are "offline". ``Server`` is the
record of one server that the probing, playing and reporting modules fill in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from ngrun import NG_SRC

SERVERS_DIR = NG_SRC / "resources_servers"
MODEL_KINDS = ("responses_api_models",)
SERVER_KINDS = ("responses_api_models", "responses_api_agents", "resources_servers")
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
# Harness protocols other than the resources-server one rayrollout speaks.
OTHER_PROTOCOL = re.compile(r"class \w+\((GymnasiumServer)\)")
RESET_STEP = "reset_step"  # the agent that plays them (and rows whose server opens them)


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
    # The rayrollout agent its rows are played with, as the docs tell a user: "reset_step"
    # for a GymnasiumServer (/reset, /step) and for rows the server opens (/seed_session's
    # first observation); "" for the run's default (the tool loop).
    agent: str = ""
    gymnasium: bool = False  # a GymnasiumServer: /reset, /step, /close, no /seed_session
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
        server.agent, server.gymnasium = RESET_STEP, True
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

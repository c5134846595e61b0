"""The sweep's probing of NeMo Gym's resources servers (see ``sweep.py``).

An offline server's entry module imported in NeMo Gym's venv (one process each), so a
missing package is named per server; the ng_run config blocks that start it (and a
placeholder model server for a judge that is configured but off); the offline environment
ng_run's processes get; and what ng_run's output says: access counts per route and why a
server did not start.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import yaml
from ngrun import NG_SRC, NG_VENV, NemoGymRun, resources_server_block
from sweep_classify import SERVERS_DIR, Server, requirements

IMPORT_TIMEOUT_S = 120
PROTOCOL = ("seed_session", "verify", "close_session")
# A GymnasiumServer's routes: /reset, /step, /close. Its 404 to /seed_session is how the
# episode finds its kind, and a 404 to /close (where reset's info does not offer it) is
# allowed by its protocol: neither is a protocol error.
GYMNASIUM_PROTOCOL = (*PROTOCOL, "reset", "step", "close")
GYMNASIUM_EXPECTED = frozenset({("seed_session", "404"), ("close", "404")})


def protocol_routes(server: Server) -> tuple[str, ...]:
    """The routes whose 4xx answers are protocol errors for this server's kind."""
    return GYMNASIUM_PROTOCOL if server.gymnasium else PROTOCOL


def expected_answer(server: Server, route: str, status: str) -> bool:
    """A 4xx the server's protocol itself calls for (not an error)."""
    return server.gymnasium and (route, status) in GYMNASIUM_EXPECTED


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


def stub_model_block(name: str, port: int, policy_url: str) -> dict[str, Any]:
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
HTTP_ERROR = re.compile(r"answered HTTP (\d{3}) to POST /(\S+?):")


def access_log(log: str) -> dict[str, dict[str, dict[str, int]]]:
    """process -> route -> status -> count, from ng_run's uvicorn access lines."""
    counts: dict[str, dict[str, dict[str, int]]] = {}
    for process, route, status in _ACCESS.findall(log):
        by_route = counts.setdefault(process, {}).setdefault(route, {})
        by_route[status] = by_route.get(status, 0) + 1
    return counts


def failed_process(log: str) -> str | None:
    match = re.search(r"Process `([^`]+)` finished unexpectedly", log)
    return match.group(1) if match else None


_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Exit)\b")


def start_failure(log: str, server: Server) -> str:
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

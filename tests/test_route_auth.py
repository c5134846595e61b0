"""Authenticated by default: a run's Serve routes take only its token, and the Ray that
rayrollout starts asks every client for Ray's own token.

Requests go over real HTTP to Serve's proxy, as a stranger's would; the Ray check starts a
real local Ray in a subprocess with its own HOME (so its token file is the test's) and
connects real clients to it.
"""

import json
import subprocess
import sys
import textwrap

import requests
from netutil import free_port

from rayrollout import RolloutEngine
from rayrollout.auth import bearer_header
from rayrollout.engine.secret_env import route_token_path

NAMESPACE = "auth-tests"
ROW = {
    "task_id": "b1",
    "prompt": "Book a suite for 2 nights.",
    "environment": "booking",
    "goal": [{"room": "suite", "nights": 2}],
}


def test_a_runs_policy_and_environment_routes_take_only_its_token(serve_session, tmp_path):
    config = {
        "namespace": NAMESPACE,
        "policy": {"kind": "scripted"},
        "environments": {"booking": {"hosting": "serve"}},
        "workers": {"num_workers": 1},
        "output": {"dir": str(tmp_path / "out")},
        "ray": {"serve_port": serve_session},
    }
    with RolloutEngine(config) as engine:
        result = engine.collect([ROW])  # the agents reach the policy with the run's token
        [trajectory] = result.trajectories()
        assert trajectory.status == "ok", trajectory.error
        token = engine.route_token.get_secret_value()
        assert token not in repr(engine.route_token)
        saved = route_token_path(NAMESPACE)
        assert saved.read_text().strip() == token and saved.stat().st_mode & 0o777 == 0o600

        chat = f"{engine.policy_url}/chat/completions"
        body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
        seed = f"http://127.0.0.1:{serve_session}/{NAMESPACE}/env/booking/seed_session"
        for url, payload in ((chat, body), (seed, ROW)):
            for headers in ({}, bearer_header("not-the-token")):
                refused = requests.post(url, json=payload, headers=headers, timeout=60)
                assert refused.status_code == 401, (url, headers, refused.text)
            taken = requests.post(url, json=payload, headers=bearer_header(token), timeout=60)
            assert taken.status_code == 200, (url, taken.text)


_RAY_CHECK = textwrap.dedent(
    """
    import json, os, re, subprocess, sys
    from pathlib import Path

    token_file = Path.home() / ".ray" / "auth_token"
    token_file.parent.mkdir()
    token_file.write_text("a-token-someone-left-world-readable")
    token_file.chmod(0o644)
    os.environ.pop("RAY_AUTH_MODE", None)

    import ray
    from rayrollout.data.config import RunConfig
    from rayrollout.engine.startup import ensure_ray, ensure_serve

    config = RunConfig.model_validate(
        {"namespace": "auth-check", "ray": {"num_cpus": 1, "serve_port": int(sys.argv[1])}}
    )
    ensure_ray(config)
    ensure_serve(config)
    address = ray.get_runtime_context().gcs_address
    join = ("import ray; ray.init(address=%r); "
            "print('JOINED', ray.get(ray.remote(lambda: 1).remote()))")
    joined = {}
    for name, env in (("no token", {"RAY_AUTH_MODE": "disabled"}), ("token", {})):
        run = subprocess.run([sys.executable, "-c", join % address], capture_output=True,
                             text=True, timeout=180, env={**os.environ, **env})
        joined[name] = "JOINED 1" in run.stdout
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    ours = {os.getpid()}
    while True:
        more = {pid for pid, parent in parents.items() if parent in ours} - ours
        if not more:
            break
        ours |= more
    listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    ports = {}
    for line in listening.splitlines():
        pids = {int(p) for p in re.findall(r"pid=(\\d+)", line)}
        if pids & ours:
            ports[line.split()[3]] = re.findall(r'"([^"]+)"', line)[0]
    from ray import serve
    serve.shutdown()
    ray.shutdown()
    print(json.dumps({
        "mode": os.environ.get("RAY_AUTH_MODE"),
        "file_mode": oct(token_file.stat().st_mode & 0o777),
        "joined": joined,
        "ports": ports,
    }))
    """
)


def test_the_ray_rayrollout_starts_refuses_clients_without_its_token(tmp_path):
    """``ensure_ray`` turns Ray's token auth on itself (not by a file's chance), makes the
    token file owner-only, and Serve listens on loopback only. Ray 2.60's own gRPC ports
    still listen on every interface (no bind option exists): the token is their guard."""
    serve_port = free_port()
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(tmp_path), RAY_USAGE_STATS_ENABLED="0")
    run = subprocess.run(
        [sys.executable, "-c", _RAY_CHECK, str(serve_port)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    print(json.dumps(found, indent=1))
    assert found["mode"] == "token"
    assert found["file_mode"] == "0o600"
    assert found["joined"] == {"no token": False, "token": True}
    serve_binds = [addr for addr, name in found["ports"].items() if addr.endswith(f":{serve_port}")]
    assert serve_binds == [f"127.0.0.1:{serve_port}"], found["ports"]

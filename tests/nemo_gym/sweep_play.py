"""The sweep's playing of NeMo Gym's resources servers (see ``sweep.py``).

The importable servers are started in batches by NeMo Gym's own ``ng_run``; rayrollout plays
each server's own ``data/example.jsonl`` against it with the scripted policy double, one Ray
+ Serve + policy for the whole sweep and one ``RolloutEngine`` per batch, and records per
server the rows read and refused, episode statuses and every protocol error. Each row is
played by the agent the docs tell a user to pick: ``reset_step`` for a GymnasiumServer and
for rows whose first observation is the server's, the default tool loop otherwise.
"""

from __future__ import annotations

import collections
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ngrun import NemoGymRun, free_port
from sweep_classify import RESET_STEP, SERVERS_DIR, Server
from sweep_probe import (
    HTTP_ERROR,
    SweepRun,
    access_log,
    expected_answer,
    failed_process,
    offline_env,
    protocol_routes,
    server_blocks,
    start_failure,
    stub_model_block,
)

if TYPE_CHECKING:
    from rayrollout.data.schema import Task


def played_by(server: Server, task: Task) -> Task:
    """The task with the agent the docs tell a user to pass for it.

    ``reset_step`` for a reset/step server or a row whose first observation is the
    server's; otherwise unchanged (the run's default tool loop).
    """
    if server.agent or task.opening == "seed_session":
        server.agent = RESET_STEP
        return task.model_copy(update={"agent": RESET_STEP})
    return task


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
            "workers": {"num_workers": 1},
            "concurrency": 64,
        }

    def start_policy(self) -> None:
        from rayrollout.auth import RouteAuth
        from rayrollout.data.config import RunConfig
        from rayrollout.engine.startup import deploy_policy, ensure_ray

        # The model NeMo Gym's servers call (their stub block sends "unused" as its key), in
        # a namespace of its own: each RolloutEngine deploys its own policy with its token.
        config = RunConfig.model_validate({**self.base_config(), "namespace": "ngsweep-model"})
        ensure_ray(config)
        self.policy_url = deploy_policy(config, RouteAuth.bearer("unused"))

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
                    blocks.update(stub_model_block(model, free_port(), self.policy_url))
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
                culprit = failed_process(log)
                names = {s.top: s for s in live}
                if culprit in names:
                    bad = names[culprit]
                    bad.started, bad.not_started = False, start_failure(log, bad)
                    live.remove(bad)
                    continue
                timed_out = re.search(r"waiting for Gym servers to become ready: (.+)", log)
                waiting = timed_out.group(1) if timed_out else ""
                slow = [s for s in live if s.top in waiting]
                for server in slow or live:
                    server.started = False
                    server.not_started = (
                        f"not ready within 180 s: {start_failure(log, server)}"
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
                tasks.append(played_by(server, task))
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
            routes = protocol_routes(server)
            for route, statuses in server.access.items():
                for status, n in statuses.items():
                    code = int(status)
                    if expected_answer(server, route, status):
                        continue
                    if (route in routes and code >= 400) or code >= 500:
                        server.protocol_errors.append(f"POST /{route} -> {status} x{n}")
            for text in server.errors + server.close_errors:
                for status, route in HTTP_ERROR.findall(text):
                    if expected_answer(server, route, status):
                        continue
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

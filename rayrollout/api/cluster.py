"""A long-lived engine on a cluster: ``up``, ``status``, ``down``, and finding what is up.

``up`` deploys a namespace's policy, its Serve-hosted environments, a detached engine (with
its workers) and the rollout API over HTTP (``service``, unless ``service.enabled`` is off);
``collect`` and training loops then attach to that engine instead of starting their own, or
reach it over HTTP (``rayrollout.client``). Everything is found by name in the namespace
(the ``engine`` and ``service`` actors, ``worker:<i>`` actors, Serve apps ``<ns>.policy``
and ``<ns>.env.<name>``), so two namespaces on one cluster never see each other. A lookup
retries briefly while things start, then fails naming what is missing and the command that
starts it.

The service is created with ``max_restarts``, so Ray brings it back when its process dies
(killed under memory pressure, say), as it brings back a worker. An ``up`` stopped during
start-up leaves an engine without its service; the next ``up`` replaces that engine rather
than refusing, so running ``up`` again is the one way back. ``running_namespaces`` finds the
namespaces with an engine or a service, so ``status`` and ``down`` need no ``--namespace``
when one run is up.

Example:
    >>> from rayrollout.api.cluster import up, status, down  # doctest: +SKIP
    >>> up(load_config("run.yaml")); print(status("rayrollout")); down("rayrollout")
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

import ray
from pydantic import SecretStr
from ray import serve

from rayrollout.api.errors import NotUpError
from rayrollout.api.rollout_engine import EngineExistsError, RolloutEngine
from rayrollout.api.service.journal import refuse_open_journals
from rayrollout.api.service.service_actor import ENGINE_WAIT_S, SERVICE_NAME, ServiceActor
from rayrollout.auth import read_token_file
from rayrollout.data.config import RunConfig
from rayrollout.engine.engine_actor import ENGINE_NAME
from rayrollout.engine.feeding import WORKER_PREFIX
from rayrollout.engine.placement import cpu_actor_options
from rayrollout.engine.secret_env import route_token_path
from rayrollout.engine.startup import ensure_ray, named_actor, policy_app_name
from rayrollout.envkit.server import environment_app_name

__all__ = [
    "EngineExistsError",
    "NotUpError",
    "down",
    "lookup_app",
    "lookup_engine",
    "running_namespaces",
    "service_url",
    "start_detached",
    "start_service",
    "status",
    "up",
]

LOOKUP_TIMEOUT_S = 5.0

log = logging.getLogger("rayrollout")


def _retry(find: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return find()
        except (ValueError, KeyError, RuntimeError, serve.exceptions.RayServeException):
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.25)


def lookup_engine(namespace: str, timeout_s: float = LOOKUP_TIMEOUT_S) -> Any:
    """The namespace's engine actor; retries for ``timeout_s`` while it starts.

    Raises:
        NotUpError: naming the namespace and the command that starts an engine.
    """
    engine = _retry(lambda: ray.get_actor(ENGINE_NAME, namespace=namespace), timeout_s)
    if engine is None:
        raise NotUpError(
            f"no rayrollout engine in Ray namespace '{namespace}' (looked for actor "
            f"'{ENGINE_NAME}' for {timeout_s:g}s): start one with `rayrollout up --config "
            f"FILE --namespace {namespace}` (or let `rayrollout collect` start its own)"
        )
    return engine


def lookup_app(namespace: str, app: str, timeout_s: float = LOOKUP_TIMEOUT_S) -> Any:
    """A handle to the Serve app ``<namespace>.<app>`` (``policy``, ``env.code``); retries.

    Raises:
        NotUpError: naming the app and the command that deploys it.
    """
    name = f"{namespace}.{app}"

    def find() -> Any:
        if name not in serve.status().applications:
            raise KeyError(name)
        return serve.get_app_handle(name)

    handle = _retry(find, timeout_s)
    if handle is None:
        raise NotUpError(
            f"Serve application '{name}' is not running (looked for {timeout_s:g}s): "
            f"deploy it with `rayrollout up --config FILE --namespace {namespace}`"
        )
    return handle


def up(config: RunConfig) -> dict[str, Any]:
    """Deploy the policy, the Serve-hosted environments and a detached engine; return status.

    Raises:
        EngineExistsError: an engine already runs in the namespace (``rayrollout down``
            first); a ``RuntimeError`` too.
    """
    start_detached(config)
    return status(config.namespace)


def start_detached(config: RunConfig) -> Any:
    """``up`` without the status report: returns the detached engine's handle.

    It is ``RolloutEngine.start(detached=True)``: one way to start an engine, one error.
    The HTTP service starts beside it with the run's route token (``service.enabled``).
    After the engine died, ``up`` starts a new one: a service still up keeps serving (and
    finds it by name), and keeps its token; with ``resume`` the run's token is kept too,
    and a new service answers the batches journaled in the output folder. An engine
    without an answering service (an ``up`` stopped during start-up) is replaced. With no
    cluster named, the Ray is a local head that outlives this process (``local_head``).

    Raises:
        EngineExistsError: an engine and its service already run in the namespace
            (``rayrollout down`` first), or an engine runs and ``service.enabled`` is off.
        OpenJournalsError: no service is up, the folder holds unfinished batches of an
            earlier one, and ``resume`` is not set; nothing was started.
    """
    ensure_ray(config, lasting=True)
    service = _live_service(config.namespace)
    if service is not None and named_actor(ENGINE_NAME, config.namespace) is not None:
        described: Any = ray.get(service.describe.remote(), timeout=30)
        raise EngineExistsError(
            f"the run in Ray namespace '{config.namespace}' is already up (its service at "
            f"{described['url']}): `rayrollout status` shows it, `rayrollout down "
            f"--namespace {config.namespace}` stops it"
        )
    if config.service.enabled and service is None:
        refuse_open_journals(config.output.dir, config.resume)
        _replace_engine_without_service(config.namespace)
    driver = RolloutEngine(config)
    token_file = route_token_path(config.namespace)
    if (config.resume or service is not None) and token_file.exists():
        driver.route_token = SecretStr(read_token_file(token_file))  # what clients hold
    driver.start(run_id=time.strftime("up-%Y%m%d-%H%M%S"), detached=True)
    if driver.config.service.enabled and service is None:
        start_service(driver.config, driver.route_token)
    return driver.engine


def _replace_engine_without_service(namespace: str) -> None:
    """An engine with no answering service beside it is an ``up`` stopped half-way (or one
    whose service was removed): remove it, its workers and a service that holds the name
    without answering, so this ``up`` starts them afresh."""
    try:
        ray.kill(ray.get_actor(SERVICE_NAME, namespace=namespace))
        log.warning("namespace '%s': removed an HTTP service that did not answer", namespace)
    except ValueError:
        pass
    engine = named_actor(ENGINE_NAME, namespace)
    if engine is None:
        return
    log.warning(
        "namespace '%s' holds an engine without its HTTP service (an `up` stopped during "
        "start-up): replacing it",
        namespace,
    )
    _remove_engine(namespace, engine, [])


def _live_service(namespace: str) -> Any:
    """The namespace's HTTP service when it is up and answering, else None."""
    try:
        service = ray.get_actor(SERVICE_NAME, namespace=namespace)
        ray.get(service.describe.remote(), timeout=30)
    except Exception:  # none by that name, or one that died with its name not yet freed
        return None
    return service


def start_service(config: RunConfig, route_token: Any) -> str:
    """Start the namespace's HTTP service (detached, named ``service``); returns its URL.

    ``route_token`` (a ``SecretStr``) is the run's: the one its engine's routes take.
    """
    service = ServiceActor.options(  # type: ignore[attr-defined]  # a Ray actor class
        name=SERVICE_NAME,
        namespace=config.namespace,
        lifetime="detached",
        max_restarts=-1,  # back after Ray kills it (memory monitor, a lost process)
        max_task_retries=0,  # a call in flight when it died fails; the client retries
        **cpu_actor_options(config, {}),
    ).remote(config, route_token)
    try:
        url: str = ray.get(service.start.remote(), timeout=ENGINE_WAIT_S + 60)
    except Exception:
        ray.kill(service)  # a half-started service would hold the name
        raise
    return url


def service_url(namespace: str) -> str | None:
    """The URL of the namespace's HTTP service, or None when none is up."""
    service = named_actor(SERVICE_NAME, namespace)
    if service is None:
        return None
    described: Any = ray.get(service.describe.remote(), timeout=30)
    return described["url"]


def status(namespace: str) -> dict[str, Any]:
    """What is up in the namespace: Serve apps with replicas per node, workers, engine health."""
    from ray.util.state import list_actors

    prefix = f"{namespace}."
    apps: dict[str, Any] = {}
    for name, app in serve.status().applications.items():
        if name.startswith(prefix):
            apps[name] = {"status": str(app.status.value), "replicas_per_node": {}}
    # The state API finds its cluster on its own, and refuses a machine running several
    # Rays: name the one this process is connected to. A Ray started without its dashboard
    # has no state API: the listing goes on without the nodes (say so, rather than fail
    # an `up` whose services all started).
    address = ray.get_runtime_context().gcs_address
    listed: dict[str, Any] = {}
    try:
        actors = list_actors(
            address=address, detail=True, filters=[("state", "=", "ALIVE")], limit=10_000
        )
    except Exception as exc:
        actors = []
        listed["nodes_unknown"] = f"Ray's state API did not answer ({type(exc).__name__})"
        listed["workers"] = {
            info["name"]: None
            for info in ray.util.list_named_actors(all_namespaces=True)
            if info["namespace"] == namespace and info["name"].startswith(WORKER_PREFIX)
        }
    per_node: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    workers: dict[str, str] = {}
    for actor in actors:
        if actor.class_name.startswith("ServeReplica:"):
            app_name = actor.class_name.split(":")[1]
            if app_name in apps:
                per_node[app_name][str(actor.node_id)] += 1
        elif actor.class_name == "WorkerActor" and actor.ray_namespace == namespace:
            workers[str(actor.name)] = str(actor.node_id)
    for name, nodes in per_node.items():
        apps[name]["replicas_per_node"] = dict(nodes)
    try:
        engine = ray.get_actor(ENGINE_NAME, namespace=namespace)
        health: Any = ray.get(engine.progress.remote(), timeout=30)
        if hasattr(health, "model_dump"):  # a pydantic model (RunSnapshot): JSON's own types
            health = health.model_dump(mode="json")
        engine_state: dict[str, Any] = {"up": True, "progress": health}
    except ValueError:
        engine_state = {"up": False}
    except Exception as exc:  # up but not answering: say so rather than fail the listing
        engine_state = {"up": True, "error": f"{type(exc).__name__}: {exc}"}
    try:
        service = ray.get_actor(SERVICE_NAME, namespace=namespace)
        described: Any = ray.get(service.describe.remote(), timeout=30)
        service_state: dict[str, Any] = {
            "up": True,
            **described,
            "token_file": str(route_token_path(namespace)),
        }
    except ValueError:
        service_state = {"up": False}
    except Exception as exc:
        service_state = {"up": True, "error": f"{type(exc).__name__}: {exc}"}
    return {
        "namespace": namespace,
        "engine": engine_state,
        "service": service_state,
        "apps": apps,
        "workers": workers,
        **listed,
    }


def _remove_engine(namespace: str, engine: Any, removed: list[str]) -> None:
    """Close and kill the engine (if any) and every worker of the namespace."""
    if engine is not None:
        try:
            ray.get(engine.close.remote(), timeout=30)
        except Exception:  # a dead engine's output lock is released by the OS
            pass
        ray.kill(engine)
        removed.append(f"actor {namespace}/{ENGINE_NAME}")
    for info in ray.util.list_named_actors(all_namespaces=True):
        if info["namespace"] == namespace and info["name"].startswith(WORKER_PREFIX):
            try:
                ray.kill(ray.get_actor(info["name"], namespace=namespace))
                removed.append(f"actor {namespace}/{info['name']}")
            except ValueError:
                pass


def running_namespaces() -> list[str]:
    """The namespaces of the connected cluster that hold an engine or an HTTP service."""
    return sorted(
        {
            info["namespace"]
            for info in ray.util.list_named_actors(all_namespaces=True)
            if info["name"] in (ENGINE_NAME, SERVICE_NAME)
        }
    )


def down(namespace: str) -> list[str]:
    """Remove the namespace's engine, workers and Serve apps; returns what was removed."""
    removed: list[str] = []
    service = named_actor(SERVICE_NAME, namespace)
    if service is not None:
        try:
            ray.get(service.close.remote(), timeout=30)
        except Exception:  # a dead service's port is released by the OS
            pass
        ray.kill(service)
        removed.append(f"actor {namespace}/{SERVICE_NAME}")
    engine = named_actor(ENGINE_NAME, namespace)
    _remove_engine(namespace, engine, removed)
    for name in list(serve.status().applications):
        if name == policy_app_name(namespace) or name.startswith(
            environment_app_name(namespace, "")
        ):
            serve.delete(name)
            removed.append(f"serve app {name}")
    return removed

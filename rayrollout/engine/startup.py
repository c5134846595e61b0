"""Bringing up what a run needs: Ray, Serve's HTTP proxy, and the policy application.

``ensure_ray`` joins or starts Ray; ``attach_ray`` only joins. The policy is deployed here,
through its kind found by name, because every episode needs it from the first call; Serve
is imported only on the way to starting it, which runs without Serve never pay for.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayActorError

from rayrollout.auth import RouteAuth
from rayrollout.data.config import RunConfig
from rayrollout.engine.errors import PolicyEndpointError
from rayrollout.engine.local_head import find_head, start_or_join_head
from rayrollout.engine.ray_auth import require_ray_token_auth
from rayrollout.engine.secret_env import without_secrets
from rayrollout.errors import ClusterError
from rayrollout.policy.kinds import CheckedPolicy, OwnServer, policy_kind
from rayrollout.ports import tcp_socket

__all__ = [
    "PolicyEndpointError",
    "attach_ray",
    "check_serve_port",
    "deploy_policy",
    "ensure_ray",
    "ensure_serve",
    "named_actor",
    "policy_app_name",
    "prepare_policy",
]


def ensure_ray(config: RunConfig, *, lasting: bool = False) -> None:
    """Join the configured cluster (or RAY_ADDRESS), or start a local Ray.

    A local Ray starts without the driver's secrets (``secrets.without_secrets``): the
    GCS, the raylet and every process it forks inherit the environment ``ray.init`` runs
    in, and tool code in an environment replica can read its own or its parent's. The
    policy key reaches the workers as a constructor argument instead (``secrets``).

    Ray's token authentication is asked for explicitly, local or cluster (``ray_auth``):
    Ray 2.60 binds its gRPC ports on every interface, and the token is what keeps a
    stranger on the network from submitting work.

    Args:
        config: The run's config (``ray`` section, ``namespace``).
        lasting: For ``rayrollout up``: with no cluster named, join the local head an
            earlier ``up`` started, or start one that outlives this process
            (``local_head``), instead of a Ray that ends with it.
    """
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    require_ray_token_auth()
    address = config.ray.address or os.environ.get("RAY_ADDRESS")
    kwargs: dict = {"namespace": config.namespace, "logging_level": logging.WARNING}
    if address:  # a cluster started by someone else: its workers' environment is theirs
        ray.init(address=address, **kwargs)
        return
    for name, value in _SERVE_PATIENCE.items():  # the local Ray's processes inherit them
        os.environ.setdefault(name, value)
    with without_secrets(extra=[config.policy.api_key_env]):
        if lasting:
            head = start_or_join_head(config, dict(os.environ))
            ray.init(address=head.address, **kwargs)
            return
        ray.init(
            address="local",  # join a cluster only when RAY_ADDRESS or --address says so
            num_cpus=config.ray.num_cpus or max(2, os.cpu_count() or 2),
            include_dashboard=False,
            **kwargs,
        )


def attach_ray(config: RunConfig) -> str | None:
    """Join the running cluster without ever starting one: ``ray.address``, RAY_ADDRESS,
    else the local head ``rayrollout up`` started (``local_head``). Returns the address
    joined, or None when there is none to join (nothing was started).

    Raises:
        ConnectionError: the named cluster does not answer (Ray's own error).
    """
    address = config.ray.address or os.environ.get("RAY_ADDRESS")
    if not address:
        head = find_head()
        address = head.address if head is not None else None
    if not address:
        return None
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        require_ray_token_auth()
        ray.init(address=address, namespace=config.namespace, logging_level=logging.WARNING)
    return address


def ensure_serve(config: RunConfig) -> None:
    """Start Serve (or reuse the running one) with HTTP on the configured address.

    A proxy the controller gave up on while it started (a loaded machine, see
    ``_SERVE_PATIENCE``) is started again, twice at most; then one line says what failed.
    """
    from ray import serve

    if not _serve_is_up():
        check_serve_port(config)
    for attempt in range(3):
        try:
            serve.start(
                proxy_location=config.ray.serve_proxy_location,
                http_options={"host": config.ray.serve_host, "port": config.ray.serve_port},
                logging_config={"log_level": "WARNING"},
            )
            return
        except RayActorError as exc:
            if attempt == 2:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise ClusterError(
                    f"Ray Serve's HTTP proxy died while starting, 3 times ({first}); the "
                    "machine may be overloaded: see Ray's logs (the run's _logs folder), "
                    "or raise RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"
                ) from None


def named_actor(name: str, namespace: str) -> Any | None:
    """The live actor named ``name`` in ``namespace`` on the connected cluster, or None."""
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


def _serve_is_up() -> bool:
    """Serve already runs in this cluster (its proxies hold their ports)."""
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    return named_actor(SERVE_CONTROLLER_NAME, SERVE_NAMESPACE) is not None


def check_serve_port(config: RunConfig) -> None:
    """Refuse a Serve HTTP port another program holds on this node, before Serve starts.

    Serve's proxy cannot bind it then: the run would stop on a traceback from inside Serve
    with the cause at its end, or, where that program is another cluster's Serve, its calls
    would reach that cluster.

    Raises:
        ClusterError: the port is taken; names it and the setting that moves it.
    """
    host, port = config.ray.serve_host, config.ray.serve_port
    with tcp_socket(host) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the proxy binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ClusterError(
                f"Serve's HTTP port {port} on {host} is taken by another program "
                f"({exc.strerror}): stop that program, or give the run a free port "
                "(ray.serve_port in --config)"
            ) from None


# Serve's controller kills an HTTP proxy not ready within 5 s of starting (health checks
# allow 10 s): on a loaded machine (2 cores, two busy loops and a run) a new proxy process
# took longer, and `serve.start` failed with ActorDiedError. Waits kept unless set by the user.
_SERVE_PATIENCE = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60",
}


def policy_app_name(namespace: str) -> str:
    return f"{namespace}.policy"


def prepare_policy(
    config: RunConfig, auth: RouteAuth, policy: CheckedPolicy | None = None
) -> tuple[str, Callable[[], Callable[[], None] | None] | None]:
    """The policy's OpenAI base URL, and the call that deploys it (None: an external server).
    That call returns the call that ends the policy where the run owns it (a kind's
    ``OwnServer``), else None (a Serve app stays up for whoever started Serve).

    The kind (``policy.kind``) is found by name (``rayrollout.policy.kinds``): a deployed
    kind (scripted, vLLM) is built here, its routes taking the bearers ``auth`` accepts, and
    runs on Serve when the returned call is made; an external server (``openai``), or a
    server of an attaching kind already up (``policy.base_url`` with kind ``vllm``), is used
    at ``policy.base_url`` and needs no Serve at all. Split from deploying because the URL is
    known before the app runs: the driver starts the engine and its workers while Serve brings
    the policy up (``RolloutEngine``), each taking seconds. A bad config fails here, at once.
    Built here, not in the deploy call: a kind's build may fill policy settings the engine
    and its workers are started with (vLLM's deployment file names the model and tokenizer).

    ``policy`` is the kind as the planning checked it (``CheckedPolicy``); None: the kind is
    found here by name.
    """
    try:
        if policy is None:
            kind = policy_kind(config.policy.kind)
            policy = CheckedPolicy(kind, kind.deploys(config))
        build = policy.kind.build_app if policy.deploys else None
        app = build(config, auth) if build is not None else None
    except (ValueError, RuntimeError) as exc:  # a deployment file missing, wrong, unreadable
        raise PolicyEndpointError(str(exc)) from None
    if app is None:
        if not config.policy.base_url:
            raise PolicyEndpointError(
                f"policy kind '{config.policy.kind}' needs a base URL: pass --base-url URL "
                "(and --model NAME)"
            )
        return config.policy.base_url, None
    if isinstance(app, OwnServer):
        return app.base_url, app.start
    route = f"/{config.namespace}/policy"

    def deploy() -> Callable[[], None] | None:
        from ray import serve

        ensure_serve(config)
        serve.run(app, name=policy_app_name(config.namespace), route_prefix=route)
        return None

    return f"http://127.0.0.1:{config.ray.serve_port}{route}/v1", deploy


def deploy_policy(config: RunConfig, auth: RouteAuth) -> str:
    """Deploy the policy the config asks for and return its OpenAI base URL, in one call
    (``prepare_policy``, then its deploy call when there is one)."""
    url, deploy = prepare_policy(config, auth)
    if deploy is not None:
        deploy()
    return url

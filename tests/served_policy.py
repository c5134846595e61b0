"""The scripted policy as a Ray Serve app, for test modules that need a real policy server (a
plain module, not a conftest: its names import the same whichever conftest loaded last)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def scripted_policy_on_serve(name: str, serve_port: int, key: str) -> Iterator[str]:
    """The scripted policy as the Serve app ``name`` (route ``/name``), taking the bearer
    token ``key``, for the length of a ``with`` block; yields its ``/v1`` URL."""
    from ray import serve

    from rayrollout.auth import RouteAuth
    from rayrollout.deployments.scripted import scripted_policy_app

    serve.run(scripted_policy_app(auth=RouteAuth.bearer(key)), name=name, route_prefix=f"/{name}")
    try:
        yield f"http://127.0.0.1:{serve_port}/{name}/v1"
    finally:
        serve.delete(name)

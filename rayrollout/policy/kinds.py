"""Policy kinds: how each ``policy.kind`` is brought up and how it takes new weights.

A kind is a ``PolicyKind``: the Serve application it deploys (none for an external server)
and its ``WeightBackend`` (what pause, resume and a checkpoint load mean for it). Kinds are
found the way environments are: by name, through the ``rayrollout.policies`` entry-point
group, each spec living with its deployment (``rayrollout.deployments.scripted.kind``,
``rayrollout.deployments.vllm.kind``; pyproject.toml registers them). So the engine imports
no deployment by name, and a package can add a kind without touching rayrollout. The one
built-in kind is ``openai``: an external server, nothing to deploy.

A name registered twice with different targets is an error naming both. Finding,
refusing duplicates and importing are ``rayrollout.plugins``' (shared with environments and
agents); what is kind-specific stays here: the target must be a ``PolicyKind``.

Example:
    >>> policy_kind("openai").build_app is None
    True
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rayrollout.auth import RouteAuth
from rayrollout.data.config import RunConfig
from rayrollout.errors import InputError, PolicyBoundaryError
from rayrollout.plugins import PluginGroup
from rayrollout.policy.gate import PauseMode
from rayrollout.policy.protocol import Policy

__all__ = [
    "OwnServer",
    "ENTRY_POINT_GROUP",
    "EXTERNAL",
    "POLICY_KINDS",
    "FixedWeights",
    "PolicyKind",
    "UnknownPolicyKindError",
    "WeightBackend",
    "WeightUpdateError",
    "policy_kind",
    "policy_kinds",
]

ENTRY_POINT_GROUP = "rayrollout.policies"


class WeightUpdateError(PolicyBoundaryError, RuntimeError):
    """The policy backend could not pause, resume or load weights."""


class UnknownPolicyKindError(InputError, LookupError):
    """A config named a policy kind nothing registers, or one name has two targets."""


class WeightBackend(Protocol):
    """What the policy needs around a weight update (the engine's ``WeightSync`` calls it)."""

    async def pause(self, mode: PauseMode) -> None:
        """Stop generating (in-flight calls per ``mode``)."""
        ...

    async def resume(self) -> None:
        """Generate again."""
        ...

    async def load(self, path: str) -> dict[str, Any]:
        """Load the checkpoint folder ``path`` into every replica; figures for the caller."""
        ...


@dataclass(frozen=True)
class OwnServer:
    """What a kind's ``build_app`` returns for a server rayrollout starts itself outside
    Serve (the scripted policy's ``hosting: actor``): its OpenAI base URL, known before it
    starts, and the call that starts it, returns once it listens, and returns the call that
    ends it (the run that started it ends it)."""

    base_url: str
    start: Callable[[], Callable[[], None]]


@dataclass(frozen=True)
class PolicyKind:
    """One policy kind: what to deploy for it and how it takes new weights."""

    name: str
    """The ``policy.kind`` value that picks it."""
    build_app: Callable[[RunConfig, RouteAuth], Any] | None
    """The Serve application for the run's config (``serve.Application``), an ``OwnServer``
    rayrollout starts without Serve, or None for a server that runs elsewhere
    (``policy.base_url``). May fill policy settings the config
    left unset (vLLM's deployment file names the model); raises ``ValueError`` naming a
    config that cannot work. Its routes must take only what the ``RouteAuth`` accepts (the
    run's token): the control routes, where a kind has them, above all."""
    weight_backend: Callable[[RunConfig, str, str | None], WeightBackend]
    """The backend for the run's config, the policy's base URL and the bearer token its
    routes take: the run's token for a policy the run deploys, the policy key
    (``policy.api_key_env``) for one already up, None when there is none."""
    local: Callable[[RunConfig], Policy] | None = None
    """The policy in this process, without Ray or a server, for commands that play an
    episode on the spot (``rayrollout agent test``); None where a kind has no such form."""
    attaches: bool = False
    """Whether a config with ``policy.base_url`` set uses a server of this kind that is
    already up there (deployed by another run, or by hand) instead of deploying one: the
    run deploys nothing, yet weight updates still go through ``weight_backend`` (vLLM's
    control routes), with the policy key."""

    def deploys(self, config: RunConfig) -> bool:
        """Whether the run deploys its policy on Serve (its routes then take the run's
        token), as opposed to using a server at ``policy.base_url``."""
        if self.build_app is None:
            return False
        return not (self.attaches and config.policy.base_url)


class FixedWeights(ABC):
    """A backend with nothing to pause or resume (only the version moves); subclasses say
    what ``load`` means for their kind (abstract: a kind without it cannot be built)."""

    async def pause(self, mode: PauseMode) -> None:
        return None

    async def resume(self) -> None:
        return None

    @abstractmethod
    async def load(self, path: str) -> dict[str, Any]:
        """Load the checkpoint at ``path``; what that means is the kind's."""


class _ExternalWeights(FixedWeights):
    """An external server: rayrollout cannot load weights into it; versions still move."""

    async def load(self, path: str) -> dict[str, Any]:
        raise WeightUpdateError(
            "policy kind 'openai' is an external server rayrollout cannot load weights into: "
            "update it yourself, then call update_weights(version=N) without a path"
        )


EXTERNAL = PolicyKind("openai", None, lambda config, url, token: _ExternalWeights())


POLICY_KINDS = PluginGroup(
    "policy kind",
    ENTRY_POINT_GROUP,
    unknown=UnknownPolicyKindError,
    by_path=False,
    built_in={EXTERNAL.name: "rayrollout.policy.kinds:EXTERNAL"},
    registers="a PolicyKind",
)
"""The policy kinds by name (``rayrollout.plugins``: entry points, duplicates, lazy import);
``openai`` is built in."""


def policy_kinds() -> dict[str, str]:
    """Every policy kind's name and ``"module:attr"`` target: the built-in ``openai`` and the
    registered ones (imported only when ``policy_kind`` is asked for one)."""
    return {name: found.target for name, found in POLICY_KINDS.registered().items()}


def policy_kind(name: str) -> PolicyKind:
    """The policy kind ``name``; raises ``UnknownPolicyKindError`` listing the known ones."""
    target = POLICY_KINDS.resolve(name).target
    kind = POLICY_KINDS.load(target, name)
    if not isinstance(kind, PolicyKind):
        raise UnknownPolicyKindError(
            f"policy kind '{name}' = '{target}' is a {type(kind).__name__}, not a "
            "rayrollout.policy.kinds.PolicyKind"
        )
    return kind

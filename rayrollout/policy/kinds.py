"""Policy kinds: how each ``policy.kind`` is brought up, what settings it takes and how it
takes new weights.

A kind is a ``PolicyKind`` found by name through the ``rayrollout.policies`` entry points
(``rayrollout.plugins``), so a kind is one folder plus one entry point. It owns the
``policy:`` keys beside the common ones: its ``settings_model``, whose validators are its
checks (``PolicyConfig.settings_as``). The one built-in kind is ``openai``: an external
server, nothing to deploy, no settings.

Example:
    >>> policy_kind("openai").build_app is None
    True
"""

from __future__ import annotations

import difflib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from rayrollout.auth import RouteAuth
from rayrollout.data.config import PauseMode, RunConfig
from rayrollout.data.config_model import ConfigModel
from rayrollout.plugins import PluginGroup
from rayrollout.policy.errors import UnknownPolicyKindError, WeightUpdateError
from rayrollout.policy.protocol import Policy

__all__ = [
    "CheckedPolicy",
    "OwnServer",
    "ENTRY_POINT_GROUP",
    "EXTERNAL",
    "PAUSE_MODES_A_KIND_MAY_REFUSE",
    "POLICY_KINDS",
    "FixedWeights",
    "NoSettings",
    "PolicyKind",
    "UnknownPolicyKindError",
    "WeightBackend",
    "WeightUpdateError",
    "continue_refusal",
    "kind_settings",
    "interrupt_refusal",
    "pause_mode_refusal",
    "policy_kind",
    "policy_kinds",
]

ENTRY_POINT_GROUP = "rayrollout.policies"


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


class NoSettings(ConfigModel):
    """The settings of a kind that takes none of its own (``openai``): any key beside the
    common ones is refused."""


S = TypeVar("S", bound=BaseModel)


@dataclass(frozen=True)
class PolicyKind:
    """One policy kind: what to deploy for it, what it takes, how it takes new weights."""

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
    settings_model: type[BaseModel] = NoSettings
    """The kind's own ``policy:`` keys, beside the common ones, as a pydantic model with
    ``extra="forbid"`` (a typo is refused by name); ``kind_settings`` reads them typed. Its
    validators are the kind's checks, run with the config's own validation of the section
    (``PolicyConfig.settings_as``) before anything starts: one reading the common keys
    finds the section as ``info.context["policy"]`` (None when the model is built alone)
    and raises ``ValueError`` naming a config that cannot work."""
    interrupt: Callable[[RunConfig], str | None] | None = None
    """Whether the kind can take pause mode 'interrupt' (stop calls in flight at once and
    answer each with its tokens so far, ``finish_reason: abort``): None when it cannot;
    else a function saying why this config cannot (None when it can)."""
    driver_bound: Callable[[RunConfig], str | None] | None = None
    """Why this config's policy ends with the driver that starts it (a server the kind starts
    outside Serve), so an engine that outlives its driver (``rayrollout up``) cannot use
    it; None when it does not."""

    def deploys(self, config: RunConfig) -> bool:
        """Whether the run deploys its policy on Serve (its routes then take the run's
        token), as opposed to using a server at ``policy.base_url``."""
        return self.deploys_with(base_url=bool(config.policy.base_url))

    def deploys_with(self, *, base_url: bool) -> bool:
        """``deploys`` for a config that sets ``policy.base_url`` or not: the one fact of
        the config it turns on, so the planner asks it without handing over the config."""
        if self.build_app is None:
            return False
        return not (self.attaches and base_url)


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
    """The policy kind ``name``; raises ``UnknownPolicyKindError`` listing the known ones
    and the nearest name."""
    try:
        target = POLICY_KINDS.resolve(name).target
    except UnknownPolicyKindError as exc:
        near = difflib.get_close_matches(name, list(POLICY_KINDS.registered()), n=1)
        if not near:
            raise
        said = str(exc).replace(f"'{name}'.", f"'{name}' (did you mean '{near[0]}'?).", 1)
        raise UnknownPolicyKindError(said) from None
    kind = POLICY_KINDS.load(target, name)
    if not isinstance(kind, PolicyKind):
        raise UnknownPolicyKindError(
            f"policy kind '{name}' = '{target}' is a {type(kind).__name__}, not a "
            "rayrollout.policy.kinds.PolicyKind"
        )
    return kind


def kind_settings(config: RunConfig, model: type[S]) -> S:
    """The kind's own settings in ``config.policy`` (the keys beside the common ones), as
    ``model``: the keys alone (``PolicyConfig.settings_as`` without checks), since the
    kind's checks across the section ran when the run was planned.

    Raises:
        ConfigError: a setting the model refuses, named by its key (``policy.KEY``).
    """
    return config.policy.settings_as(model, checks=False)


def interrupt_refusal(kind: PolicyKind, config: RunConfig) -> str | None:
    """Why pause mode 'interrupt' cannot work with this kind and config, or None."""
    if kind.interrupt is None:
        return (
            f"policy kind '{kind.name}' cannot interrupt a call and keep its tokens: use "
            "pause_mode 'wait', 'abort_and_retry' or 'continue', or a kind that can (vllm, "
            "prompt_mode token_ids)"
        )
    reason = kind.interrupt(config)
    return None if reason is None else f"policy kind '{kind.name}': {reason}"


def continue_refusal(kind: PolicyKind, config: RunConfig) -> str | None:
    """Why pause mode 'continue' cannot give each token the version that made it with this
    kind and config, or None. A kind that loads weights into the server its calls run on
    (one that can interrupt) knows where an update cut a call only when it can stop and
    continue it; with any other config the server would finish the call under the new
    weights and say nothing of where the cut fell. Kinds whose server does not take
    weights from the engine (``scripted``, ``openai``) are not concerned."""
    if kind.interrupt is None or kind.interrupt(config) is None:
        return None
    return (
        f"policy kind '{kind.name}': pause_mode 'continue' would let the server finish a "
        "call under the new weights without saying where the update cut it (a chat call, "
        "prompt_mode 'messages', returns no position of the cut), so its tokens could not "
        "each carry the version that made them: set policy.prompt_mode: token_ids, or use "
        "pause_mode 'wait' or 'abort_and_retry'"
    )


PAUSE_MODES_A_KIND_MAY_REFUSE = ("interrupt", "continue")
"""The pause modes whose use depends on the kind (``pause_mode_refusal``)."""


def pause_mode_refusal(kind: PolicyKind, config: RunConfig) -> str | None:
    """Why the config's ``training.pause_mode`` cannot work with this kind, as the config
    error says it, or None (always None for a mode not in ``PAUSE_MODES_A_KIND_MAY_REFUSE``)."""
    mode = config.training.pause_mode
    if mode == "interrupt":
        refusal = interrupt_refusal(kind, config)
    elif mode == "continue":
        refusal = continue_refusal(kind, config)
    else:
        return None
    return None if refusal is None else f"invalid config: training.pause_mode: {refusal}"


@dataclass(frozen=True)
class CheckedPolicy:
    """A run's policy kind, checked against its config once
    (``api.preflight.check_policy_kind``), and whether the run deploys it: what the planning
    hands down, so that starting the run (``engine.startup``, ``engine.secret_env``) never
    asks the kind again."""

    kind: PolicyKind
    deploys: bool
    """``PolicyKind.deploys`` for the config: the run deploys the policy (its routes take
    the run's token), rather than using a server at ``policy.base_url``."""

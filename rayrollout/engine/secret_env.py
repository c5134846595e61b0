"""Secrets only where they are used: the policy key and the Ray processes of a run.

A Ray process inherits the environment of whoever started it, so a Ray that rayrollout
starts starts without secret-looking variables (``without_secrets``), and the policy key
travels to the workers only as a constructor argument (a ``SecretStr``): never in a process
environment or a ``runtime_env``, which Ray shows. A cluster rayrollout joins keeps the
environment its own ``ray start`` had.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import SecretStr

from rayrollout.data.config import RunConfig
from rayrollout.policy.kinds import policy_kind

__all__ = [
    "SECRET_NAME",
    "workers_policy_key",
    "is_secret_name",
    "policy_key",
    "route_token_path",
    "secret_names",
    "without_secrets",
]

# The rule, on the upper-cased name: a name ending in one of these words (whole words
# between underscores), or any AWS_ variable (credentials, session tokens and the config
# that finds them). RAY_ variables are Ray's own settings, kept: Ray's processes need
# RAY_AUTH_TOKEN and friends to talk to each other.
SECRET_NAME = re.compile(
    r"(?:^|_)(?:API_?KEY|TOKEN|SECRET|SECRET_KEY|ACCESS_KEY|ACCESS_KEY_ID|PASSWORD|PASSWD"
    r"|CREDENTIALS?|PRIVATE_KEY)$|^AWS_"
)
_KEPT_PREFIX = "RAY_"


def is_secret_name(name: str) -> bool:
    """Whether an environment variable is taken away from the Ray processes we start.

    Examples: ``OPENAI_API_KEY``, ``HF_TOKEN``, ``GITHUB_TOKEN``, ``MY_SECRET``,
    ``DB_PASSWORD``, ``AWS_REGION``: yes. ``PATH``, ``TOKENIZERS_PARALLELISM``,
    ``RAY_AUTH_TOKEN``: no.
    """
    upper = name.upper()
    return not upper.startswith(_KEPT_PREFIX) and SECRET_NAME.search(upper) is not None


def secret_names(environ: Iterable[str], extra: Iterable[str] = ()) -> list[str]:
    """The variables of ``environ`` to take away: those ``is_secret_name`` matches, plus
    ``extra`` (the policy key's variable, whatever it is called), sorted."""
    wanted = set(extra)
    return sorted(name for name in environ if name in wanted or is_secret_name(name))


@contextmanager
def without_secrets(extra: Iterable[str] = ()) -> Iterator[list[str]]:
    """``os.environ`` without its secrets inside the block, restored after; yields the names.

    Processes started inside the block (``ray.init`` starting a local Ray) inherit the
    environment without them. Python code of the driver running at the same time on
    another thread would not see them either, for the moment the block lasts.
    """
    taken = {name: os.environ.pop(name) for name in secret_names(os.environ, extra)}
    try:
        yield sorted(taken)
    finally:
        for name, value in taken.items():
            os.environ.setdefault(name, value)  # a value set inside the block wins


def policy_key(config: RunConfig) -> SecretStr | None:
    """The policy API key from the driver's environment (``policy.api_key_env``), wrapped so
    that a repr or a log line shows stars; None when the variable is unset or empty."""
    value = os.environ.get(config.policy.api_key_env)
    return SecretStr(value) if value else None


def workers_policy_key(
    config: RunConfig, route_token: SecretStr, deploys: bool | None = None
) -> SecretStr | None:
    """The key the workers send to the policy: the run's route token when the run deploys
    the policy (its routes take only that token), else the driver's key for the server at
    ``policy.base_url``. ``deploys`` is the planning's ``CheckedPolicy.deploys``; None: the
    kind is asked here."""
    if deploys is None:
        deploys = policy_kind(config.policy.kind).deploys(config)
    if deploys:
        return route_token
    return policy_key(config)


def route_token_path(namespace: str) -> Path:
    """Where a run's route token is written (owner-only), for a person who wants to call the
    run's Serve routes by hand: ``~/.rayrollout/route-tokens/<namespace>``."""
    return Path.home() / ".rayrollout" / "route-tokens" / namespace

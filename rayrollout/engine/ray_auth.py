"""Ray's own token authentication, asked for by rayrollout rather than left to chance.

Ray's processes listen on every interface, so without token auth anyone reaching a port can
submit tasks. Before Ray starts, rayrollout sets ``RAY_AUTH_MODE=token`` and makes the token
file its owner's alone; a user's ``RAY_AUTH_MODE=disabled`` stands, with a warning.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

__all__ = ["RAY_TOKEN_PATH", "require_ray_token_auth"]

log = logging.getLogger("rayrollout")

RAY_TOKEN_PATH = Path.home() / ".ray" / "auth_token"  # where Ray's token loader looks


def require_ray_token_auth() -> None:
    """Turn Ray's token auth on for this process and the Ray it starts or joins."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None and mode.lower() != "token":
        log.warning(
            "Ray token authentication is off (RAY_AUTH_MODE=%s): anyone who can reach this "
            "machine's Ray ports can run code in the run. Unset RAY_AUTH_MODE (or set it to "
            "'token') unless this is a throwaway test cluster",
            mode,
        )
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        _owner_only_token_file(RAY_TOKEN_PATH)
    try:  # Ray caches its config at import: make this process see token mode now
        from ray._raylet import Config  # type: ignore[attr-defined]  # not in Ray's stubs

        Config.initialize("")
    except ImportError:  # a minimal Ray without the raylet: nothing cached
        pass


def _owner_only_token_file(path: Path) -> None:
    """Create Ray's token file if missing; make an existing one of ours owner-only (0600)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32))
        return
    info = path.stat()
    if info.st_uid == os.getuid() and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        os.chmod(path, 0o600)

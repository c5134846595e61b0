"""NeMo Gym's entrypoint for a rayrollout environment: ``ng_run`` starts it like its own servers.

``ng_run`` starts every server it is configured with by running ``app.py`` in the server's
folder with NeMo Gym's interpreter; a resources server it did not write still needs one.
This one runs ``rayrollout env serve ENVIRONMENT --host HOST --port PORT`` in its place
(``exec``, so ng_run's signals reach the server itself), on the host and port of its config
block. NeMo Gym's agents then address it by ``host:port`` as any resources server. They
send no credentials (0.7.0's ServerClient builds ``http://host:port/route`` and no headers),
so this entrypoint serves with ``--no-auth``: keep ``host`` a loopback or private address.

The block (see docs/how-to/nemo-gym.md), under ``resources_servers: rayrollout_env:``::

    entrypoint: app.py
    environment: weather          # a registered rayrollout environment or "module:Class"
    host: 127.0.0.1
    port: 8123
    rayrollout: /path/to/venv/bin/rayrollout   # optional; default: `rayrollout` on PATH
    serve_args: [--replicas, "2"]              # optional; more `env serve` flags

The environment runs in rayrollout's install and its own Ray, not in NeMo Gym's venv: Ray's
address from NeMo Gym's environment is removed so the two never share a cluster by accident.
"""

from __future__ import annotations

import os
import shutil
import sys

import yaml

_SERVER_KEY = "rayrollout_env"
# NeMo Gym's and Python's settings that must not leak into rayrollout's process.
_NOT_INHERITED = ("RAY_ADDRESS", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")


def _block() -> dict:
    config = yaml.safe_load(os.environ.get("NEMO_GYM_CONFIG_DICT", "") or "{}")
    name = os.environ.get("NEMO_GYM_CONFIG_PATH", "")
    try:
        return config[name]["resources_servers"][_SERVER_KEY]
    except (KeyError, TypeError):
        sys.exit(
            f"rayrollout_env: no 'resources_servers: {_SERVER_KEY}:' block under '{name}' in "
            "NeMo Gym's config; start this entrypoint through ng_run with such a block"
        )


def main() -> None:
    block = _block()
    missing = [key for key in ("environment", "host", "port") if not block.get(key)]
    if missing:
        sys.exit(f"rayrollout_env: the config block needs {', '.join(missing)}")
    executable = str(block.get("rayrollout") or "rayrollout")
    found = shutil.which(executable)
    if found is None:
        sys.exit(
            f"rayrollout_env: {executable!r} is not an executable on PATH; set 'rayrollout:' "
            "in the block to the rayrollout command of the venv rayrollout is installed in"
        )
    command = [
        found, "env", "serve", str(block["environment"]),
        "--host", str(block["host"]), "--port", str(block["port"]), "--no-auth",
        *map(str, block.get("serve_args") or []),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    sys.stdout.flush()
    os.execve(found, command, env)


if __name__ == "__main__":
    main()

"""Network helpers shared by test modules (a plain module: ``conftest`` names are shadowed
when pytest loads the cluster tier's own conftest)."""

import socket


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (tests never bind other addresses)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

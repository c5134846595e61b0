"""A free port for a server that binds it later, in another process or after Ray starts.

A port the kernel hands out (``bind`` to port 0) comes from its ephemeral range, the same
range every outgoing connection takes its local port from. Between choosing such a port and
the server binding it, Ray's own processes open hundreds of connections, and one of them can
take it: the server then fails with "Address already in use". A port chosen below the
ephemeral range, and above the ports Ray gives its workers, is taken only by a program that
asks for it by number.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_START = 32768  # Linux's default when the range cannot be read
FIRST_PORT_ABOVE_RAY_WORKERS = 20000  # Ray's workers take 10002-19999 by default
TRIES = 200

_choose = random.SystemRandom()  # independent of any seed a test or a trainer sets


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range."""
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_START


def tcp_socket(host: str) -> socket.socket:
    """A TCP socket of the address family ``host`` is written in (IPv6 where it has a colon)."""
    return socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)


def can_bind(host: str, port: int) -> bool:
    """Whether ``port`` on ``host`` can be bound now (nothing listens on it)."""
    with tcp_socket(host) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that is free now and that no outgoing connection will take.

    Falls back to a kernel-chosen port where the ephemeral range leaves no room below it.
    """
    low, high = FIRST_PORT_ABOVE_RAY_WORKERS, ephemeral_start()
    if high - low >= 1000:
        for _ in range(TRIES):
            port = _choose.randrange(low, high)
            if can_bind(host, port):
                return port
    with tcp_socket(host) as probe:
        probe.bind((host, 0))
        chosen: int = probe.getsockname()[1]
        return chosen

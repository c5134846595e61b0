"""Fixtures of the code environment's tests: a planted key, victims outside the sandbox."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from escape_kit import KEY


@pytest.fixture(autouse=True)
def planted_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


@pytest.fixture
def victim():
    """A process of the host (as root) that sandboxed code must not signal or trace."""
    process = subprocess.Popen(["sleep", "120"])
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file on the host, outside any sandbox, with something worth stealing in it."""
    path = tmp_path / "outside.txt"
    path.write_text("outside-secret")
    return path


@pytest.fixture
def listening_port():
    """A TCP server on 127.0.0.1 that sandboxed code must not reach."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        yield server

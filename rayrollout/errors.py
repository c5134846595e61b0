"""One exception tree: ``RayrolloutError`` and a base per boundary a failure crosses.

A caller catches "anything rayrollout refused" in one clause (``except RayrolloutError``), or
one boundary (``except InputError``), the way httpx's ``_exceptions.py`` lets a caller catch
any transport error. Every exception class in rayrollout derives from one base here and keeps
its builtin base too (``class ConfigError(InputError, ValueError)``), so code written against
``except ValueError`` catches it as well.

The bases derive from ``RayrolloutError`` only, never from a builtin: a class picks its own
builtin (``ValueError``, ``LookupError``, ``RuntimeError``), so joining the tree never makes
an ``except ValueError`` catch something it did not catch before.

Inside an episode, failures stay data (a trajectory's ``status`` and ``error``); these types
reach a caller only where a run as a whole cannot go on: bad input before anything runs, an
output folder that cannot be written, an engine or app missing or taken, a trainer's batch
with more failed episodes than its adapter accepts.

The command line turns them into one line, ``error: <message>``, with exit code 2 for an
``InputError`` (fix the command or its files) and 1 for the rest (``exit_code``).

May import: nothing of rayrollout (every part imports this module).
"""

from __future__ import annotations

__all__ = [
    "ClusterError",
    "EnvironmentBoundaryError",
    "EpisodesFailedError",
    "InputError",
    "OutputError",
    "PolicyBoundaryError",
    "RayrolloutError",
    "exit_code",
]


class RayrolloutError(Exception):
    """Anything rayrollout refused or could not do; the message says what, where, and the fix."""


class InputError(RayrolloutError):
    """What the user gave is wrong: a task row, the config, a flag, a file to export."""


class PolicyBoundaryError(RayrolloutError):
    """The policy side failed: the model server, its answers, its weights or chat template.

    Named for the boundary because ``PolicyError`` (``rayrollout.policy.client``) is one of
    its members: the policy server failing a call.
    """


class EnvironmentBoundaryError(RayrolloutError):
    """The environment side failed: a tool, a replica, a session, a remote resources server.

    Named for the boundary because Python's builtin ``EnvironmentError`` (an alias of
    ``OSError``) already has the short name.
    """


class OutputError(RayrolloutError):
    """The output folder cannot be written or read: permissions, a full disk, a held lock."""


class ClusterError(RayrolloutError):
    """The engine, the service or an app of the run is missing on the Ray cluster, or taken by
    another run."""


class EpisodesFailedError(RayrolloutError):
    """Too many of a batch's episodes failed for a trainer to go on. Each failure is a row with
    its own ``status`` and ``error`` (the policy's or the environment's side); this is the
    batch as a whole, so it belongs to neither boundary."""


def exit_code(error: RayrolloutError) -> int:
    """The command line's exit code for ``error``: 2 for bad input (as for a bad flag), else 1."""
    return 2 if isinstance(error, InputError) else 1

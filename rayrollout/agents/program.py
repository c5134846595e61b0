"""Any program as the agent: run it per episode against the recording gateway.

For an agent that already exists as a program (an OpenAI SDK script, an agent framework's
CLI) rather than as a ``play``: each episode starts ``command`` as a subprocess whose
OpenAI client finds the episode's recording gateway in its environment, so every model call
it makes is recorded token-exact (``rayrollout.agentkit.gateway``). Configure it in the run::

    agent: program
    agent_settings:
      program:
        args: {command: [python, examples/openai_agent.py], timeout_s: 300}

What the program gets (and nothing else of the agent's environment: the run's secrets, the
policy key and Ray's settings stay out):

* ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``: the episode's endpoint and its key (``OpenAI()``
  reads both).
* ``RAYROLLOUT_TASK_FILE``: a JSON file with ``messages`` (the prompt), ``tools`` (chat
  form), ``fields`` (the task's verifier fields), ``task_id``, ``environment``, ``model``
  and ``sampling``.
* ``RAYROLLOUT_TOOLS_URL``: ``POST $RAYROLLOUT_TOOLS_URL/<name>`` with the JSON arguments
  runs the environment's tool and answers its result.
* ``RAYROLLOUT_EPISODE_ID``; ``PATH`` (this Python's folder first, so ``python`` is the
  interpreter rayrollout runs in, with its packages), ``HOME``, ``LANG``, ``TMPDIR`` and
  the like, ``PYTHONUNBUFFERED=1``; then ``env`` from the args.

It runs in ``cwd`` (default: the worker actor's working directory, which for a local Ray is
the one the run was started from, so relative paths read as in the command line).

The transcript the verifier reads is what the program sent and got through the gateway. A
program that prints its final answer to stdout after its last tool call (so the transcript
does not end with an assistant answer) has that printed text appended as the final
assistant message; when the transcript already ends with one, stdout is left alone.

Ends: exit status 0 is a played episode (the environment's verifier scores it); any other
is ``error`` with the end of its stderr; past ``timeout_s`` the program is killed and the
episode is ``timeout``; an end a model or tool call ran into (``max_turns``, the policy
failing for good) ends the episode at once with that status. Whatever ends the episode
(the episode's own time limit cancelling ``play`` included), the program's whole process
group is killed and reaped: no process of it outlives its episode (a child that leaves the
group on purpose, with ``setsid``, is out of reach, as for any process supervisor).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from rayrollout.agentkit import Agent, AgentEpisode, EpisodeEnd
from rayrollout.agentkit.gateway import GatewayEndpoint
from rayrollout.data.schema import Message

__all__ = ["ProgramAgent"]

# What a program inherits of the agent's environment: enough to run, nothing secret.
_BASE_ENV = ("HOME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME")
_STDOUT_KEPT = 1 << 20  # the last MiB of stdout is read: the final answer
_STDERR_KEPT = 1 << 14  # the last 16 KiB of stderr: the error's reason
_ERROR_TAIL = 2000  # characters of stderr in an episode's error


class ProgramAgent(Agent):
    """Run a program (an OpenAI SDK script) per episode against the recording gateway."""

    name: ClassVar[str] = "program"

    def __init__(
        self,
        command: list[str],
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> None:
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(part, str) for part in command)
        ):
            raise ValueError(f"command must be a non-empty list of strings, got {command!r}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be above 0, got {timeout_s}")
        self.command = list(command)
        self.timeout_s = timeout_s
        self.env = dict(env or {})
        self.cwd = cwd
        self.shown = _brief(shlex.join(self.command), 200)

    async def play(self, episode: AgentEpisode) -> None:
        async with episode.gateway() as endpoint:
            with tempfile.TemporaryDirectory(prefix="rayrollout-program-") as folder:
                stdout = await self._run(episode, endpoint, Path(folder))
        _append_answer(episode, stdout)

    async def _run(self, episode: AgentEpisode, endpoint: GatewayEndpoint, folder: Path) -> str:
        """Run the program to its end; returns its stdout. Raises the episode's end.

        Its output goes to files, not pipes: a child the program leaves behind holding a
        pipe would keep asyncio waiting for the pipe after the program exited, and a chatty
        program cannot fill a file the way it fills a pipe nobody reads.
        """
        task_file = folder / "task.json"
        task_file.write_text(json.dumps(_task_json(episode), default=str))
        out_path, err_path = folder / "stdout", folder / "stderr"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            process = await asyncio.create_subprocess_exec(
                *self.command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=self._environment(episode, endpoint, task_file),
                cwd=self.cwd,
                start_new_session=True,  # its own process group: killed whole, children too
            )
        try:
            exited = asyncio.ensure_future(process.wait())
            ended = asyncio.ensure_future(endpoint.wait_end())
            try:
                await asyncio.wait(
                    {exited, ended}, timeout=self.timeout_s, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                ended.cancel()
            if endpoint.end is not None:  # a call ran into the episode's end: that is the end
                raise endpoint.end
            if not exited.done():
                exited.cancel()
                raise EpisodeEnd(
                    "timeout",
                    f"agent '{self.name}': command {self.shown} did not exit within "
                    f"{self.timeout_s}s (killed; {_spent(episode, err_path)})",
                )
            _kill_group(process.pid)  # children it left behind
            code = exited.result()
            if code != 0:
                how = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
                stderr = _stderr_tail(err_path)
                raise EpisodeEnd(
                    "error",
                    f"agent '{self.name}': command {self.shown} {how}: {stderr or '(no stderr)'}",
                )
            return _read_tail(out_path, _STDOUT_KEPT)
        finally:
            await _reap(process)

    def _environment(
        self, episode: AgentEpisode, endpoint: GatewayEndpoint, task_file: Path
    ) -> dict[str, str]:
        env = {name: os.environ[name] for name in _BASE_ENV if name in os.environ}
        here = os.path.dirname(sys.executable)
        env["PATH"] = os.pathsep.join(p for p in (here, os.environ.get("PATH", "")) if p)
        env.update(
            OPENAI_BASE_URL=endpoint.base_url,
            OPENAI_API_KEY=endpoint.api_key,
            RAYROLLOUT_TASK_FILE=str(task_file),
            RAYROLLOUT_TOOLS_URL=endpoint.tools_url,
            RAYROLLOUT_EPISODE_ID=episode.episode_id,
            PYTHONUNBUFFERED="1",
        )
        env.update(self.env)
        return env


def _task_json(episode: AgentEpisode) -> dict[str, Any]:
    """What the program reads from ``RAYROLLOUT_TASK_FILE``."""
    task = episode.task
    return {
        "task_id": task.task_id,
        "environment": task.environment,
        "episode_id": episode.episode_id,
        "model": episode.policy.config.model,
        "messages": [m.to_openai() for m in task.prompt],
        "tools": episode.tools,
        "fields": task.fields,
        "sampling": task.sampling.model_dump(exclude_none=True) if task.sampling else {},
    }


def _spent(episode: AgentEpisode, err_path: Path) -> str:
    """Where a killed program's time went: its model calls' share (a slow policy, not a
    stuck program, is the usual reason) and the end of its stderr."""
    metrics = episode.trajectory.metrics
    calls = len(episode.trajectory.turns)
    spent = f"{calls} model call{'s' * (calls != 1)} took {metrics.seconds_model:.0f}s of it"
    stderr = _stderr_tail(err_path)
    return f"{spent}; stderr: {stderr}" if stderr else spent


def _stderr_tail(err_path: Path) -> str:
    """The end of the program's stderr, as an episode's error quotes it."""
    return _brief(_read_tail(err_path, _STDERR_KEPT), _ERROR_TAIL)


def _append_answer(episode: AgentEpisode, stdout: str) -> None:
    """The printed answer as the final assistant message, unless the transcript has one."""
    answer = stdout.strip()
    last = episode.messages[-1] if episode.messages else None
    if not answer or (last is not None and last.role == "assistant" and not last.tool_calls):
        return
    episode.messages.append(Message(role="assistant", content=answer))


def _read_tail(path: Path, keep: int) -> str:
    """The last ``keep`` bytes of a file, as text."""
    with open(path, "rb") as file:
        file.seek(max(0, file.seek(0, os.SEEK_END) - keep))
        return file.read().decode("utf-8", errors="replace")


def _kill_group(pid: int) -> None:
    """SIGKILL the program's process group (the program and every child it left)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _reap(process: asyncio.subprocess.Process) -> None:
    """Kill the program's group and wait for the program, even while ``play`` is being
    cancelled (the episode's time limit): it must not outlive the episode, nor stay a
    zombie of the agent. A cancellation that comes meanwhile is raised once it is reaped."""
    _kill_group(process.pid)
    waiting = asyncio.ensure_future(process.wait())
    cancelled = False
    while not waiting.done():
        try:
            await asyncio.shield(waiting)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


def _brief(text: str, limit: int) -> str:
    """``text`` stripped, at most ``limit`` characters (its end: where errors are)."""
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]

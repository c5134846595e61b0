"""``rayrollout show``: one trajectory as a readable conversation in the terminal.

Images are named under their message (size, type, where the run keeps them), and a
reset/step episode gets a table of step rewards. The row is found by ``RunFolder``'s
filtered scan, so a large output folder is never loaded whole.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from rayrollout.data.images import decode_data_url, image_digest, image_size, is_data_url
from rayrollout.data.run_folder import RunFolder
from rayrollout.data.schema import Message, Trajectory, version_spans

__all__ = ["find_trajectories", "image_lines", "render_trajectory"]

_ROLE_STYLE = {"system": "magenta", "user": "cyan", "assistant": "green", "tool": "yellow"}


def find_trajectories(directory: str | Path, task_id: str) -> list[Trajectory]:
    """Every sample of one task in an output folder (Parquet or JSONL parts, old or new)."""
    found = RunFolder(directory).trajectories(task_id=task_id)
    return sorted(found, key=lambda t: t.sample_index)


def image_lines(message: Message, stored_as: str) -> list[str]:
    """One line per image a message shows: its size in pixels and bytes, its type, and
    where the run keeps it (``stored_as``: the folder's format, ``parquet`` or ``jsonl``)."""
    lines = []
    for n, part in enumerate(message.images, start=1):
        url = part.url or ""
        if not is_data_url(url):
            lines.append(f"image {n}: {url}  (a URL: not stored, the policy server fetches it)")
            continue
        mime, data = decode_data_url(url)
        width, height = image_size(data)
        pixels = f"{width}x{height}" if width is not None else "size unread"
        where = (
            f"stored once in the row's images column, sha256 {image_digest(data)[:12]}"
            if stored_as == "parquet"
            else "inline data URL in the row"
        )
        lines.append(f"image {n}: {pixels} {mime}, {_kilobytes(len(data))}, {where}")
    return lines


def _kilobytes(size: int) -> str:
    return f"{size / 1024:.1f} KB" if size >= 1024 else f"{size} B"


def _message_panel(message: Message, stored_as: str = "parquet") -> Panel:
    parts: list[Text] = []
    if message.content:
        parts.append(Text(message.content))
    parts += [Text(line, style="blue") for line in image_lines(message, stored_as)]
    for call in message.tool_calls or []:
        parts.append(
            Text.assemble(
                ("call ", "bold"),
                (call.function.name, "bold yellow"),
                f"({call.function.arguments})  ",
                (f"[{call.id}]", "dim"),
            )
        )
    title: str = message.role
    if message.role == "tool":
        title = f"tool {message.name or ''} [{message.tool_call_id}]"
    return Panel(
        Group(*parts) if parts else Text("(empty)", style="dim"),
        title=title,
        title_align="left",
        border_style=_ROLE_STYLE.get(message.role, "white"),
    )


def render_trajectory(trajectory: Trajectory, console: Console, stored_as: str = "parquet") -> None:
    """Print the episode: header, every message (and the images it shows), the verdict and
    where the time went. ``stored_as`` is the format of the folder it was read from."""
    status_style = "green" if trajectory.status == "ok" else "red"
    header = Table.grid(padding=(0, 2))
    header.add_row("task", f"{trajectory.task_id}  sample {trajectory.sample_index}")
    header.add_row("environment", trajectory.environment)
    header.add_row("model", f"{trajectory.model}  (policy version {trajectory.policy_version})")
    played = trajectory.played_by or "-"
    header.add_row("agent", f"{played}  (on {trajectory.worker})" if trajectory.worker else played)
    header.add_row("status", Text(trajectory.status, style=status_style))
    header.add_row("reward", f"{trajectory.reward:.3f}")  # any finite float: -1.000, 3.000
    if trajectory.error:
        header.add_row("error", Text(trajectory.error, style="red"))
    console.print(Panel(header, title="trajectory", title_align="left"))
    for message in trajectory.messages:
        console.print(_message_panel(message, stored_as))
    if trajectory.verification:
        console.print(
            Panel(
                json.dumps(trajectory.verification, indent=2, ensure_ascii=False),
                title="verification",
                title_align="left",
            )
        )
    m = trajectory.metrics
    timing = Table(
        "turns",
        "tool calls",
        "tool errors",
        "tokens in/out",
        "model s",
        "tools s",
        "verify s",
        "total s",
        title="metrics",
    )
    timing.add_row(
        str(m.turns),
        str(m.tool_calls),
        str(m.tool_errors),
        f"{m.tokens_in}/{m.tokens_out}",
        f"{m.seconds_model:.3f}",
        f"{m.seconds_tools:.3f}",
        f"{m.seconds_verify:.3f}",
        f"{m.seconds_total:.3f}",
    )
    console.print(timing)
    if m.timeline:
        steps = Table("at s", "step", "seconds", "ok", title="timeline")
        for event in m.timeline:
            label = f"{event.kind} {event.name}".strip()
            steps.add_row(
                f"{event.start_s:.3f}",
                label,
                f"{event.seconds:.3f}",
                "yes" if event.ok else Text("no", style="red"),
            )
        console.print(steps)
    if trajectory.turns:
        turns = Table(
            "turn",
            "speaker",
            "sent",
            "extends",
            "finish",
            "prompt ids",
            "completion ids",
            "logprobs",
            "versions",
            "images",
            "seconds",
            title="model calls",
        )
        for i, turn in enumerate(trajectory.turns):
            sent = (
                f"{len(turn.sent_messages)} own"
                if turn.sent_messages is not None
                else f"first {turn.prompt_message_count}"
            )
            shown = (
                turn.sent_messages
                if turn.sent_messages is not None
                else trajectory.messages[: turn.prompt_message_count]
            )
            turns.add_row(
                str(i),
                turn.speaker,
                sent,
                "yes" if turn.extends_previous else "no",
                turn.finish_reason or "-",
                str(len(turn.prompt_token_ids)),
                str(len(turn.completion_token_ids)),
                str(len(turn.logprobs)),
                _versions(turn.token_versions, turn.policy_version),
                _turn_images(shown),
                f"{turn.seconds:.3f}",
            )
        console.print(turns)
    _constrained_calls(trajectory, console)
    _step_rewards(trajectory, console)


def _constrained_calls(trajectory: Trajectory, console: Console) -> None:
    """The model calls a constraint shaped (``tool_choice: required``, a grammar): how many
    of their tokens it forced, and the largest gap in nats between the model's own logprob
    of a token and the sampled one ('-' where the model's own are not recorded)."""
    shaped = [(i, t) for i, t in enumerate(trajectory.turns) if t.forced]
    if not shaped:
        return
    table = Table("turn", "forced", "generated", "max |own - sampled|", title="constrained calls")
    for i, turn in shaped:
        gap = "-"
        if turn.model_logprobs and len(turn.model_logprobs) == len(turn.logprobs):
            pairs = zip(turn.model_logprobs, turn.logprobs, strict=True)
            gap = f"{max(abs(own - sampled) for own, sampled in pairs):.3f}"
        table.add_row(str(i), str(sum(turn.forced)), str(len(turn.forced)), gap)
    console.print(table)


def _versions(token_versions: list[int], policy_version: int) -> str:
    """Which weights made the turn's tokens: '3', or '3 (0-41), 4 (42-95)' for a call a
    weight update cut."""
    spans = version_spans(token_versions)
    if len(spans) <= 1:
        return str(spans[0][0] if spans else policy_version)
    return ", ".join(f"{v} ({first}-{last})" for v, first, last in spans)


def _turn_images(messages: list[Message]) -> str:
    """The images a model call was sent: how many, and how many of them are distinct."""
    urls = [part.url for message in messages for part in message.images]
    if not urls:
        return "-"
    distinct = len(set(urls))
    return f"{len(urls)}" if distinct == len(urls) else f"{len(urls)} ({distinct} distinct)"


def _step_rewards(trajectory: Trajectory, console: Console) -> None:
    """The reward of each environment step, by the model call whose reply was its action,
    and their running sum (a reset/step episode's reward is their sum unless its
    environment says otherwise)."""
    stepped = [
        (i, t.step_reward) for i, t in enumerate(trajectory.turns) if t.step_reward is not None
    ]
    if not stepped:
        return
    table = Table("step", "turn", "reward", "sum so far", title="environment steps")
    total = 0.0
    for number, (turn, reward) in enumerate(stepped, 1):
        total += reward
        table.add_row(str(number), str(turn), f"{reward:.3f}", f"{total:.3f}")
    console.print(table)

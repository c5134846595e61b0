"""A plain OpenAI SDK tool-calling agent, as anyone would write one; rayrollout runs it as is.

Nothing here knows about rayrollout's internals: ``OpenAI()`` reads OPENAI_BASE_URL and
OPENAI_API_KEY from the environment, which the ``program`` agent points at the episode's
recording gateway, so every model call below is recorded for training. The task comes from
the JSON file named by RAYROLLOUT_TASK_FILE; tools run by POSTing their arguments to
RAYROLLOUT_TOOLS_URL/<name>. Run it per episode with::

    agent: program
    agent_settings: {program: {args: {command: [python, examples/openai_agent.py]}}}
"""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any

from openai import OpenAI

MAX_STEPS = 10


def run_tool(name: str, arguments: str) -> str:
    """Run one tool of the environment; its result is what the model reads next."""
    request = urllib.request.Request(
        f"{os.environ['RAYROLLOUT_TOOLS_URL']}/{name}",
        data=arguments.encode(),
        headers={
            "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read().decode()


def main() -> None:
    with open(os.environ["RAYROLLOUT_TASK_FILE"]) as file:
        task = json.load(file)
    client = OpenAI()
    messages: list[Any] = list(task["messages"])
    offered = {"tools": task["tools"]} if task["tools"] else {}
    for _ in range(MAX_STEPS):
        response = client.chat.completions.create(
            model=task.get("model", "gpt-4o-mini"), messages=messages, **offered
        )
        message = response.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            print(message.content or "")
            return
        for call in message.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    raise SystemExit(f"no answer after {MAX_STEPS} model calls")


if __name__ == "__main__":
    main()

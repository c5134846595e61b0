"""Two roles: the policy is the assistant with tools, a simulated user answers it.

Multi-turn tasks (a customer who adds a detail, a follow-up question) need someone on the
user's side. The policy plays the tool loop; each time it answers without a tool call, the
simulated user replies and the loop goes on, for up to ``max_user_turns`` replies. The user
is either

* scripted: the task's ``user_turns`` field, a list of strings said in order; or
* played by the model (``speaker="user"``) when the task has none, as the persona in the
  task's ``user_persona`` field (else ``persona``). It is shown its own view of the
  conversation: the persona as the system message, then the text of the conversation with
  the roles swapped (the user's words as its own ``assistant`` turns, the assistant's
  answers as ``user`` messages; tool calls and results are the assistant's business and
  left out).

A reply holding ``stop_marker`` (``[[done]]``), or the script or ``max_user_turns`` running
out, ends the episode. Each user reply joins the transcript as a ``user`` message (the
stopping one too, so the record shows why it ended). A policy answer on the episode's last
allowed turn, with the user still to speak, ends it as ``max_turns`` (the user is not asked
for a reply nobody could answer).

What is recorded (see ``rayrollout.agentkit.episode``): the policy's turns are one token
sequence across the user's replies (each call sends the whole transcript, which extends the
previous call by its reply, tool results and the user's message). The model-played user's
turns record ``speaker="user"`` and ``sent_messages`` (its view is not the transcript) and
form their own sequence: its view only ever grows by its reply and the assistant's next
answer. A trainer keeps the ``policy`` turns.
"""

from __future__ import annotations

from rayrollout.agentkit import Agent, AgentEpisode, OutOfTurns
from rayrollout.data.schema import Message

USER = "user"  # the speaker of the simulated user's model calls

DEFAULT_PERSONA = (
    "You are a user talking to an AI assistant about the request you opened the conversation "
    "with. Reply in one or two short sentences, as that user would: ask a follow-up, correct "
    "the assistant, or add a detail. When your request is fully handled, say thanks and end "
    "your message with [[done]]."
)


class SimulatedUser(Agent):
    """The tool loop with a simulated user who replies to each answer (scripted or played)."""

    def __init__(
        self, max_user_turns: int = 2, stop_marker: str = "[[done]]", persona: str = DEFAULT_PERSONA
    ) -> None:
        """``max_user_turns``: user replies at most; ``stop_marker``: what a user says to end
        the episode; ``persona``: the played user's system prompt for tasks that give none."""
        if max_user_turns < 0 or not stop_marker:
            raise ValueError("max_user_turns must be >= 0 and stop_marker not empty")
        self.max_user_turns = max_user_turns
        self.stop_marker = stop_marker
        self.persona = persona

    async def play(self, episode: AgentEpisode) -> None:
        script = user_script(episode)
        persona = str(episode.task.fields.get("user_persona") or self.persona)
        view: list[Message] = []  # the model-played user's own conversation
        said = 0  # user replies so far
        while True:
            reply = await episode.model()  # the policy; raises OutOfTurns past max_turns
            episode.messages.append(reply)
            if reply.tool_calls:
                await episode.run_tools(reply)
                continue
            if said >= self.max_user_turns or (script is not None and said >= len(script)):
                return
            if episode.turns_left <= 0:  # the policy could not answer: spare the user's call
                raise OutOfTurns(f"the episode used its {episode.limits.max_turns} model calls")
            if script is not None:
                text = script[said]
            else:
                if not view:  # first reply: the conversation so far, seen from its side
                    view = [Message(role="system", content=persona), *swap_roles(episode.messages)]
                else:  # later: the assistant's newest answer (the user's own reply is in)
                    view.append(Message(role="user", content=reply.content or ""))
                answer = await episode.model(view, tools=[], speaker=USER)
                view.append(answer)
                text = (answer.content or "").strip()
            said += 1
            episode.messages.append(Message(role="user", content=text))
            if self.stop_marker in text:
                return


def user_script(episode: AgentEpisode) -> list[str] | None:
    """The task's ``user_turns`` (None when it has none); a row that is not a list of
    strings fails the episode, naming the field."""
    script = episode.task.fields.get("user_turns")
    if script is None:
        return None
    if not isinstance(script, list) or not all(isinstance(line, str) for line in script):
        raise ValueError(f"task field 'user_turns' must be a list of strings, not {script!r:.80}")
    return script


def swap_roles(messages: list[Message]) -> list[Message]:
    """The conversation as the user sees it: its own messages as ``assistant``, the
    assistant's answers (messages without tool calls) as ``user``; system prompts, tool
    calls and their results left out."""
    swapped = []
    for message in messages:
        if message.role == "user":
            swapped.append(Message(role="assistant", content=message.content or ""))
        elif message.role == "assistant" and not message.tool_calls:
            swapped.append(Message(role="user", content=message.content or ""))
    return swapped

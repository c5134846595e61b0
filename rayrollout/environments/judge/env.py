"""Judge: a lookup tool for facts, and answers graded by a judge model instead of a rule.

The task asks a question; its ``notes`` field holds passages the ``lookup`` tool searches and
its ``reference_answer`` what a correct answer says. The verifier sends the question, the
reference and the model's final answer to a judge model over the OpenAI Chat Completions
protocol (any OpenAI-compatible endpoint, or a Ray Serve app serving that protocol) and
reads a ``VERDICT: CORRECT`` or ``VERDICT: INCORRECT`` line back; the judge's whole reply
goes in ``verification``.

Which judge: the task's ``judge`` field (``{"base_url": ..., "model": ..., "api_key_env":
...}``), else the class attributes, so a deployment subclasses ``JudgeEnv`` once and
registers it. A judge that cannot be reached or answers no verdict fails the episode's
verification (status ``error``) rather than scoring it 0: a broken judge is not a wrong
answer.
"""

from __future__ import annotations

import asyncio
import os
import re
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from rayrollout.envkit import Environment, Episode, ToolError, Verification, tool

if TYPE_CHECKING:
    import openai

JUDGE_PROMPT = """You grade answers to questions against a reference answer.

Question:
{question}

Reference answer:
{reference}

Candidate answer:
{answer}

Is the candidate answer correct, that is, does it state what the reference answer states?
Explain briefly, then end with one line: VERDICT: CORRECT or VERDICT: INCORRECT."""
_VERDICT = re.compile(r"VERDICT:\s*(CORRECT|INCORRECT)\b")
_WORD = re.compile(r"[a-z0-9]+")


class JudgeSettings(BaseModel):
    """Where the judge model is (a task's ``judge`` field, or the class's defaults)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(default=None, description="OpenAI-compatible base URL.")
    model: str = Field(default="judge", description="Model name sent to the judge endpoint.")
    api_key_env: str = Field(
        default="JUDGE_API_KEY", description="Environment variable holding the judge's key."
    )
    timeout_s: float = Field(default=60.0, gt=0, description="Timeout of one judge call.")
    max_retries: int = Field(default=2, ge=0, description="Retries on 429, 5xx and timeouts.")


_clients: dict[tuple[str, str, int], openai.AsyncOpenAI] = {}


def _client(settings: JudgeSettings, base_url: str) -> openai.AsyncOpenAI:
    """One client (one connection pool) per judge endpoint and event loop, reused by episodes."""
    key = (base_url, settings.api_key_env, id(asyncio.get_running_loop()))
    if key not in _clients:
        # Imported at the first judge call, not with the class (about a second of CPU): the
        # checks before a run and the demo's task list look the class up in the driver.
        import openai

        _clients[key] = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=os.environ.get(settings.api_key_env) or "not-needed",
            timeout=settings.timeout_s,
            max_retries=settings.max_retries,
        )
    return _clients[key]


class JudgeEnv(Environment):
    """Questions answered from notes; a judge model decides whether the answer is right."""

    name = "judge"
    default_hosting = "inline"  # the tool is a word overlap; the judge is one HTTP call
    judge: ClassVar[JudgeSettings] = JudgeSettings()

    @tool
    async def lookup(self, query: str) -> str:
        """Find the note that best matches a query.

        Args:
            query: What to look up, in plain words, e.g. "capital of Australia".
        """
        notes: list[str] = self.task.fields.get("notes") or []
        words = set(_WORD.findall(query.lower()))
        # Plain word overlap, on purpose: a toy retriever that can pick the wrong note, so
        # the judge has wrong answers to catch.
        scored = [(len(words & set(_WORD.findall(n.lower()))), -i, n) for i, n in enumerate(notes)]
        best = max(scored, default=(0, 0, ""))
        if best[0] == 0:
            raise ToolError(f"no note matches {query!r}; try other words")
        return best[2]

    def judge_settings(self) -> JudgeSettings:
        """The task's ``judge`` field over the class's defaults."""
        override: dict[str, Any] = self.task.fields.get("judge") or {}
        return self.judge.model_copy(
            update=JudgeSettings.model_validate(override).model_dump(exclude_unset=True)
        )

    async def verify(self, episode: Episode) -> Verification:
        """Ask the judge; reward 1.0 for ``VERDICT: CORRECT``, 0.0 for ``INCORRECT``."""
        answer = episode.final_answer()
        if not answer.strip():  # nothing to grade: no judge call spent on it
            return Verification(reward=0.0, details={"verdict": "no answer"})
        settings = self.judge_settings()
        if settings.base_url is None:
            raise ValueError(
                "no judge endpoint: give the task a 'judge': {'base_url': ..., 'model': ...} "
                "field, or subclass JudgeEnv with judge = JudgeSettings(base_url=...)"
            )
        question = next((m.content for m in reversed(episode.task.prompt) if m.role == "user"), "")
        prompt = JUDGE_PROMPT.format(
            question=question,
            reference=episode.task.fields.get("reference_answer", ""),
            answer=answer or "(no answer)",
        )
        reply = await _client(settings, settings.base_url).chat.completions.create(
            model=settings.model,
            messages=[{"role": "user", "content": prompt}],
            temperature=0.0,
        )
        text = reply.choices[0].message.content or ""
        verdicts = _VERDICT.findall(text)
        if not verdicts:
            raise ValueError(
                f"the judge {settings.model!r} at {settings.base_url} gave no 'VERDICT: CORRECT' "
                f"or 'VERDICT: INCORRECT' line: {text[:300]!r}"
            )
        verdict = verdicts[-1].lower()
        return Verification(
            reward=1.0 if verdict == "correct" else 0.0,
            details={"verdict": verdict, "judge_model": settings.model, "judge_reply": text},
        )

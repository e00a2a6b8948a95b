"""How a failed judge call is charged to a rollout: `JudgeFailure` (the one form a failure
takes from the relay, over a shared stack's lease socket, to the harness) and `JudgeStatus`.

NeMo Gym's judge calls carry nothing that ties them to a rollout. A failure is charged to the
rollout whose question its prompt quotes; one whose prompt quotes no recent rollout's question
cannot be charged to one, so every rollout verified while it happened fails with it (an error,
never the score NeMo Gym gave instead).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

from verifiers_nemogym.bridge.responses import message_text

PROMPT_KEPT = 256 * 1024
"""Characters of a failed judge call's prompt kept to charge the failure to its rollout."""
_FAILURES_KEPT = 256
_QUESTION_HEAD = 200
_MARK_MIN = 30
_MARKS = 5
_QUESTIONS_KEPT = 4096


@dataclass(frozen=True)
class JudgeFailure:
    """A judge call that failed: the message naming the judge and why (redacted), when
    (seconds since the epoch), and the call's prompt (`prompt_text`, whitespace collapsed, cut
    to `PROMPT_KEPT`)."""

    message: str
    at: float
    prompt: str = ""

    @classmethod
    def now(cls, message: str, prompt: str = "") -> JudgeFailure:
        return cls(message, time.time(), collapse_spaces(prompt)[:PROMPT_KEPT])


def collapse_spaces(text: str) -> str:
    """`text` with whitespace runs collapsed: how a question is looked for in a judge prompt
    (templates re-wrap and indent what they quote)."""
    return " ".join(text.split())


def question_of(params: dict[str, Any]) -> str:
    """The last user message's text of a row's `responses_create_params`: what a judge prompt
    quotes of the rollout it grades ("" if none)."""
    items = params.get("input")
    if isinstance(items, str):
        return items
    users = [i for i in items or [] if isinstance(i, dict) and i.get("role") == "user"]
    return message_text(users[-1].get("content")) if users else ""


def question_marks(question: str) -> tuple[str, ...]:
    """What a judge prompt quotes of a question: its longest lines (whitespace collapsed, cut
    to `_QUESTION_HEAD`), at least `_MARK_MIN` characters each (an environment's instructions
    around the question are rarely quoted with it), else the whole question."""
    lines = {collapse_spaces(line)[:_QUESTION_HEAD] for line in question.splitlines()}
    long = [line for line in sorted(lines, key=len) if len(line) >= _MARK_MIN][-_MARKS:]
    whole = collapse_spaces(question)[:_QUESTION_HEAD]
    return tuple(long) if long else ((whole,) if whole else ())


@dataclass
class JudgeStatus:
    """The judge as the rollouts of a stack see it: who it is (`judge`, `Judge.public()`), its
    recent failures, and the questions of recent rollouts (see the module doc)."""

    judge: dict[str, Any]
    failures: collections.deque[JudgeFailure] = field(
        default_factory=lambda: collections.deque(maxlen=_FAILURES_KEPT)
    )
    questions: dict[tuple[str, ...], None] = field(default_factory=dict)
    """Recent rollouts' questions (`question_marks`), oldest first (at most `_QUESTIONS_KEPT`)."""

    def failed(self, failure: JudgeFailure) -> None:
        self.failures.append(failure)

    def running(self, question: str) -> tuple[str, ...]:
        """Note a rollout's question (before its `/run`); returns the marks it is known by."""
        found = question_marks(question)
        self.questions.pop(found, None)
        self.questions[found] = None
        while len(self.questions) > _QUESTIONS_KEPT:
            self.questions.pop(next(iter(self.questions)))
        return found

    def failure_for(self, since: float, question: tuple[str, ...]) -> str | None:
        """The message of a judge failure at or after `since` that is the rollout's with
        `question` (its `running` marks): the failed prompt quotes it, or quotes no recent
        rollout's question. None if there is none."""
        for failure in reversed(self.failures):
            if failure.at < since:
                break
            if _prompt_quotes(failure.prompt, question):
                return failure.message
            if not any(_prompt_quotes(failure.prompt, q) for q in self.questions):
                return failure.message
        return None


def _prompt_quotes(prompt: str, question: tuple[str, ...]) -> bool:
    return any(mark in prompt for mark in question)

"""A replay judge: a judge model server that answers each judge call with the judge output
NeMo Gym recorded for that rollout (`judge_entries` reads the recordings' judge fields).

A call is matched on its prompt text (`judge.relay.prompt_text`, the same for a Responses call
and NeMo Gym's Chat Completions conversion of it) and answered on both `/v1/responses` and
`/v1/chat/completions`; no match is HTTP 404 (`no_recorded_judgement`). The fields read and the
matching: docs/conformance.md, "Judge environments".
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aiohttp import web

from verifiers_nemogym.bridge.responses import message_text
from verifiers_nemogym.policies.judge import ScriptedJudge
from verifiers_nemogym.policies.replay import Recording, is_model_item

logger = logging.getLogger(__name__)

NO_JUDGEMENT = "no_recorded_judgement"
"""The error code of a judge call no recording answers."""


@dataclass(frozen=True)
class JudgeEntry:
    """One recorded judge call: where it was recorded, what its prompt holds, its reply."""

    recording: str
    """The rollout's recording id (`<env>:<line>`)."""
    needles: tuple[str, ...]
    """Texts the call's prompt holds, in this order."""
    reply: str
    hints: tuple[str, ...] = ()
    """Texts that, found in the prompt too, prefer this entry among equal matches."""

    def score(self, prompt: str, lenient: bool = False) -> tuple[int, int] | None:
        """(needle text, hint text) found in `prompt`; None unless every needle is there (with
        `lenient`, the last one of several)."""
        at = 0
        needles = self.needles[-1:] if lenient else self.needles
        if lenient and len(self.needles) < 2:
            return None
        for needle in needles:
            found = prompt.find(needle, at)
            if found < 0:
                return None
            at = found + len(needle)
        hinted = sum(len(h) for h in self.hints if h in prompt)
        return sum(map(len, needles)), hinted


def _output_text(output: Any) -> str | None:
    """The text of a recorded Responses output: its assistant messages' texts."""
    if not isinstance(output, list):
        return None
    texts = [
        message_text(i.get("content"))
        for i in output
        if isinstance(i, dict) and i.get("type", "message") == "message" and is_model_item(i)
    ]
    return "".join(texts) if texts else None


def _request_needles(params: Any) -> tuple[str, ...]:
    """The message texts of a recorded judge request (`responses_create_params`)."""
    if not isinstance(params, dict):
        return ()
    items = params.get("input")
    if isinstance(items, str):
        items = [{"content": items}]
    items = [i for i in items or [] if isinstance(i, dict) and "content" in i]
    texts = [message_text(i["content"]) for i in items]
    return tuple(t.strip() for t in texts if t.strip())


def _policy_text(row: dict[str, Any]) -> str:
    """The policy's last answer in a recorded rollout (what arena_judge's calls compare)."""
    output = (row.get("response") or {}).get("output")
    messages = [i for i in output or [] if isinstance(i, dict) and i.get("role") == "assistant"]
    return message_text(messages[-1].get("content")) if messages else ""


def _snippet(text: str, size: int = 120) -> str:
    """A stretch from the middle of `text`: specific to it, and clear of the edits a server
    makes at the ends (stripping, removing a thinking preamble)."""
    text = text.strip()
    if len(text) <= size:
        return text
    start = (len(text) - size) // 2
    return text[start : start + size].strip()


def judge_entries(rec: Recording) -> list[JudgeEntry]:
    """The judge calls `rec` recorded (none if it recorded no judge output), read from
    `judge_evaluations` (whole requests and responses), `judge_responses_create_params` and
    `judge_response` (one call), `rubric_evaluations` (`judge_prompt`, `judge_response` per
    item), `judge_output` (the text only) or `judgement_gen_base` and `judgement_base_gen`."""
    row, entries = rec.row, []
    evaluations = row.get("judge_evaluations")
    calls = [(e.get("responses_create_params"), e.get("response")) for e in evaluations or []
             if isinstance(e, dict)]  # fmt: skip
    if isinstance(row.get("judge_responses_create_params"), dict):
        calls.append((row["judge_responses_create_params"], row.get("judge_response")))
    for params, response in calls:
        reply = _output_text((response or {}).get("output") if isinstance(response, dict) else None)
        if (needles := _request_needles(params)) and reply is not None:
            entries.append(JudgeEntry(rec.id, needles, reply))
    for item in row.get("rubric_evaluations") or []:
        if isinstance(item, dict) and isinstance(item.get("judge_response"), str):
            prompt = str(item.get("judge_prompt") or "").strip()
            if prompt:
                entries.append(JudgeEntry(rec.id, (prompt,), item["judge_response"]))
    question = row.get("question") if isinstance(row.get("question"), str) else row.get("problem")
    question = question.strip() if isinstance(question, str) else ""
    answer = row.get("extracted_answer")
    hints = (answer.strip(),) if isinstance(answer, str) and answer.strip() else ()
    if isinstance(row.get("judge_output"), str) and question:
        entries.append(JudgeEntry(rec.id, (question,), row["judge_output"], hints))
    baseline = row.get("baseline_answer")
    if question and isinstance(baseline, str):
        candidate, base = _snippet(_policy_text(row)), _snippet(baseline)
        for name, order in (("judgement_gen_base", (candidate, base)),
                            ("judgement_base_gen", (base, candidate))):  # fmt: skip
            if isinstance(row.get(name), str) and all(order):
                entries.append(JudgeEntry(rec.id, (question, *order), row[name]))
    return entries


class JudgeIndex:
    """Recorded judge calls searchable by a call's prompt."""

    def __init__(self, recordings: Iterable[Recording]) -> None:
        self.entries = [e for rec in recordings for e in judge_entries(rec)]

    @property
    def recordings(self) -> set[str]:
        """The recording ids that recorded at least one judge call."""
        return {e.recording for e in self.entries}

    def match(self, prompt: str) -> tuple[JudgeEntry, bool] | None:
        """The entry that answers a call whose prompt is `prompt` and whether it matched
        leniently: each of its `needles` in the prompt, in order (lenient: its last alone),
        most needle text first, then most `hints`; None if none does."""
        for lenient in (False, True):
            best: tuple[tuple[int, int], JudgeEntry] | None = None
            for entry in self.entries:
                score = entry.score(prompt, lenient)
                if score is not None and (best is None or score > best[0]):
                    best = (score, entry)
            if best is not None:
                return best[1], lenient
        return None


@dataclass
class ReplayJudge(ScriptedJudge):
    """Serve `index` as a judge on `host:port` (0 = a free port); `base_url` ends in `/v1`.
    Recording ids answered are kept in `used` (those matched leniently in `lenient` too),
    unmatched prompts' starts in `misses`."""

    index: JudgeIndex = field(default_factory=lambda: JudgeIndex([]))
    used: list[str] = field(default_factory=list)
    lenient: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    model_id: ClassVar[str] = "replay-judge"

    def verdict_for(self, prompt: str) -> str | web.Response:
        found = self.index.match(prompt)
        if found is None:
            start = " ".join(prompt.split())[:120]
            self.misses.append(start)
            logger.warning("replay judge: no recorded judgement for a prompt starting %r", start)
            message = f"no recorded judge call matches this prompt (it starts {start!r})"
            error = {"message": message, "type": "invalid_request_error", "code": NO_JUDGEMENT}
            return web.json_response({"error": error}, status=404)
        entry, lenient = found
        self.used.append(entry.recording)
        if lenient:
            self.lenient.append(entry.recording)
        return entry.reply

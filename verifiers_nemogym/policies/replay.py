"""A replay policy: an OpenAI Responses model server that answers from recorded rollouts.

`ReplayPolicy` loads NeMo Gym's recorded rollouts (`data/example_rollouts.jsonl`) and answers each
`POST /v1/responses` with the model items of the next turn of the recording whose conversation
the request continues, exactly as recorded, so a replayed rollout takes the recorded path. How
requests are matched: docs/conformance.md, "How rows and replies are matched". Run alone:
`nemo-gym-env serve replay --env example_multi_step --port 8000` or `--rollouts FILE.jsonl ...`.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from aiohttp import web

from verifiers_nemogym.bridge.responses import complete_response, message_text
from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.policies.server import ResponsesServer

logger = logging.getLogger(__name__)

REPLAY_KEY = "nemo_gym_replay"
"""`responses_create_params.metadata` key naming the recording (`<label>:<line>`) a row replays;
only consulted to choose among recordings that match the input equally well."""

Key = tuple[str, ...]
JSON = dict[str, Any]

_MODEL_KINDS = ("function_call", "reasoning")
REASONING: Key = ("reasoning",)
"""Reasoning items count by position only: their content may be re-encoded or summarised."""


def _arguments(raw: Any) -> str:
    """Function-call arguments in canonical form (key order and spacing do not matter)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return raw
    return json.dumps(raw, sort_keys=True)


def _kind(item: Any) -> str | None:
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"  # NeMo Gym's input messages may omit `type`
    return str(kind) if kind is not None else None


def is_model_item(item: Any) -> bool:
    """Whether the model produced `item` (as opposed to the environment or the user)."""
    kind = _kind(item)
    return kind in _MODEL_KINDS or (kind == "message" and item.get("role") == "assistant")


def item_key(item: Any) -> Key | None:
    """The matching key of one input/output item; None for items matching ignores (reasoning)."""
    kind = _kind(item)
    if kind is None:
        return ("raw", json.dumps(item, sort_keys=True))
    if kind == "reasoning":
        return REASONING
    if kind == "message":
        role = str(item.get("role", "user"))
        return (
            "message",
            "system" if role == "developer" else role,
            message_text(item.get("content")),
        )
    if kind == "function_call":
        return ("function_call", str(item.get("name")), _arguments(item.get("arguments")))
    if kind == "function_call_output":
        output = item.get("output")
        return ("function_call_output", output if isinstance(output, str) else message_text(output))
    ignored = ("id", "status", "call_id", "prompt_token_ids", "generation_token_ids")
    rest = {k: v for k, v in item.items() if k not in ignored and k != "generation_log_probs"}
    return (kind, json.dumps(rest, sort_keys=True))


def _shape(key: Key) -> Key:
    """The lenient form of a key: environment items by kind (and role) only."""
    if key[0] == "function_call_output":
        return key[:1]
    if key[0] == "message" and key[1] != "assistant":
        return key[:2]
    return key


def input_keys(input_value: Any) -> list[Key]:
    """Keys of a Responses `input` (a string is one user message)."""
    if isinstance(input_value, str):
        return [("message", "user", input_value)]
    if not isinstance(input_value, list):
        return []
    return [k for k in map(item_key, input_value) if k is not None]


def _strip(keys: Sequence[Key]) -> list[Key]:
    return [k for k in keys if k != REASONING]


def _describe(key: Key | None) -> str:
    if key is None:
        return "nothing (the conversation ended there)"
    detail = key[-1] if len(key) > 1 else ""
    detail = detail if len(detail) <= 80 else detail[:77] + "..."
    return f"{'/'.join(key[:-1]) if len(key) > 2 else key[0]} {detail!r}"


@dataclass(frozen=True)
class Turn:
    """One model turn of a recording: what came before it and what the model answered."""

    at: int
    """Number of keys (initial input + earlier output, reasoning included) before this turn."""
    at_stripped: int
    """The same without reasoning items (for requests into which reasoning is not echoed)."""
    items: list[JSON]
    """The model-generated output items of the turn, as recorded."""


@dataclass
class Recording:
    """One recorded rollout (one line of an `example_rollouts.jsonl`)."""

    id: str
    """`<label>:<line>`, e.g. `example_multi_step:3`."""
    row: JSON
    reward: float | None
    keys: list[Key]
    """Keys of the whole recorded conversation (initial input, then every output item)."""
    turns: list[Turn]
    stripped: list[Key] = field(default_factory=list)
    """`keys` without reasoning items."""

    def __post_init__(self) -> None:
        self.stripped = _strip(self.keys)

    @property
    def incomplete(self) -> dict[str, Any] | None:
        """The recorded `incomplete_details` (e.g. max_output_tokens): they belong to the last
        turn, and make NeMo Gym's agents stop their loop."""
        details = (self.row.get("response") or {}).get("incomplete_details")
        return details if isinstance(details, dict) else None

    @classmethod
    def from_row(cls, row: JSON, rid: str) -> Recording:
        params = row.get("responses_create_params")
        response = row.get("response")
        if not isinstance(params, dict) or not isinstance(response, dict):
            raise ConfigError(f"{rid}: no responses_create_params/response: not a recorded rollout")
        output = response.get("output")
        if not isinstance(output, list) or not all(isinstance(i, dict) for i in output):
            raise ConfigError(f"{rid}: `response.output` is not a list of items")
        keys = input_keys(params.get("input"))
        turns: list[Turn] = []
        current: list[JSON] | None = None
        for item in output:
            if is_model_item(item):
                if current is None:
                    current = []
                    turns.append(Turn(len(keys), len(_strip(keys)), current))
                current.append(item)
            else:
                current = None
            if (key := item_key(item)) is not None:
                keys.append(key)
        reward = row.get("reward")
        return cls(
            id=rid,
            row=row,
            reward=float(reward) if isinstance(reward, int | float) else None,
            keys=keys,
            turns=turns,
        )

    def turn_at(self, position: int, stripped: bool) -> Turn | None:
        return next(
            (t for t in self.turns if (t.at_stripped if stripped else t.at) == position), None
        )


def load_recordings(path: Path, label: str | None = None) -> list[Recording]:
    """The recordings in a JSONL file, named `<label>:<line>` (label: the file's stem)."""
    label = label or path.stem
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ConfigError(f"cannot read recorded rollouts {path}: {e}") from None
    recordings = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ConfigError(f"{path}:{number}: not a JSON rollout: {line[:60]!r}") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{number}: a rollout must be a JSON object")
        recordings.append(Recording.from_row(row, f"{label}:{number}"))
    if not recordings:
        raise ConfigError(f"no recorded rollouts in {path}")
    return recordings


class NoRecording(LookupError):
    """The request continues no loaded recording; the message says why."""


@dataclass(frozen=True)
class Match:
    recording: Recording
    turn: Turn
    exact: bool
    """False when environment items matched by kind only (lenient pass)."""


class ReplayIndex:
    """Recordings searchable by the conversation a request carries."""

    def __init__(self, recordings: Iterable[Recording]) -> None:
        self.recordings = list(recordings)
        self.by_id = {r.id: r for r in self.recordings}
        if len(self.by_id) != len(self.recordings):
            raise ConfigError("recording ids must be unique: give each file its own label")

    def match(self, body: JSON) -> Match:
        """The recording turn that answers `body` (a Responses request); NoRecording if none."""
        keys = input_keys(body.get("input"))
        # Echoed reasoning counts by position (so a turn is never answered twice); requests
        # into which no reasoning is echoed are compared without it.
        stripped = REASONING not in keys
        pool = self.recordings
        metadata = body.get("metadata")
        hint = metadata.get(REPLAY_KEY) if isinstance(metadata, dict) else None
        if isinstance(hint, str):
            if hint not in self.by_id:
                raise NoRecording(f"metadata {REPLAY_KEY}={hint!r} names no loaded recording")
            pool = [self.by_id[hint]]
        n = len(keys)
        for exact in (True, False):
            wanted = keys if exact else [_shape(k) for k in keys]
            found = []
            for rec in pool:
                full = rec.stripped if stripped else rec.keys
                have = full[:n] if exact else [_shape(k) for k in full[:n]]
                if len(full) >= n and have == wanted:
                    found.append(rec)
            if not exact:
                # Prefer recordings whose environment items agree most often.
                found.sort(key=lambda r: -sum(a == b for a, b in zip(r.keys, keys, strict=False)))
            for rec in found:
                if (turn := rec.turn_at(n, stripped)) is not None:
                    return Match(rec, turn, exact)
            if found:
                rec = found[0]
                full = rec.stripped if stripped else rec.keys
                following = full[n] if n < len(full) else None
                raise NoRecording(
                    f"recording {rec.id} matches the {n} input items, but the model did not "
                    f"speak next there (the recording continues with {_describe(following)})"
                )
        raise NoRecording(self._closest(keys, pool))

    def _closest(self, keys: Sequence[Key], pool: Sequence[Recording]) -> str:
        def ref(rec: Recording) -> list[Key]:
            return rec.keys if REASONING in keys else rec.stripped

        def common(rec: Recording) -> int:
            have, i = ref(rec), 0
            while i < min(len(keys), len(have)) and have[i] == keys[i]:
                i += 1
            return i

        best = max(pool, key=common, default=None)
        head = (
            f"no recorded rollout continues this conversation ({len(keys)} input items, "
            f"{len(self.recordings)} recordings loaded)"
        )
        if best is None:
            return head
        i, have = common(best), ref(best)
        got = keys[i] if i < len(keys) else None
        expected = have[i] if i < len(have) else None
        return (
            f"{head}; closest is {best.id}, which differs at input item {i}: "
            f"recorded {_describe(expected)}, got {_describe(got)}"
        )


def _response(body: JSON, match: Match, n: int) -> JSON:
    recorded = match.recording.row.get("response") or {}
    last = match.turn is match.recording.turns[-1]
    incomplete = match.recording.incomplete if last else None
    reply = {
        "id": f"resp_replay_{n}",
        "model": body.get("model") or recorded.get("model") or "replay",
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": incomplete,
        "output": copy.deepcopy(match.turn.items),
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }
    return complete_response(reply, body)


@dataclass
class ReplayPolicy(ResponsesServer):
    """Serve `index` on `host:port` (0 = a free port); `base_url` ends in `/v1`. Every call
    is kept in `calls` (with `record`), every unmatched one's reason in `misses`."""

    index: ReplayIndex = field(default_factory=lambda: ReplayIndex([]))
    misses: list[str] = field(default_factory=list)
    lenient: list[str] = field(default_factory=list)
    """Recording ids answered through the lenient pass (environment items drifted)."""
    model_id: ClassVar[str] = "replay"

    async def respond(self, body: dict[str, Any]) -> web.Response:
        try:
            match = self.index.match(body)
        except NoRecording as e:
            self.misses.append(str(e))
            logger.warning("replay: %s", e)
            error = {"message": str(e), "type": "invalid_request_error"}
            return web.json_response(
                {"error": {**error, "code": "no_matching_recording"}}, status=404
            )
        if not match.exact:
            self.lenient.append(match.recording.id)
        return web.json_response(
            _response(body, match, next(self._ids)),
            headers={"X-Replay-Recording": match.recording.id},
        )

"""A recording's row (`replay_row`: the recorded `/run` result minus what `/run` added, with its
agent and recording id; docs/conformance.md, "How rows and replies are matched") and the `Plan`
of a run (`plan_rows`: every row, recording and result slot of the environments one stack
replays)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from verifiers_nemogym.conformance.report import EnvReport, RowResult
from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.catalog import Catalog, EnvSpec
from verifiers_nemogym.nemo.judges import active, judge_refs
from verifiers_nemogym.policies.replay import REPLAY_KEY, Recording, input_keys, load_recordings
from verifiers_nemogym.policies.replay_judge import JudgeIndex

_RESULT_KEYS = ("response", "reward", "terminated", "truncated", "info")


def example_rows(spec: EnvSpec) -> list[dict[str, Any]]:
    """The environment's example.jsonl rows, in file order (for the keys a row really has)."""
    try:
        path = spec.dataset("example")
    except ConfigError:
        return []
    rows: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("responses_create_params"), dict):
            rows.append(row)
    return rows


LACKS_FIELDS = "the recording lacks the task fields"
"""Start of the note `replay_row` leaves on a row it could not rebuild whole (see there)."""

_GYMNASIUM_AGENT = "gymnasium_agent"
"""NeMo Gym's step/reset agent: its `/run` result echoes the row's input with the reset
observation appended as a last user message."""


def _task_fields(examples: list[dict[str, Any]]) -> set[str]:
    """Fields every example row carries besides the request and the routing: what the
    environment's verifier reads (ground truth, task set-up)."""
    if not examples:
        return set()
    common = set(examples[0]).intersection(*examples[1:])
    return common - {"responses_create_params", "agent_ref"}


def _agrees(recorded: dict[str, Any], example: dict[str, Any]) -> bool:
    """Whether every task field both carry has the same value (the recording is of this row)."""
    shared = set(recorded) & set(example) - {"responses_create_params", "agent_ref"}
    return all(recorded[k] == example[k] for k in shared)


def _find_example(
    recorded: dict[str, Any], examples: list[dict[str, Any]], inputs: list[Any]
) -> tuple[dict[str, Any], Any] | None:
    """The example row `recorded` was made from, and which of `inputs` (the recorded input,
    then its variants) it has; None if no example row has any of them.

    Several example rows may share one input (gymnasium tasks told apart by a seed, SciCode's
    empty inputs): the recording's `_ng_task_index` (its row's line in the dataset it was
    recorded from) names the row if that row agrees with the recording, else the first row
    that agrees, else the first."""
    for wanted in inputs:
        key = input_keys(wanted)
        same = [
            (i, x)
            for i, x in enumerate(examples)
            if input_keys(x["responses_create_params"].get("input")) == key
        ]
        if not same:
            continue
        index = recorded.get("_ng_task_index")
        by_index = [x for i, x in same if i == index and _agrees(recorded, x)]
        agreeing = [x for _, x in same if _agrees(recorded, x)]
        return ([*by_index, *agreeing, same[0][1]][0], wanted)
    return None


def _input_variants(recorded_input: Any, agent_impl: str) -> list[Any]:
    """The recorded input, and for the gymnasium agent also without its last user message (the
    reset observation the agent appended; replaying, the agent appends it again)."""
    variants = [recorded_input]
    if agent_impl == _GYMNASIUM_AGENT and isinstance(recorded_input, list) and recorded_input:
        last = recorded_input[-1]
        if isinstance(last, dict) and last.get("role") == "user":
            variants.append(recorded_input[:-1])
    return variants


def replay_row(
    rec: Recording, spec: EnvSpec, examples: list[dict[str, Any]]
) -> tuple[dict[str, Any], list[str]]:
    """The row that reproduces `rec` on `spec`'s stack, and notes on what was changed.

    The example row the recording was made from (`_find_example`) gives the row's keys, the
    recording their values, except the input: the example's (the gymnasium agent's recordings
    carry the reset observation in it). A recording whose prompt is in no example row and which
    lacks fields every example row has gets a note starting with `LACKS_FIELDS`: such
    recordings (NeMo Gym saved some without the task's fields) cannot be rebuilt, and the
    verifier will fail or score differently."""
    recorded = rec.row
    params = recorded["responses_create_params"]
    notes: list[str] = []
    ref = recorded.get("agent_ref")
    named = next(
        (a for a in spec.agents if isinstance(ref, dict) and a.name == ref.get("name")), None
    )
    impl = (named or spec.agent).impl
    found = _find_example(recorded, examples, _input_variants(params.get("input"), impl))
    if found is not None:
        example, wanted = found
        row = {k: recorded.get(k, v) for k, v in example.items()}
        row["responses_create_params"] = {**params, "input": wanted}
        if wanted is not params.get("input"):
            notes.append("the reset observation the gymnasium agent appended was removed")
    else:
        row = {
            k: v for k, v in recorded.items() if k not in _RESULT_KEYS and not k.startswith("_ng_")
        }
        if examples:
            # A field no example row has is one `/verify` added (a verdict, the judge's text):
            # sent back, verifiers that spread the request into their response (omniscience)
            # get it twice and fail.
            known = set().union(*examples) | {"agent_ref"}
            row = {k: v for k, v in row.items() if k in known}
        missing = sorted(_task_fields(examples) - set(recorded))
        if missing:
            notes.append(
                f"{LACKS_FIELDS} {', '.join(missing)} (every example row has them; its prompt "
                "is in no example row)"
            )
    agents = {a.name for a in spec.agents}
    ref = row.get("agent_ref")
    if not isinstance(ref, dict) or ref.get("name") not in agents:
        if isinstance(ref, dict):
            notes.append(f"agent_ref {ref.get('name')!r} is not in the config: {spec.agent.name}")
        row["agent_ref"] = {"type": "responses_api_agents", "name": spec.agent.name}
    # Recordings dump every request field, unset ones as null; NeMo Gym's request model
    # refuses some nulls (`parallel_tool_calls`, `tool_choice`), and unset means default.
    params = {k: v for k, v in row["responses_create_params"].items() if v is not None}
    params["metadata"] = {**(params.get("metadata") or {}), REPLAY_KEY: rec.id}
    row["responses_create_params"] = params
    return row, notes


@dataclass
class Plan:
    """What one stack replays: per environment its report (`reports`), every row with its
    recording and the result it fills (`results`, by recording id), the environments with rows
    (`runnable`), and what the run learns on the way (`episodes`)."""

    reports: dict[str, EnvReport]
    rows: list[dict[str, Any]]
    recordings: list[Recording]
    results: dict[str, RowResult]
    runnable: list[str]
    judged: list[str] = field(default_factory=list)
    """The runnable environments whose stack needs a judge (active judge references)."""
    unjudged: set[str] = field(default_factory=set)
    """Recordings of `judged` environments that keep no judge output."""
    agents: dict[str, str] = field(default_factory=dict)
    """Recording -> the agent its row runs on."""
    episodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Recording -> its replayed episode, as traces.jsonl holds it."""


def plan_rows(catalog: Catalog, envs: Sequence[str], enable_optional_judges: bool = False) -> Plan:
    """The `Plan` of `envs`: an unknown name raises ConfigError (before anything starts), an
    environment without usable recordings is reported skipped; with `enable_optional_judges`,
    the judges NeMo Gym ships off count as grading."""
    plan = Plan(reports={}, rows=[], recordings=[], results={}, runnable=[])
    for name in envs:
        spec = catalog.env(name)  # unknown names fail here, before anything starts
        report = plan.reports[name] = EnvReport(name)
        try:
            recordings = load_recordings(spec.example_rollouts, name)
        except ConfigError as e:
            report.skipped = f"no usable recordings: {e}"
            continue
        examples = example_rows(spec)
        for rec in recordings:
            row, notes = replay_row(rec, spec, examples)
            result = RowResult(rec.id, rec.reward, notes=notes)
            report.rows.append(result)
            plan.results[rec.id] = result
            plan.rows.append(row)
            plan.agents[rec.id] = row["agent_ref"]["name"]
        plan.recordings += recordings
        plan.runnable.append(name)
        paths = catalog.env(name).config_paths
        if any(active(judge_refs(catalog.merged_config(p)), enable_optional_judges) for p in paths):
            plan.judged.append(name)
            recorded = JudgeIndex(recordings).recordings
            plan.unjudged |= {r.id for r in recordings if r.id not in recorded}
    return plan

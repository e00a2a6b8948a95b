"""Comparisons of a replay with its recordings: why a reward differs (`explain`), and NeMo Gym's
aggregate metrics of the recorded rows next to those of the replayed traces (`compare_metrics`,
figure by figure: `compare_answers`; docs/conformance.md, "Aggregate metrics")."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import aiohttp

from verifiers_nemogym import metrics
from verifiers_nemogym.conformance.report import MetricsComparison, RowResult, error_line
from verifiers_nemogym.conformance.rows import LACKS_FIELDS, Plan
from verifiers_nemogym.conformance.tables import KNOWN_REASONS, rescored_on
from verifiers_nemogym.errors import StackError
from verifiers_nemogym.policies.replay import Recording


def explain(
    result: RowResult, lenient: set[str], release: str, unjudged: AbstractSet[str] = frozenset()
) -> None:
    """Set `result.reason` when it lost parity, from what is known first (a rescored recording
    of `release`, `KNOWN_REASONS`, a judge replay gap among `unjudged`, a gap in the recording),
    else what was seen; note a recording the replay matched leniently (`lenient`)."""
    # Bare folder name: `environments/blackjack` is the same environment as `blackjack`.
    env = result.recording.rsplit(":", 1)[0].rsplit("/", 1)[-1]
    if result.recording in lenient:
        result.notes.append("the environment's items differed from the recording (tool output)")
    if result.parity:
        return
    lacks = next((n for n in result.notes if n.startswith(LACKS_FIELDS)), None)
    rescored = rescored_on(release).get(result.recording)
    if rescored is not None and result.error is None and result.reward == rescored[0]:
        result.reason = rescored[1]
    elif env in KNOWN_REASONS:
        result.reason = KNOWN_REASONS[env]
    elif result.recording in unjudged:
        result.reason = "judge replay gap: the recording keeps no judge output for this rollout"
    elif lacks is not None:
        result.reason = f"gap in the recording: {lacks}"
    elif result.error is not None and "no_matching_recording" in result.error:
        result.reason = f"replay gap: {result.error}"
    elif result.error is not None:
        result.reason = f"error: {result.error}"
    elif result.recorded_reward is None:
        result.reason = "the recording has no reward"
    else:
        result.reason = f"reward {result.reward!r}, recorded {result.recorded_reward!r}"
        if result.recording in lenient:
            result.reason += " (the environment answered differently than when recorded)"


_COLLECTOR_STRIPS = (
    "response",
    "responses_create_params",
    "ng_agent_observations",
    "ng_model_call_capture",
    "ng_trajectory",
)
"""What NeMo Gym's collector leaves out of the results it hands `/aggregate_metrics` (of the
response it keeps `usage` and `incomplete_details`)."""


Numbering = dict[str, tuple[int, int]]
"""Recording -> the (task, rollout) indices both sides of the metrics comparison give it."""


def numbering(recordings: Sequence[Recording], agents: dict[str, str]) -> Numbering:
    """The task and rollout indices NeMo Gym gave each recording, per agent; an agent whose
    recordings lack them or repeat a pair (NeMo Gym's aggregator refuses duplicates: recordings
    of several runs in one file) has its recordings numbered (position, 0), each a task of its
    own."""
    by_agent: dict[str, list[tuple[str, Any, Any]]] = {}
    for rec in recordings:
        task, rollout = rec.row.get(metrics.TASK_INDEX), rec.row.get(metrics.ROLLOUT_INDEX)
        by_agent.setdefault(agents[rec.id], []).append((rec.id, task, rollout))
    found: Numbering = {}
    for entries in by_agent.values():
        pairs = [(t, r) for _, t, r in entries if isinstance(t, int) and isinstance(r, int)]
        recorded = len(pairs) == len(entries) and len(set(pairs)) == len(pairs)
        for position, (rid, task, rollout) in enumerate(entries):
            found[rid] = (task, rollout) if recorded else (position, 0)
    return found


def _in_order(by_agent: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    for results in by_agent.values():  # as NeMo Gym sorts its results before aggregating
        results.sort(key=lambda r: (r[metrics.TASK_INDEX], r[metrics.ROLLOUT_INDEX]))
    return by_agent


def recorded_results(
    recordings: Sequence[Recording], agents: dict[str, str], numbers: Numbering
) -> dict[str, list[dict[str, Any]]]:
    """Agent -> what NeMo Gym's eval hands its `/aggregate_metrics` for these recorded rows:
    the rows with a reward and no `_ng_failure_class` (its collector moves failures out), stripped
    as it strips them, with their indices (`numbering`), in index order."""
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for rec in recordings:
        row = rec.row
        if rec.reward is None or row.get("_ng_failure_class") is not None:
            continue
        result = {k: v for k, v in row.items() if k not in _COLLECTOR_STRIPS}
        response = row["response"] if isinstance(row.get("response"), dict) else {}
        kept = {k: response[k] for k in ("usage", "incomplete_details") if response.get(k)}
        if kept:
            result["response"] = kept
        result[metrics.TASK_INDEX], result[metrics.ROLLOUT_INDEX] = numbers[rec.id]
        by_agent.setdefault(agents[rec.id], []).append(result)
    return _in_order(by_agent)


def replayed_results(
    recordings: Sequence[Recording], episodes: dict[str, dict[str, Any]], numbers: Numbering
) -> dict[str, list[dict[str, Any]]]:
    """Agent -> what `verifiers_nemogym.metrics` hands `/aggregate_metrics` for the replayed
    episodes (`metrics.collect`: failed rollouts left out), each with its recording's indices."""
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for rec in recordings:
        episode = episodes.get(rec.id)
        if episode is None:
            continue
        for agent, results in metrics.collect([episode]).by_agent.items():
            for result in results:
                result[metrics.TASK_INDEX], result[metrics.ROLLOUT_INDEX] = numbers[rec.id]
                by_agent.setdefault(agent, []).append(result)
    return _in_order(by_agent)


def _figures(value: Any, path: str = "") -> dict[str, Any]:
    """Every leaf of an `/aggregate_metrics` answer by its dotted path (lists by index)."""
    if isinstance(value, dict):
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return {path: value}
    found: dict[str, Any] = {}
    for key, item in items:
        found |= _figures(item, f"{path}.{key}" if path else str(key))
    return found


METRIC_TOLERANCE = 1e-9
"""Two aggregate figures agree when they differ by at most this much (sums in another order)."""


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _same(a: Any, b: Any) -> bool:
    """Numbers within `METRIC_TOLERANCE` (NaN equals NaN: both sides had nothing to average);
    anything else equal."""
    if _number(a) and _number(b):
        both_nan = math.isnan(a) and math.isnan(b)
        return both_nan or a == b or abs(a - b) <= METRIC_TOLERANCE
    return bool(a == b)


def model_figure(path: str) -> bool:
    """Whether a figure measures the model rather than the environment: token counts (from the
    rollouts' `usage`: the replay policy reports none, the recordings the real model's) and
    0.7's `perf_summary` (timings). The comparison sets these aside."""
    return path.startswith("perf_summary") or path.rsplit("/", 1)[-1].endswith("tokens")


def compare_answers(
    recorded: dict[str, Any], replayed: dict[str, Any]
) -> tuple[int, int, dict[str, tuple[Any, Any]]]:
    """Two `/aggregate_metrics` answers (their `agent_ref` aside), figure by figure: how many
    were compared, how many were set aside (`model_figure`), and those that differ: numbers by
    more than `METRIC_TOLERANCE`, anything else by equality, a figure only one side has (the
    other side None)."""
    ours = _figures({k: v for k, v in replayed.items() if k != "agent_ref"})
    theirs = _figures({k: v for k, v in recorded.items() if k != "agent_ref"})
    paths = sorted(theirs.keys() | ours.keys())
    compared = [p for p in paths if not model_figure(p)]
    differing = {
        p: (theirs.get(p), ours.get(p))
        for p in compared
        if p not in theirs or p not in ours or not _same(theirs[p], ours[p])
    }
    return len(compared), len(paths) - len(compared), differing


def _field(path: str) -> str:
    """The result field a figure is of: `agent_metrics.mean/exact_match` -> `exact_match`."""
    return path.rsplit("/", 1)[-1].rsplit(".", 1)[-1]


def metrics_reason(rows: Sequence[RowResult], differing: dict[str, tuple[Any, Any]]) -> str:
    """Why the aggregate figures of `rows`' agent differ: the rollouts the replay changed; else
    fields only one side's rollouts carry (the release's verifier returns fields the recording
    lacks, or no longer returns some it has); else that nothing explains it (a finding)."""
    failed = sum(r.error is not None for r in rows)
    rewards = sum(r.error is None and not r.parity for r in rows)
    if failed or rewards:
        parts = [f"{failed} replayed rollout(s) failed (left out)"] if failed else []
        parts += [f"{rewards} reward(s) differ from the recording"] if rewards else []
        return f"the replay differs from the recording: {', '.join(parts)} (see the mismatches)"
    if all(a is None or b is None for a, b in differing.values()):
        ours = sorted({_field(p) for p, (theirs, _) in differing.items() if theirs is None})
        lost = sorted({_field(p) for p, (_, mine) in differing.items() if mine is None})
        parts = []
        if ours:
            added = ", ".join(ours)
            parts.append(f"the release's verifier returns fields the recordings lack ({added})")
        if lost:
            parts.append(f"the recordings have fields it no longer returns ({', '.join(lost)})")
        return f"every reward matched; {'; '.join(parts)}"
    fields = sorted({_field(p) for p in differing})
    return f"every reward matched, yet figures of {', '.join(fields)} differ (not explained)"


async def compare_metrics(run_urls: dict[str, str], plan: Plan) -> None:
    """Each agent's `MetricsComparison`, onto the report of the environment its rows came
    from; an endpoint that fails costs only that agent's comparison."""
    numbers = numbering(plan.recordings, plan.agents)
    theirs = recorded_results(plan.recordings, plan.agents, numbers)
    ours = replayed_results(plan.recordings, plan.episodes, numbers)
    envs: dict[str, list[str]] = {}  # agent -> the environments whose rows ran on it
    for rid, agent in plan.agents.items():
        named = envs.setdefault(agent, [])
        if (env := rid.rsplit(":", 1)[0]) not in named:
            named.append(env)
    async with aiohttp.ClientSession() as http:
        for agent in sorted(envs):
            report = plan.reports[envs[agent][0]]
            found = MetricsComparison(
                agent, len(theirs.get(agent, [])), len(ours.get(agent, [])), also=envs[agent][1:]
            )
            report.metrics.append(found)
            if not found.recorded or not found.replayed:
                side = "recorded rows" if not found.recorded else "replayed rollouts"
                found.error = f"no {side} to aggregate (failed or without a reward)"
                continue
            try:
                (recorded,) = await metrics.aggregate(
                    run_urls, http, metrics.Rollouts(by_agent={agent: theirs[agent]})
                )
                (replayed,) = await metrics.aggregate(
                    run_urls, http, metrics.Rollouts(by_agent={agent: ours[agent]})
                )
            except StackError as e:
                found.error = error_line(str(e))
                continue
            found.figures, found.set_aside, found.differing = compare_answers(recorded, replayed)
            if found.differing:
                rows = [plan.results[r] for r, a in plan.agents.items() if a == agent]
                found.reason = metrics_reason(rows, found.differing)

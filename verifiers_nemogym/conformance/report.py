"""What a conformance run reports (`RowResult` per recording, `MetricsComparison` per agent,
`EnvReport` per environment), the one-line error texts reports carry, and the Markdown table
(`format_report`); `EnvReport.to_json` is the `--json` form."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from verifiers_nemogym.bridge.redact import cut


@dataclass
class RowResult:
    """One recorded rollout, replayed."""

    recording: str
    """`<env>:<line>` in the environment's example_rollouts.jsonl."""
    recorded_reward: float | None
    reward: float | None = None
    """The replayed rollout's NeMo Gym reward; None if the rollout failed."""
    error: str | None = None
    reason: str | None = None
    """Why the reward differs (or the rollout failed); None on parity."""
    notes: list[str] = field(default_factory=list)

    @property
    def parity(self) -> bool:
        return self.error is None and self.reward == self.recorded_reward


@dataclass
class MetricsComparison:
    """NeMo Gym's aggregate metrics of one agent's rollouts: on the recorded rows and on the
    replayed traces (`conformance.compare`), compared figure by figure."""

    agent: str
    recorded: int = 0
    """Recorded rollouts NeMo Gym aggregates (its failed or unrewarded recordings left out)."""
    replayed: int = 0
    """Replayed rollouts `verifiers_nemogym.metrics` hands it (failed replays left out)."""
    figures: int = 0
    """Figures compared: every number or string in either answer, by its dotted path, but the
    model's (`model_figure`)."""
    set_aside: int = 0
    """The model's figures (token counts, timings), not compared."""
    differing: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """Path -> (NeMo Gym's figure on the recordings, ours); a path one side lacks has None."""
    error: str | None = None
    """Why the comparison could not be made (an endpoint that failed, nothing to aggregate)."""
    reason: str | None = None
    """Why figures differ; None when all agree."""
    also: list[str] = field(default_factory=list)
    """Other environments of the stack whose rows ran on this agent (configs that name the same
    agent): their rollouts are aggregated together, as NeMo Gym would."""

    @property
    def equal(self) -> bool:
        return self.error is None and not self.differing


@dataclass
class EnvReport:
    """The conformance figures of one environment."""

    env: str
    rows: list[RowResult] = field(default_factory=list)
    skipped: str | None = None
    """Why the environment was not run at all (e.g. no usable recordings)."""
    start_error: str | None = None
    """Why its NeMo Gym stack did not start (one line); then it has no rows."""
    judge_replies: int | None = None
    """Judge calls the replay judge answered from this environment's recordings; None when
    no judge graded it."""
    metrics: list[MetricsComparison] = field(default_factory=list)
    """Its agents' aggregate metrics, recorded next to replayed (`MetricsComparison`)."""

    @property
    def completed(self) -> int:
        return sum(r.error is None for r in self.rows)

    @property
    def errors(self) -> int:
        return sum(r.error is not None for r in self.rows)

    @property
    def matches(self) -> int:
        return sum(r.parity for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "rows": len(self.rows),
            "completed": self.completed,
            "errors": self.errors,
            "parity": self.matches,
            "skipped": self.skipped,
            "start_error": self.start_error,
            "judge_replies": self.judge_replies,
            "results": [asdict(r) | {"parity": r.parity} for r in self.rows],
            "metrics": [asdict(m) | {"equal": m.equal} for m in self.metrics],
        }


def error_line(text: str) -> str:
    """The last non-empty line of an error, at most 300 characters, with live secrets redacted
    (`bridge.redact`): agents' 500 answers echo the request, whose metadata carries the proxy's
    secret, and reports are shared."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return cut(lines[-1] if lines else text, 300)


def start_error_line(text: str) -> str:
    """The telling line of a stack start error (a log tail, many lines): NeMo Gym's own
    `Error...` (with the two lines its console wraps onto), else the line saying which server
    died or what failed, else the first line; redacted, at most 300 characters."""
    chatter = ("[vf-nemogym supervisor]", "INFO:", "```", "---")
    stripped = (x.strip() for x in text.splitlines())
    lines = [x for x in stripped if x and not x.startswith(chatter)]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Error"):
            return cut(" ".join(lines[i : i + 3]), 300)
    for word in ("died", "Failed to", "exited"):
        for line in lines:
            if word in line:
                return cut(line, 300)
    return cut(lines[0] if lines else text, 300)


def format_report(reports: Sequence[EnvReport]) -> str:
    """A Markdown table (one line per environment) and every mismatch with its reason."""
    lines = [
        "| environment | rows | completed | errors | reward parity |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in reports:
        if r.start_error:
            lines.append(f"| {r.env} | - | - | - | stack did not start: {r.start_error} |")
        elif r.skipped:
            lines.append(f"| {r.env} | - | - | - | skipped: {r.skipped} |")
        else:
            rows = len(r.rows)
            lines.append(f"| {r.env} | {rows} | {r.completed} | {r.errors} | {r.matches}/{rows} |")
    total = sum(len(r.rows) for r in reports)
    matches = sum(r.matches for r in reports)
    lines.append(f"| **total** | {total} | {sum(r.completed for r in reports)} | "
                 f"{sum(r.errors for r in reports)} | {matches}/{total} |")  # fmt: skip
    judged = [f"{r.env} {r.judge_replies}" for r in reports if r.judge_replies is not None]
    if judged:
        lines += ["", f"Judge calls answered from the recordings: {', '.join(judged)}."]
    lines += _metrics_lines(reports)
    misses = [row for r in reports for row in r.rows if not row.parity]
    if misses:
        lines += ["", "Mismatches:", ""]
        for row in misses:
            got = "error" if row.error is not None else repr(row.reward)
            lines.append(
                f"- `{row.recording}` (recorded {row.recorded_reward!r}, got {got}): {row.reason}"
            )
    return "\n".join(lines)


SHOWN_FIGURES = 4
"""Differing figures the report names per agent (the JSON has them all)."""


def _metrics_lines(reports: Sequence[EnvReport]) -> list[str]:
    """The aggregate metrics table: per agent, figures compared and how many differ, why."""
    compared = [(r.env, m) for r in reports for m in r.metrics]
    if not compared:
        return []
    lines = [
        "",
        "NeMo Gym's aggregate metrics (its `/aggregate_metrics`) on the recorded rows and on the "
        "replayed traces:",
        "",
        "| environment | agent | rollouts recorded / replayed | figures | differing | why |",
        "|---|---|---:|---:|---:|---|",
    ]
    for env, m in compared:
        env = ", ".join([env, *m.also])
        counts = f"{m.recorded} / {m.replayed}"
        if m.error is not None:
            lines.append(f"| {env} | {m.agent} | {counts} | - | - | not compared: {m.error} |")
            continue
        why = m.reason or "equal"
        if m.differing:
            shown = [
                f"`{path}` {theirs!r} / {ours!r}"
                for path, (theirs, ours) in list(m.differing.items())[:SHOWN_FIGURES]
            ]
            more = len(m.differing) - len(shown)
            why += f"; e.g. {', '.join(shown)}" + (f" and {more} more" if more > 0 else "")
        lines.append(f"| {env} | {m.agent} | {counts} | {m.figures} | {len(m.differing)} | {why} |")
    equal = sum(m.equal for _, m in compared)
    lines += ["", f"Aggregate metrics equal for {equal} of {len(compared)} agents."]
    return lines

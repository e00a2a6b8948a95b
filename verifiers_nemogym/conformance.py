"""Conformance: NeMo Gym's own recorded rollouts, replayed through nemo-gym-env, score as recorded.

`run_conformance(envs)` takes every line of each environment's `data/example_rollouts.jsonl`
(rollouts NeMo Gym recorded with a real model), turns it back into the row that produced it,
and runs all rows of all environments as one verifiers evaluation in this process: ONE NeMo Gym
stack (`load_env(nemo_env=envs, jsonl_path=...)`, `env.serving()`,
`env.run_episode`), with the model played by `ReplayPolicy`, which answers every model call with
the recorded turn. Each rollout's reward is then compared with the recorded one (exact float
equality). A mismatch or error carries a reason: a known property of the environment from
`KNOWN_REASONS`, else what was observed (replay gap, environment output drifted, error text).

The row of a recording is the recorded `/run` result minus what `/run` added: when the
environment's `example.jsonl` has a row with the same input (for the gymnasium agent: without
the reset observation it appends to the input), exactly that row's keys are kept (values from
the recording; among example rows sharing one input, the recording's `_ng_task_index` or its
task fields pick the row); otherwise `response`, `reward`, gymnasium's `terminated`,
`truncated`, `info`, NeMo Gym's `_ng_*` bookkeeping and any field no example row has (what
`/verify` added) are dropped, and a recording that lacks
task fields every example row has is reported as a gap in the recording. Rows name their agent
(`agent_ref`, else the environment's default agent) and carry their recording id in
`responses_create_params.metadata[REPLAY_KEY]`, which the replay policy uses only to tell apart
recordings of the same prompt.

Judge environments replay their judge too: when an environment of the stack grades with an
LLM judge (`nemo.judges`), the stack's judge is `ReplayJudge`, which answers each judge call
with the judge output recorded for that rollout (`policies.replay_judge`); judges NeMo Gym ships
switched off (math_with_judge, polymath) stay off unless `enable_optional_judges`. A rollout
whose recording keeps no judge output and that loses parity is reported as a judge replay gap.

NeMo Gym's aggregate metrics are compared too, while the stack runs: for each agent, its
`/aggregate_metrics` answer on the recorded rows (what NeMo Gym's eval writes for them: failed
rows left out, results stripped as its collector strips them) next to its answer on the replayed
traces as `verifiers_nemogym.metrics` reads them (what `nemo-gym-env metrics` gives a user). Both
carry the recording's task and rollout indices, so the two differ only where the rollouts do
(`MetricsComparison`).

`run_in_stacks` runs many environments on successive stacks; `format_report` renders the
per-environment table; `EnvReport.to_json` the `--json` form. Printing them and the exit status
are the CLI's (`nemo-gym-env conformance`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from verifiers_nemogym import metrics
from verifiers_nemogym.bridge.redact import cut
from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.nemo.catalog import ENVIRONMENTS, Catalog, EnvSpec
from verifiers_nemogym.nemo.judges import active, judge_refs
from verifiers_nemogym.nemo.venv import ensure_venv
from verifiers_nemogym.policies.replay import (
    REPLAY_KEY,
    Recording,
    ReplayIndex,
    ReplayPolicy,
    input_keys,
    load_recordings,
)
from verifiers_nemogym.policies.replay_judge import JudgeIndex, ReplayJudge

if TYPE_CHECKING:  # annotations only: this module imports verifiers inside run_conformance
    import verifiers.v1 as vf

    from verifiers_nemogym.env import NeMoGymEnv

logger = logging.getLogger(__name__)

_RESULT_KEYS = ("response", "reward", "terminated", "truncated", "info")

_RELEASES = tomllib.loads(
    (Path(__file__).with_name("conformance.toml")).read_text(encoding="utf-8")
)
# The release tables live as data in conformance.toml (what runs offline, known reasons,
# rescored recordings); these names read them.
CI_ENVS: tuple[str, ...] = tuple(_RELEASES["ci_envs"])
"""The fixed subset CI checks for exact parity."""
VERIFIED_OFFLINE: dict[str, tuple[str, ...]] = {
    release: tuple(envs) for release, envs in _RELEASES["verified_offline"].items()
}
"""Release -> the environments conformance runs verified to run offline here."""
DEFAULT_ENVS = VERIFIED_OFFLINE["0.4.0"]
KNOWN_REASONS: dict[str, str] = dict(_RELEASES["known_reasons"])
"""Environment -> why its replayed reward may differ from the recording (found by runs)."""
RESCORED: dict[str, dict[str, tuple[float, str]]] = {
    release: {rec: (float(v["reward"]), str(v["why"])) for rec, v in recs.items()}
    for release, recs in _RELEASES["rescored"].items()
}
"""Release -> recording -> (the reward that release's own verifier gives it, why)."""
NOT_OFFLINE: dict[str, str] = dict(_RELEASES["not_offline"])
"""Environments that do not run offline for a reason their config does not show."""
JUDGE_REPLAY: dict[str, tuple[str, ...]] = {
    release: tuple(envs) for release, envs in _RELEASES["judge_replay"].items()
}
"""Release -> the LLM-judge environments whose recordings keep the judge's output: what
`nemo-gym-env conformance --judge-envs` replays, policy and judge (docs/conformance.md)."""


def default_envs(release: str) -> tuple[str, ...]:
    """What `nemo-gym-env conformance` runs without names on `release`: its verified list, else
    0.4.0's."""
    return VERIFIED_OFFLINE.get(release, DEFAULT_ENVS)


def judge_envs(release: str) -> tuple[str, ...]:
    """What `nemo-gym-env conformance --judge-envs` runs on `release`: its `JUDGE_REPLAY` list,
    else 0.4.0's."""
    return JUDGE_REPLAY.get(release, JUDGE_REPLAY["0.4.0"])


JUDGE_SURVEY: dict[str, dict[str, tuple[int, int, int]]] = {
    release: {env: (int(r), int(c), int(e)) for env, (r, c, e) in envs.items()}
    for release, envs in _RELEASES["judge_survey"].items()
}
"""Release -> LLM-judge environment -> (rows, completed, exact) of the judge conformance survey
(`conformance --judge-envs`, the replay judge named through --env.taskset.judge.*)."""
WITH_JUDGE = "yes, with --env.taskset.judge.*"
"""`nemo-gym-env list`'s "runs here" for a judge environment the judge survey ran."""


def runs_here(
    name: str, problem: str | None, facts: dict[str, str], release: str = "0.4.0"
) -> tuple[str, str]:
    """`nemo-gym-env list`'s "runs here" and "why": `offline_status` as yes/no, except that an
    LLM-judge environment whose rows completed in the judge conformance survey of `release`
    (else 0.4.0's, named) is `WITH_JUDGE`, and one whose rows did not is no, with the counts."""
    offline, why = offline_status(name, problem, facts, release)
    if offline or problem:
        return ("yes" if offline else "no"), why
    source = release if release in JUDGE_SURVEY else "0.4.0"
    surveyed = JUDGE_SURVEY[source].get(name)
    if surveyed is None:
        return "no", why
    rows, completed, exact = surveyed
    counts = (
        f"judge conformance survey (NeMo Gym {source}, the replay judge): {completed}/{rows} "
        f"rows completed, {exact} with the recorded reward"
    )
    if completed == 0:
        return "no", f"{counts}; {KNOWN_REASONS.get(name, why)}"
    return WITH_JUDGE, f"ran with a judge named by --env.taskset.judge.*: {counts}"


HARNESSES: dict[str, dict[str, dict[str, str]]] = {
    release: {env: dict(entry) for env, entry in envs.items()}
    for release, envs in _RELEASES["harnesses"].items()
}
"""Release -> coding-agent harness environment -> `ran` (date of the run here) and `overrides`,
or `why` it does not run here (conformance.toml)."""
CONTAINERS: dict[str, dict[str, dict[str, str]]] = {
    release: {env: dict(entry) for env, entry in envs.items()}
    for release, envs in _RELEASES["containers"].items()
}
"""Release -> container environment -> `ran` (date of the run here with hand-made tasks), the
agent `pairing` and what it `needs`, or `why` it does not run here (conformance.toml)."""


def offline_status(
    name: str, problem: str | None, facts: dict[str, str], release: str = "0.4.0"
) -> tuple[bool, str]:
    """Whether the catalog entry `name` (bare folder name, or `environments/<name>` where both
    layouts have it) of NeMo Gym `release` ran here (offline, on a CPU machine), and why: True
    only for what was run (conformance runs, `default_envs(release)`; the harness survey,
    `HARNESSES`); otherwise the reason known (`NOT_OFFLINE`, the survey) or shown by the entry's
    `facts` (`CatalogEntry.facts`: judge model, API key, sandbox, URL requirement, a coding-agent
    harness), or that it has not been run here. Container environments (`CONTAINERS`) come first:
    their configs define no agent; NeMo Gym pairs them with one (`pairing`)."""
    if (container := CONTAINERS.get(release, {}).get(name)) is not None:
        if "ran" not in container:
            return False, container["why"]
        return True, (
            f"ran here with --env.taskset.config-paths {container['pairing']} and the docker "
            f"provider config (container survey, NeMo Gym {release}, {container['ran']}); "
            f"needs {container['needs']}"
        )
    if problem:
        return False, problem
    verified = default_envs(release)
    if name in verified or f"{ENVIRONMENTS}/{name}" in verified:
        source = release if release in VERIFIED_OFFLINE else "0.4.0"
        return True, f"verified by conformance runs (NeMo Gym {source})"
    if (surveyed := HARNESSES.get(release, {}).get(name)) is not None:
        if "ran" not in surveyed:
            return False, surveyed["why"]
        needs = f"; needs {surveyed['overrides']}" if "overrides" in surveyed else ""
        return True, f"ran here (harness survey, NeMo Gym {release}, {surveyed['ran']}{needs})"
    if name in NOT_OFFLINE:
        return False, NOT_OFFLINE[name]
    for key in ("harness", "judge", "api_key", "sandbox", "url_requirement"):
        if key in facts:
            return False, facts[key]
    return False, "not run here yet (its files show no judge, key, sandbox or URL requirement)"


STACK_ENVS = 10
"""At most this many environments share one stack in `run_in_stacks`; longer lists run as
successive stacks, one after the other. Memory bounds it: a server takes ~0.3 GB and an
environment has two or more, so the whole default list on one stack would not fit a 24 GB
machine."""


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


METRIC_TOLERANCE = 1e-9
"""Two aggregate figures agree when they differ by at most this much (sums in another order)."""


@dataclass
class MetricsComparison:
    """NeMo Gym's aggregate metrics of one agent's rollouts: on the recorded rows and on the
    replayed traces (module contract), compared figure by figure."""

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


def _example_rows(spec: EnvSpec) -> list[dict[str, Any]]:
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
class _Plan:
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


def _plan(catalog: Catalog, envs: Sequence[str], enable_optional_judges: bool = False) -> _Plan:
    plan = _Plan(reports={}, rows=[], recordings=[], results={}, runnable=[])
    for name in envs:
        spec = catalog.env(name)  # unknown names fail here, before anything starts
        report = plan.reports[name] = EnvReport(name)
        try:
            recordings = load_recordings(spec.example_rollouts, name)
        except ConfigError as e:
            report.skipped = f"no usable recordings: {e}"
            continue
        examples = _example_rows(spec)
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


def _error_line(text: str) -> str:
    """The last non-empty line of an error, at most 300 characters, with live secrets redacted
    (`bridge.redact`): agents' 500 answers echo the request, whose metadata carries the proxy's
    secret, and reports are shared."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return cut(lines[-1] if lines else text, 300)


def _start_error_line(text: str) -> str:
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


async def run_conformance(
    envs: Sequence[str],
    *,
    load_env: Callable[..., NeMoGymEnv],
    nemo_gym_version: str | None = None,
    python: str | None = None,
    concurrency: int = 8,
    start_timeout: float = 1800.0,
    run_timeout: float = 180.0,
    enable_optional_judges: bool = False,
) -> list[EnvReport]:
    """Replay every recorded rollout of `envs` on one stack; one report per environment.
    `load_env(**taskset_fields)` builds the env (the CLI passes the env package's
    `load_environment`; the library does not import the plug-in). A stack with judge
    environments grades with `ReplayJudge` (module contract; `enable_optional_judges` turns on
    the judges NeMo Gym ships off). A stack that does not start raises StackError with its
    reason (see `run_in_stacks`)."""
    import verifiers.v1 as vf
    from verifiers.v1.configs.client import EvalClientConfig

    if not envs:
        raise ConfigError("conformance needs at least one NeMo Gym environment name")
    runtime = await asyncio.to_thread(ensure_venv, nemo_gym_version, python)
    plan = await asyncio.to_thread(
        _plan, Catalog(runtime), list(dict.fromkeys(envs)), enable_optional_judges
    )
    reports = list(plan.reports.values())
    if not plan.rows:
        return reports
    with tempfile.TemporaryDirectory(prefix="vf-nemogym-conformance-") as tmp:
        rows_file = Path(tmp) / "rows.jsonl"
        rows_file.write_text("".join(json.dumps(r) + "\n" for r in plan.rows), encoding="utf-8")
        # record=False: an agent that loops must not grow our memory with every request.
        async with (
            ReplayPolicy(index=ReplayIndex(plan.recordings), record=False) as policy,
            ReplayJudge(index=JudgeIndex(plan.recordings), record=False) as judge,
        ):
            # The judge is part of a stack's identity: name it only where one grades.
            judged = {"judge": {"base_url": judge.base_url, "model": judge.model_id,
                                "api_key_var": "", "api": "chat",
                                "enable_optional": enable_optional_judges}}  # fmt: skip
            env = load_env(
                nemo_env=plan.runnable,
                jsonl_path=str(rows_file),
                nemo_gym_version=runtime.nemo_gym_version,
                python=python,
                start_timeout=start_timeout,
                task={"run_timeout": run_timeout},
                **(judged if plan.judged else {}),
            )
            tasks = list(env.taskset)
            client = EvalClientConfig(base_url=policy.base_url, api_key_var="VF_NEMOGYM_REPLAY")
            ctx = vf.ModelContext(model="replay", client=client)
            logger.info(
                "conformance: %d recorded rollouts of %d environment(s); starting one stack",
                len(tasks),
                len(plan.runnable),
            )
            began = time.monotonic()
            async with env.serving():
                if env.start_error is not None:  # the env fails rollouts with it; we report it
                    raise StackError(env.start_error)
                logger.info("conformance: stack up in %.0f s", time.monotonic() - began)
                await _replay_all(
                    env, tasks, ctx, plan, policy, concurrency, runtime.nemo_gym_version
                )
                assert env.stack is not None  # serving, and it started
                await _compare_metrics(env.stack.run_urls, plan)
            if judge.misses:
                logger.warning("conformance: %d judge call(s) had no recording", len(judge.misses))
            for name in plan.judged:
                used = [u for u in judge.used if u.rsplit(":", 1)[0] == name]
                plan.reports[name].judge_replies = len(used)
            for rid in dict.fromkeys(judge.lenient):
                plan.results[rid].notes.append(
                    "the judge's instructions differed from the recording (matched by what is "
                    "judged)"
                )
    return reports


async def _replay_all(
    env: NeMoGymEnv,
    tasks: list[Any],
    ctx: vf.ModelContext,
    plan: _Plan,
    policy: ReplayPolicy,
    concurrency: int,
    release: str,
) -> None:
    gate = asyncio.Semaphore(concurrency)
    done = 0

    async def one(task: Any) -> None:
        nonlocal done
        rid = task.data.row["responses_create_params"]["metadata"][REPLAY_KEY]
        result = plan.results[rid]
        async with gate:
            try:
                episode = await env.run_episode(task, ctx)
            except Exception as e:  # the run must go on and report every row
                result.error = f"{type(e).__name__}: {_error_line(str(e))}"
            else:
                plan.episodes[rid] = episode.to_record()
                trace = episode.traces[0] if episode.traces else None
                if episode.ok and trace is not None and trace.ok:
                    result.reward = trace.reward
                else:
                    errors = [*(trace.errors if trace else []), *episode.errors]
                    result.error = _error_line(errors[-1].message) if errors else "failed"
        done += 1
        if done % 10 == 0 or done == len(tasks):
            logger.info("conformance: %d/%d rollouts replayed", done, len(tasks))

    await asyncio.gather(*(one(t) for t in tasks))
    lenient = set(policy.lenient)
    for result in plan.results.values():
        _explain(result, lenient, release, plan.unjudged)


def _explain(
    result: RowResult, lenient: set[str], release: str, unjudged: AbstractSet[str] = frozenset()
) -> None:
    # Bare folder name: `environments/blackjack` is the same environment as `blackjack`.
    env = result.recording.rsplit(":", 1)[0].rsplit("/", 1)[-1]
    if result.recording in lenient:
        result.notes.append("the environment's items differed from the recording (tool output)")
    if result.parity:
        return
    lacks = next((n for n in result.notes if n.startswith(LACKS_FIELDS)), None)
    rescored = RESCORED.get(release, {}).get(result.recording)
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


def _metrics_reason(rows: Sequence[RowResult], differing: dict[str, tuple[Any, Any]]) -> str:
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


async def _compare_metrics(run_urls: dict[str, str], plan: _Plan) -> None:
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
                found.error = _error_line(str(e))
                continue
            found.figures, found.set_aside, found.differing = compare_answers(recorded, replayed)
            if found.differing:
                rows = [plan.results[r] for r, a in plan.agents.items() if a == agent]
                found.reason = _metrics_reason(rows, found.differing)


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


async def run_in_stacks(envs: Sequence[str], **options: Any) -> list[EnvReport]:
    """`run_conformance` on successive stacks of at most `STACK_ENVS` environments (in order).

    A stack that does not start (`StackError`) costs only the environments that broke it: a
    batch that fails is run again one environment per stack, and an environment whose own stack
    fails gets `EnvReport.start_error` (the run goes on). A start that fails because Ray's node
    timed out (the machine's load) was already tried again by the start itself
    (`nemo.stack.start_stack`). Bad
    input (`ConfigError`, e.g. an unknown name) ends the run at the batch holding it, before
    that batch's stack starts."""
    names = list(dict.fromkeys(envs))
    batches = [names[i : i + STACK_ENVS] for i in range(0, len(names), STACK_ENVS)]
    reports: list[EnvReport] = []
    for number, batch in enumerate(batches, start=1):
        if len(batches) > 1:
            logger.info("conformance: stack %d/%d: %s", number, len(batches), ", ".join(batch))
        try:
            reports += await run_conformance(batch, **options)
            continue
        except StackError as e:
            if len(batch) == 1:
                reports.append(EnvReport(batch[0], start_error=_start_error_line(str(e))))
                continue
            logger.warning(
                "conformance: the stack of %s did not start (%s); running them one per stack",
                ", ".join(batch),
                _start_error_line(str(e)),
            )
        for name in batch:
            try:
                reports += await run_conformance([name], **options)
            except StackError as e:
                logger.warning("conformance: the stack of %s did not start", name)
                reports.append(EnvReport(name, start_error=_start_error_line(str(e))))
    return reports

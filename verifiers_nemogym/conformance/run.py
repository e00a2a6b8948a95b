"""Running conformance: every recording of some environments replayed on one stack
(`run_conformance`), and long lists on successive stacks (`run_in_stacks`). A stack whose
environments grade with an LLM judge gets `ReplayJudge` as its judge (docs/conformance.md,
"Judge environments")."""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verifiers_nemogym.conformance.compare import compare_metrics, explain
from verifiers_nemogym.conformance.report import EnvReport, error_line, start_error_line
from verifiers_nemogym.conformance.rows import Plan, plan_rows
from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import ensure_venv
from verifiers_nemogym.policies.replay import REPLAY_KEY, ReplayIndex, ReplayPolicy
from verifiers_nemogym.policies.replay_judge import JudgeIndex, ReplayJudge

if TYPE_CHECKING:  # annotations only: this module imports verifiers inside run_conformance
    import verifiers.v1 as vf

    from verifiers_nemogym.env import NeMoGymEnv

logger = logging.getLogger(__name__)

STACK_ENVS = 10
"""At most this many environments share one stack in `run_in_stacks`; longer lists run as
successive stacks, one after the other. Memory bounds it: a server takes ~0.3 GB and an
environment has two or more, so the whole default list on one stack would not fit a 24 GB
machine."""


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
    environments grades with `ReplayJudge` (`enable_optional_judges` turns on
    the judges NeMo Gym ships off). A stack that does not start raises StackError with its
    reason (see `run_in_stacks`)."""
    import verifiers.v1 as vf
    from verifiers.v1.configs.client import EvalClientConfig

    if not envs:
        raise ConfigError("conformance needs at least one NeMo Gym environment name")
    runtime = await asyncio.to_thread(ensure_venv, nemo_gym_version, python)
    plan = await asyncio.to_thread(
        plan_rows, Catalog(runtime), list(dict.fromkeys(envs)), enable_optional_judges
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
                await compare_metrics(env.stack.run_urls, plan)
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
    plan: Plan,
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
                result.error = f"{type(e).__name__}: {error_line(str(e))}"
            else:
                plan.episodes[rid] = episode.to_record()
                trace = episode.traces[0] if episode.traces else None
                if episode.ok and trace is not None and trace.ok:
                    result.reward = trace.reward
                else:
                    errors = [*(trace.errors if trace else []), *episode.errors]
                    result.error = error_line(errors[-1].message) if errors else "failed"
        done += 1
        if done % 10 == 0 or done == len(tasks):
            logger.info("conformance: %d/%d rollouts replayed", done, len(tasks))

    await asyncio.gather(*(one(t) for t in tasks))
    lenient = set(policy.lenient)
    for result in plan.results.values():
        explain(result, lenient, release, plan.unjudged)


async def run_in_stacks(envs: Sequence[str], **options: Any) -> list[EnvReport]:
    """`run_conformance` on successive stacks of at most `STACK_ENVS` environments (in order).

    A stack that does not start (`StackError`) costs only the environments that broke it: a
    batch that fails is run again one environment per stack, and an environment whose own stack
    fails gets `EnvReport.start_error` (the run goes on). A start that fails because Ray's node
    timed out (the machine's load) was already tried again by the start itself
    (`nemo.stack.start_stack`). Bad input (`ConfigError`, e.g. an unknown name) ends the run at
    the batch holding it, before that batch's stack starts."""
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
                reports.append(EnvReport(batch[0], start_error=start_error_line(str(e))))
                continue
            logger.warning(
                "conformance: the stack of %s did not start (%s); running them one per stack",
                ", ".join(batch),
                start_error_line(str(e)),
            )
        for name in batch:
            try:
                reports += await run_conformance([name], **options)
            except StackError as e:
                logger.warning("conformance: the stack of %s did not start", name)
                reports.append(EnvReport(name, start_error=start_error_line(str(e))))
    return reports

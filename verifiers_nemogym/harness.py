"""NeMoGymHarness: one rollout = one `POST /run` on the row's NeMo Gym agent.

The agent's model calls reach this rollout's verifiers endpoint through its proxy route (a train
route under verifiers' train client), and NeMo Gym's reward and result land on the trace. A failed
`/run`, or a provider error on any model call of the rollout, makes the rollout an error, never
reward 0; only verifiers stopping the rollout keeps NeMo Gym's reward (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, ClassVar

import aiohttp
import verifiers.v1 as vf
from verifiers.v1.configs.client import TrainClientConfig
from verifiers.v1.runtimes import ProgramResult, Runtime

from verifiers_nemogym.bridge.proxy import Route
from verifiers_nemogym.bridge.redact import cut, redact
from verifiers_nemogym.containers.docker import stop_rollout
from verifiers_nemogym.context import RolloutContext
from verifiers_nemogym.errors import AgentRunError, StackError
from verifiers_nemogym.judge.blame import question_of
from verifiers_nemogym.nemo.answers import read_json_answer
from verifiers_nemogym.nemo.rewards import RewardRange
from verifiers_nemogym.phases import rollout_phases
from verifiers_nemogym.taskset import NeMoGymData, row_sampling
from verifiers_nemogym.util import cancel_and_wait

logger = logging.getLogger(__name__)

# Echoes of the request and the raw NeMo Gym response: the trajectory already holds them.
_ECHOED = ("responses_create_params", "response")
# NeMo Gym's own records of the trajectory (observability, token capture): large, and
# what verifiers records itself. Its collector builds `ng_trajectory`; environment servers and
# model servers may return the others in `/run` results.
_NG_TRAJECTORY = ("ng_trajectory", "ng_agent_observations", "ng_model_call_capture")
_RESPONSE_FOR_METRICS = ("usage", "incomplete_details")
# NeMo Gym's failure tags on a 200 result (`Features.failure_class`; its collector routes such
# rows to a failures file): the class of the failure, and a kill-shaped failure written nowhere.
_FAILURE_CLASS = "_ng_failure_class"
_NO_PERSIST = "_ng_no_persist"


class NeMoGymHarnessConfig(vf.HarnessConfig):
    """The harness has no knobs of its own; rollout knobs live on `--env.taskset.task.*`."""


class NeMoGymHarness(vf.Harness[NeMoGymHarnessConfig]):
    """Runs a task's row through NeMo Gym's own agent server (see module doc)."""

    NEEDS_CONTAINER: ClassVar[bool] = False  # only HTTP calls to the env's own stack
    # verifiers' flag means "the harness hands the model local execution in its runtime" (this
    # process): it does not. The model's code may still run on this host, in NeMo Gym's servers
    # (math_with_code), the coding-agent CLIs they start, and docker containers: where, per
    # family, is docs/containers.md, "Where the model's code runs".
    EXECUTES_CODE: ClassVar[bool] = False

    async def launch(
        self,
        ctx: vf.ModelContext,
        trace: vf.Trace,
        runtime: Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
    ) -> ProgramResult:
        if not isinstance(data, NeMoGymData):
            raise TypeError(f"NeMoGymHarness runs NeMo Gym rows, got {type(data).__name__}")
        # verifiers types `trace.state` as its base State; NeMoGymTask's state is a NeMoGymState.
        live = getattr(trace.state, "live", None)
        if not isinstance(live, RolloutContext):
            if reason := getattr(trace.state, "start_error", None):
                raise StackError(f"the NeMo Gym stack did not start: {reason}")
            raise StackError("no NeMo Gym stack is running: use NeMoGymEnv (nemo-gym-env)")
        agent_url = live.run_urls.get(data.agent or "")
        if agent_url is None:
            raise AgentRunError(
                f"{data.source}: agent {data.agent!r} is not on this stack "
                f"(agents: {', '.join(sorted(live.run_urls)) or 'none'})"
            )
        if sampling := row_sampling(data.row):
            trace.info["nemo_gym_row_sampling"] = sampling
            _warn_once(live, "sampling", sampling)
        trace.info["nemo_gym_runtime"] = dict(live.runtime)
        if (bounds := reward_range(live, data)) is not None:
            trace.info["nemo_gym_reward_range"] = bounds.info()
        if live.judge is not None:
            trace.info["nemo_gym_judge"] = dict(live.judge.judge)
        # verifiers' train client records token ids but accepts only Chat Completions: the
        # route then carries the agent's Responses calls as chat (see `bridge.proxy`).
        train = isinstance(ctx.client, TrainClientConfig)
        async with live.proxy.route(
            endpoint, secret, stop_condition=lambda: _stop_condition(trace), train=train
        ) as route:
            began = time.time()
            params = data.row.get("responses_create_params") or {}
            question = live.judge.running(question_of(params)) if live.judge else ()
            try:
                result = await _run_stopping_leftovers(live, data, agent_url, route)
            except AgentRunError as e:
                # NeMo Gym reports a failed judge call as a bare 500 (or a masked sample):
                # name the judge's own failure as the cause.
                if live.judge and (judged := live.judge.failure_for(began, question)):
                    raise AgentRunError(f"{judged}; then {e}") from None
                raise
            if live.judge and (judged := live.judge.failure_for(began, question)):
                # Some judge environments score a failed judge call (0, 0.5, a fallback) instead
                # of failing: no measurement, so an error, never that reward.
                raise AgentRunError(f"{judged}; NeMo Gym scored the rollout anyway: no reward")
        trace.info["nemo_gym_phases"] = rollout_phases(began, time.time(), route.call_times)
        record(trace, result, keep_ng_trajectory=live.keep_ng_trajectory)
        return ProgramResult(exit_code=0, stdout="", stderr="")


LOST_RUN_HINT = "the NeMo Gym agent, or the network path to its stack, is gone"
"""What a `/run` that fails at the connection says: the agent died, or (a stack on another
host) the link to the stack went down."""


async def _run_stopping_leftovers(
    live: RolloutContext, data: NeMoGymData, url: str, route: Route
) -> dict[str, Any]:
    """`_post_run`; when it does not return a result (a deadline, a lost stack, a cancelled
    rollout), NeMo Gym's agent may still run the rollout's coding-agent CLI, and what that
    started, until the agent's own timeout, on this host or in the rollout's container: they
    carry the rollout id, so they are stopped and that container removed (`stop_rollout`)."""
    try:
        return await _post_run(live, data, url, route)
    except BaseException:
        try:
            await asyncio.shield(asyncio.to_thread(stop_rollout, route.rollout_id))
        except StackError as e:  # the rollout's own error is the one to report
            logger.warning("could not remove the container of a stopped rollout: %s", e)
        raise


def reward_range(live: RolloutContext, data: NeMoGymData) -> RewardRange | None:
    """The range the rollout's reward must fall in: the user's, else the one NeMo Gym's
    manifests declare for the row's agent, else None (any finite number)."""
    return live.reward_range or live.reward_ranges.get(data.agent or "")


def _stop_condition(trace: vf.Trace) -> str | None:
    """verifiers' stop condition of the rollout: every refusal of a model call by verifiers (turn
    limit, `@vf.stop`) sets it before the refusal is sent, and nothing else sets it while the
    harness runs (`trace.ok` is no guide: it stays False until the rollout is scored)."""
    return trace.stop_condition


async def _post_run(
    live: RolloutContext, data: NeMoGymData, url: str, route: Route
) -> dict[str, Any]:
    """POST the row, tagged for `route`, to the agent's `/run`; raise `AgentRunError` unless
    it returns a result whose reward is a finite number within the rollout's `reward_range` and
    at least one model call of the rollout came through `route`. Raced against the stack's
    death, the route's first provider error and `run_timeout`: whichever comes first ends the
    wait."""
    where = f"{data.source}: agent {data.agent!r} /run"
    if live.failure is not None:
        raise AgentRunError(f"{where} not started: {live.failure}")
    request = asyncio.ensure_future(_request(live.http, f"{url}/run", route.tag(data.row)))
    died = asyncio.ensure_future(live.death.wait())
    failed = asyncio.ensure_future(route.failed.wait())
    try:
        done, _ = await asyncio.wait(
            {request, died, failed},
            timeout=live.run_timeout,
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        # Cancelling the request closes its connection: NeMo Gym sees the client leave.
        await cancel_and_wait(request, died, failed)
    # A provider error is the cause of whatever the agent answered after it (a 500 echoing
    # the request, or a retry): report it, not the agent's answer.
    if route.failure is not None:
        raise AgentRunError(f"{where}: model call failed: {route.failure}")
    if request in done:
        try:
            status, text = request.result()
        except aiohttp.ClientError as e:
            raise AgentRunError(redact(f"{where} failed: {e!r} ({LOST_RUN_HINT})")) from None
    elif died in done:
        raise AgentRunError(f"{where} lost its NeMo Gym stack: {live.failure}")
    else:
        raise await _sandboxes_blamed(
            live, AgentRunError(f"{where} did not return within {live.run_timeout:g} s")
        )
    try:
        result = read_json_answer(where, status, text, AgentRunError)
    except AgentRunError as e:
        raise await _sandboxes_blamed(live, e) from None
    if isinstance(result, dict) and result.get("mask_sample") is True:
        raise _masked(where, result)
    if isinstance(result, dict) and (
        result.get(_FAILURE_CLASS) is not None or result.get(_NO_PERSIST) is True
    ):
        raise _failed(where, result)
    if not isinstance(result, dict) or not _finite_number(result.get("reward")):
        # NaN, Infinity (Python's JSON reads them) and booleans are no measurement either.
        raise AgentRunError(
            f"{where} returned no `reward` that is a finite number: {cut(text, 500)}"
        )
    bounds = reward_range(live, data)
    if bounds is not None and not bounds.holds(result["reward"]):
        # A reward no honest rollout earns (e.g. a reward file the model's code rewrote): no
        # measurement, so an error, never that reward.
        raise AgentRunError(
            f"{where} returned reward {result['reward']!r}, outside the reward range "
            f"{bounds.describe()}: no honest rollout earns it"
        )
    if route.calls == 0:
        # Every NeMo Gym agent calls its policy model at least once (none is model-free): a
        # result without a call is the verification of work the model never did (an agent
        # that lost the row's routing metadata and swallowed the error), not a measurement.
        raise AgentRunError(
            f"{where} returned a result, but the agent never reached the model "
            "(no model call of this rollout came through the proxy)"
        )
    return result


async def _sandboxes_blamed(live: RolloutContext, error: AgentRunError) -> AgentRunError:
    """`error`, led by why the stack's sandbox provider cannot serve when it cannot (NeMo Gym's
    agents answer a provider gone mid-run with errors of their own, e.g. a 500 "Failed to
    export OpenCode results", which name no provider)."""
    if live.sandbox_health is None or (down := await live.sandbox_health()) is None:
        return error
    return AgentRunError(f"{down}; then {error}")


def _finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _failed(where: str, result: dict[str, Any]) -> AgentRunError:
    """NeMo Gym returns some failures as a 200 result tagged `_ng_failure_class` (a failed
    judge call: `judge_failed`, with `reward: 0.0`; agents' own classes) or `_ng_no_persist`
    (a killed rollout); its collector keeps such rows out of its results and metrics. An error
    naming the signal and its class, with NeMo Gym's `_ng_failure_*` details, never the reward."""
    kind = result.get(_FAILURE_CLASS)
    kind = None if kind is None else str(kind)
    signal = f"{_FAILURE_CLASS}: {kind}" if kind is not None else f"{_NO_PERSIST}: true"
    details = "; ".join(
        f"{key}: {value}"
        for key, value in result.items()
        if key.startswith("_ng_failure_") and key != _FAILURE_CLASS and value not in (None, "")
    )
    reason = cut(details, 2000) if details else None
    return AgentRunError(
        f"{where}: NeMo Gym marked the result a failure ({signal}): {reason or 'no details'}",
        failure_kind=kind,
        failure_reason=reason,
    )


def _masked(where: str, result: dict[str, Any]) -> AgentRunError:
    """NeMo Gym (`Features.mask_sample`) marks a result whose reward is no valid measurement
    (an infrastructure failure in the rollout) `mask_sample: true`: an error, never its reward."""
    kind, reason = result.get("failure_kind"), result.get("failure_reason")
    kind = None if kind is None else str(kind)
    # Cut before redacting: NeMo Gym's reason is unbounded (L4), the trace keeps 2000 chars.
    reason = None if reason is None else cut(str(reason), 2000)
    # NeMo Gym's judge failsafe (0.7) also tags the class: name every signal the result carries.
    also = f" [{_FAILURE_CLASS}: {result[_FAILURE_CLASS]}]" if result.get(_FAILURE_CLASS) else ""
    return AgentRunError(
        f"{where}: NeMo Gym masked the sample ({kind or 'no failure_kind'}){also}: "
        f"{reason or 'no failure_reason'}",
        failure_kind=kind,
        failure_reason=reason,
    )


async def _request(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, str]:
    async with http.post(url, json=body) as response:
        return response.status, await response.text()


def record(trace: vf.Trace, result: dict[str, Any], *, keep_ng_trajectory: bool = False) -> None:
    """NeMo Gym's `/run` result onto the trace: `reward` as the reward `nemo_gym`, numeric
    verify fields (not booleans: flags such as `mask_sample` are no measurement) as metrics,
    everything else but the request/response echoes in `trace.info["nemo_gym"]` (of the
    response only its `usage` and `incomplete_details`, which NeMo Gym's aggregate metrics
    read); NeMo Gym's own trajectory records (`ng_trajectory`...) only with
    `keep_ng_trajectory`."""
    trace.record_reward("nemo_gym", float(result["reward"]))
    dropped = _ECHOED if keep_ng_trajectory else (*_ECHOED, *_NG_TRAJECTORY)
    info = {k: v for k, v in result.items() if k not in dropped}
    # Of the response echo, what NeMo Gym's collector hands its `/aggregate_metrics` (usage,
    # and from 0.7 `incomplete_details`): small, and the metrics module's input (`metrics`).
    response = result.get("response")
    if isinstance(response, dict):
        kept = {k: response[k] for k in _RESPONSE_FOR_METRICS if response.get(k) is not None}
        if kept:
            info["response"] = kept
    for key, value in info.items():
        if key != "reward" and isinstance(value, int | float) and not isinstance(value, bool):
            trace.record_metric(key, float(value))
    trace.info["nemo_gym"] = info


def _warn_once(live: RolloutContext, key: str, sampling: dict[str, Any]) -> None:
    if key in live.warned:
        return
    live.warned.add(key)
    logger.warning(
        "rows carry sampling settings %s; verifiers applies --sampling.* to every model call "
        "instead (the row values are kept in trace.info['nemo_gym_row_sampling'])",
        sorted(sampling),
    )

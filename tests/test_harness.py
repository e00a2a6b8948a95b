"""What the harness makes of a `/run` result NeMo Gym 0.7 marks `mask_sample: true` (an
infrastructure failure inside the rollout): an error carrying NeMo Gym's `failure_kind` and
`failure_reason`, never a reward; and what it makes of a result whose agent never reached the
model (M4). The `/run` server here is a plain aiohttp app on loopback answering recorded result
shapes, after one model call through the real proxy to the scripted policy, as an agent makes
(unless told not to); the real stack's results are covered by test_e2e."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from verifiers.v1.trace import AgentInfo, Trace, TraceTask

from verifiers_nemogym.bridge.proxy import NeMoGymModelProxy
from verifiers_nemogym.containers.providers.opensandbox import HEALTH_TIMEOUT, health
from verifiers_nemogym.context import RolloutContext
from verifiers_nemogym.errors import AgentRunError
from verifiers_nemogym.harness import _post_run, record
from verifiers_nemogym.nemo.rewards import RewardRange
from verifiers_nemogym.net import free_port, serve_app
from verifiers_nemogym.policies.scripted import ScriptedPolicy
from verifiers_nemogym.taskset import parse_row

ROW = {"responses_create_params": {"input": "hi"}, "agent_ref": {"name": "a"}}


MODEL_URL: dict[str, str] = {}
"""Where the `/run` double's agent sends its model call (`model`: the proxy's URL), if at all."""


@pytest.fixture
async def run_server() -> AsyncIterator[tuple[list[Any], list[dict[str, Any]], str]]:
    """(results to answer, requests seen, base URL) of a `/run` endpoint."""
    results: list[Any] = []
    seen: list[dict[str, Any]] = []

    async def run(request: web.Request) -> web.Response:
        row = await request.json()
        seen.append(row)
        if "model" in MODEL_URL:  # the agent's one model call, with the row's metadata
            url = f"{MODEL_URL['model']}/v1/responses"
            async with (
                aiohttp.ClientSession() as http,
                http.post(url, json=row["responses_create_params"]) as reply,
            ):
                assert reply.status == 200, await reply.text()
        answer = results.pop(0)
        return answer if isinstance(answer, web.Response) else web.json_response(answer)

    app = web.Application()
    app.router.add_post("/run", run)
    runner, port = await serve_app(app, "127.0.0.1", 0)
    try:
        yield results, seen, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _run(
    url: str,
    result: dict[str, Any] | web.Response,
    results: list[Any],
    *,
    model_call: bool = True,
    **ranges: Any,
) -> dict[str, Any]:
    results.append(result)
    async with (
        NeMoGymModelProxy() as proxy,
        ScriptedPolicy() as policy,
        aiohttp.ClientSession() as http,
    ):
        MODEL_URL.clear()
        if model_call:
            MODEL_URL["model"] = proxy.url
        live = RolloutContext(proxy=proxy, run_urls={"a": url}, http=http, run_timeout=30, **ranges)
        data = parse_row(json.dumps(ROW), "rows.jsonl:1", None)
        route = proxy.open_route(policy.base_url, "bearer-secret")
        try:
            return await _post_run(live, data, url, route)
        finally:
            await proxy.close_route(route)


async def test_masked_sample_is_an_error_with_nemo_gyms_failure_fields(run_server):
    results, seen, url = run_server
    masked = {
        "reward": 0.0,
        "mask_sample": True,
        "failure_kind": "judge_error",
        "failure_reason": "judge endpoint answered 503",
        "response": {},
    }
    with pytest.raises(AgentRunError) as caught:
        await _run(url, masked, results)
    error = caught.value
    assert (error.failure_kind, error.failure_reason) == (
        "judge_error",
        "judge endpoint answered 503",
    )
    assert str(error) == (
        "rows.jsonl:1: agent 'a' /run: NeMo Gym masked the sample (judge_error): "
        "judge endpoint answered 503"
    )
    # The row went out tagged with the route's rollout id (route id + credential).
    route_id = seen[0]["responses_create_params"]["metadata"]["vf_nemogym_route"]
    assert seen[0]["_ng_rollout_id"].startswith(f"{route_id}.")
    # NeMo Gym's reason is unbounded: cut (after redaction) to what the trace keeps.
    long_reason = {**masked, "failure_reason": "r" * 10_000_000}
    with pytest.raises(AgentRunError) as caught:
        await _run(url, long_reason, results)
    assert caught.value.failure_reason == "r" * 2000
    # Without a kind or a reason it is still an error, and says what is missing.
    with pytest.raises(AgentRunError, match=r"\(no failure_kind\): no failure_reason"):
        await _run(url, {"reward": 1.0, "mask_sample": True}, results)
    # NeMo Gym 0.7's judge failsafe tags its class as well: both signals are named.
    tagged = {**masked, "_ng_failure_class": "judge_failed"}
    both = r"\(judge_error\) \[_ng_failure_class: judge_failed\]: "
    with pytest.raises(AgentRunError, match=both):
        await _run(url, tagged, results)


async def test_unmasked_results_keep_their_reward(run_server):
    results, _, url = run_server
    for result in ({"reward": 1.0}, {"reward": 0.5, "mask_sample": False, "failure_kind": "x"}):
        assert (await _run(url, result, results))["reward"] == result["reward"]


async def test_a_result_of_a_rollout_that_never_reached_the_model_is_an_error(run_server):
    """M4: the agent made no model call through the route (it lost the row's routing metadata
    and swallowed the refusal) and NeMo Gym verified nothing: an error, never that reward."""
    results, _, url = run_server
    with pytest.raises(AgentRunError, match="the agent never reached the model"):
        await _run(url, {"reward": 0.0}, results, model_call=False)


def test_record_keeps_numbers_as_metrics_not_flags_nor_nemo_gyms_trajectory_records():
    result = {
        "reward": 0.5,
        "mask_sample": False,
        "accuracy": 1,
        "ratio": 0.25,
        "failure_kind": None,
        "responses_create_params": {"input": "hi"},
        "response": {"output": []},
        "ng_trajectory": {"turns": [1, 2]},
        "ng_agent_observations": {"x": 1},
        "ng_model_call_capture": {"calls": []},
    }
    trace = Trace(task=TraceTask(type="test", data={}), agent=AgentInfo(config={}))
    record(trace, result)
    assert trace.rewards["nemo_gym"].score == 0.5
    assert trace.metrics == {"accuracy": 1.0, "ratio": 0.25}  # `mask_sample` is a flag
    assert trace.info["nemo_gym"] == {
        "reward": 0.5,
        "mask_sample": False,
        "accuracy": 1,
        "ratio": 0.25,
        "failure_kind": None,
    }
    kept = Trace(task=TraceTask(type="test", data={}), agent=AgentInfo(config={}))
    record(kept, result, keep_ng_trajectory=True)
    assert kept.info["nemo_gym"]["ng_trajectory"] == {"turns": [1, 2]}
    assert {"ng_agent_observations", "ng_model_call_capture"} <= kept.info["nemo_gym"].keys()
    assert "response" not in kept.info["nemo_gym"]


@pytest.mark.parametrize("reward", ["NaN", "Infinity", "-Infinity", "true", '"1.0"', "null"])
async def test_a_reward_that_is_not_a_finite_number_is_an_error(run_server, reward: str):
    """verifiers 0.4.0 would record NaN as the reward (newer ones raise inside scoring): the
    rollout is an error naming the result, never a reward."""
    results, _, url = run_server
    with pytest.raises(AgentRunError, match="no `reward` that is a finite number"):
        await _run(url, json.loads(f'{{"reward": {reward}}}'), results)


async def test_a_reward_outside_the_rollouts_range_is_an_error(run_server):
    """A finite reward outside the range NeMo Gym declares for the row's agent (or the one the
    user states, which wins) is no measurement: an error naming it and the range; its bounds
    are inclusive, and an agent without a range takes any finite number."""
    results, _, url = run_server
    declared = {"a": RewardRange(0.0, 1.0, "NeMo Gym's benchmarks/x/manifest.yaml")}
    with pytest.raises(AgentRunError) as caught:
        await _run(url, {"reward": 1000000.0}, results, reward_ranges=declared)
    assert str(caught.value) == (
        "rows.jsonl:1: agent 'a' /run returned reward 1000000.0, outside the reward range "
        "[0, 1] (NeMo Gym's benchmarks/x/manifest.yaml): no honest rollout earns it"
    )
    with pytest.raises(AgentRunError, match=r"reward -0.5, outside the reward range \[0, 1\]"):
        await _run(url, {"reward": -0.5}, results, reward_ranges=declared)
    for reward in (0.0, 1.0, 0.25):
        assert (await _run(url, {"reward": reward}, results, reward_ranges=declared))[
            "reward"
        ] == reward
    stated = RewardRange(-1.0, 2.0, "--env.taskset.reward-range")
    got = await _run(url, {"reward": 2.0}, results, reward_ranges=declared, reward_range=stated)
    assert got["reward"] == 2.0
    with pytest.raises(AgentRunError, match=r"\[-1, 2\] \(--env.taskset.reward-range\)"):
        await _run(url, {"reward": 3.0}, results, reward_ranges=declared, reward_range=stated)
    other = {"b": RewardRange(0.0, 1.0, "x")}
    assert (await _run(url, {"reward": 1e300}, results, reward_ranges=other))["reward"] == 1e300


@pytest.mark.parametrize(
    ("tags", "signal", "kind"),
    [
        # NeMo Gym >= 0.5's judge failsafe: a 200 verify result scored 0.0.
        (
            {"_ng_failure_class": "judge_failed", "_ng_failure_judge_error": "judge said 503"},
            "_ng_failure_class: judge_failed",
            "judge_failed",
        ),
        # Any class an agent reports, e.g. its own run errors.
        ({"_ng_failure_class": "agent_run_error"}, "_ng_failure_class: agent_run_error", None),
        # A kill-shaped failure NeMo Gym writes nowhere.
        ({"_ng_no_persist": True}, "_ng_no_persist: true", None),
    ],
)
async def test_a_result_nemo_gym_tags_as_a_failure_is_an_error_naming_the_signal(
    run_server, tags: dict[str, Any], signal: str, kind: str | None
):
    results, _, url = run_server
    with pytest.raises(AgentRunError) as caught:
        await _run(url, {"reward": 0.0, **tags}, results)
    message = str(caught.value)
    assert f"NeMo Gym marked the result a failure ({signal})" in message
    if "_ng_failure_judge_error" in tags:
        assert message.endswith("_ng_failure_judge_error: judge said 503")
        assert caught.value.failure_reason == "_ng_failure_judge_error: judge said 503"
    else:
        assert message.endswith("no details")
    assert caught.value.failure_kind == (kind or tags.get("_ng_failure_class"))


async def test_untagged_failure_fields_keep_the_reward(run_server):
    """`_ng_failure_class: null` and `_ng_no_persist: false` are no failure."""
    results, _, url = run_server
    result = {"reward": 1.0, "_ng_failure_class": None, "_ng_no_persist": False}
    assert (await _run(url, result, results))["reward"] == 1.0


async def test_a_failed_run_is_led_by_the_sandbox_provider_gone_mid_run(run_server):
    """An agent answers a sandbox provider gone mid-run with an error of its own naming no
    provider (NeMo Gym 0.7.0's OpenCode agent: a 500 "Failed to export OpenCode results"): the
    rollout's error leads with the provider's own line (an OpenSandbox server on a loopback port
    nothing listens on); while the provider answers (no line), the agent's error stands as is."""
    results, _, url = run_server
    closed = free_port()  # bound, then released: nothing listens there
    settings = {"connection": {"domain": f"http://127.0.0.1:{closed}", "api_key": "k"}}

    def agents_500() -> web.Response:
        return web.Response(status=500, text='{"detail": "Failed to export OpenCode results"}')

    with pytest.raises(AgentRunError) as caught:
        await _run(url, agents_500(), results, sandbox_health=partial(health, settings))
    assert str(caught.value).startswith(
        f"the OpenSandbox server at http://127.0.0.1:{closed} (NeMo Gym's opensandbox sandbox "
        "provider) does not answer: "
    ), caught.value
    assert str(caught.value).endswith(
        "; then rows.jsonl:1: agent 'a' /run answered 500: "
        '{"detail": "Failed to export OpenCode results"}'
    ), caught.value

    async def serving() -> None:
        return None

    with pytest.raises(AgentRunError) as caught:
        await _run(url, agents_500(), results, sandbox_health=serving)
    assert str(caught.value).startswith("rows.jsonl:1: agent 'a' /run answered 500"), caught.value


async def test_the_provider_probe_of_a_failed_run_is_bounded_when_its_server_hangs(run_server):
    """An OpenSandbox server that takes connections and never answers (hung, not refusing):
    the failed rollout's error still leads with the provider's line, within the probe's own
    bound (`HEALTH_TIMEOUT`), not the lifecycle API's 30 s a call."""
    results, _, url = run_server
    hung = socket.create_server(("127.0.0.1", 0))  # accepts into its backlog, never reads
    try:
        port = hung.getsockname()[1]
        settings = {"connection": {"domain": f"http://127.0.0.1:{port}", "api_key": "k"}}
        began = time.monotonic()
        with pytest.raises(AgentRunError) as caught:
            await _run(
                url,
                web.Response(status=500, text="export failed"),
                results,
                sandbox_health=partial(health, settings),
            )
        took = time.monotonic() - began
    finally:
        hung.close()
    assert str(caught.value).startswith(
        f"the OpenSandbox server at http://127.0.0.1:{port} (NeMo Gym's opensandbox sandbox "
        "provider) does not answer: TimeoutError"
    ), caught.value
    assert HEALTH_TIMEOUT <= took < HEALTH_TIMEOUT + 5, took

"""What a judge call costs: `uv run python -m benchmarks.judge [--calls N] [--rollouts N]`.

A stand-alone measurement (like `benchmarks.redaction`) on one private NeMo Gym 0.4.0 stack
running equivalence_llm_judge with the scripted policy and the scripted judge (both instant, so
what is measured is the path, not a model):

- `hop`: one judge call as NeMo Gym's resources server makes it (`POST /v1/responses` to the
  stack's judge model server, which calls the relay, which calls the judge) against the same
  call straight to the judge; medians of `--calls` calls each, interleaved. The difference is
  the path's own cost per judge call (NeMo Gym's model-server adapter plus the relay).
- `rollouts`: `--rollouts` rollouts of the environment's rows; judge calls per rollout (the
  relay's count) and seconds per rollout (median, sequential).

Writes `benchmarks/results/<date>-judge.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp

RESULTS = Path(__file__).with_name("results")
ENV = "equivalence_llm_judge"
BODY = {"model": "judge", "input": [{"role": "user", "content": "Is 2 + 2 equal to 4?"}]}


async def _call_s(http: aiohttp.ClientSession, url: str, token: str | None) -> float:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    began = time.perf_counter()
    async with http.post(url, json=BODY, headers=headers) as response:
        await response.read()
        assert response.status == 200, response.status
    return time.perf_counter() - began


async def measure(calls: int, rollouts: int) -> dict[str, Any]:
    import verifiers.v1 as vf
    from verifiers.v1.configs.client import EvalClientConfig

    import nemo_gym_env
    from verifiers_nemogym.policies.judge import ScriptedJudge
    from verifiers_nemogym.policies.scripted import ScriptedPolicy
    from verifiers_nemogym.stack_access import PrivateStack

    async with ScriptedPolicy(record=False) as policy, ScriptedJudge(record=False) as judge:
        env = nemo_gym_env.load_environment(
            nemo_env=ENV,
            shared_stack=False,
            nemo_gym_version="0.4.0",
            judge={"base_url": judge.base_url, "model": "judge", "api_key_var": ""},
        )
        tasks = list(env.taskset)
        client = EvalClientConfig(base_url=policy.base_url, api_key_var="VF_NEMOGYM_BENCH_KEY")
        ctx = vf.ModelContext(model="scripted", client=client)
        async with env.serving(), aiohttp.ClientSession() as http:
            assert isinstance(env.stack, PrivateStack)
            process = env.stack.process
            assert process.relay is not None
            through = f"{process.servers['vf_judge_model']}/v1/responses"
            direct = f"{judge.base_url}/responses"
            hop: dict[str, list[float]] = {"through_nemo_gym_s": [], "direct_s": []}
            for _ in range(calls):
                hop["through_nemo_gym_s"].append(await _call_s(http, through, None))
                hop["direct_s"].append(await _call_s(http, direct, None))
            before = process.relay.stats.calls
            seconds = []
            for i in range(rollouts):
                began = time.perf_counter()
                episode = await env.run_episode(tasks[i % len(tasks)], ctx)
                seconds.append(time.perf_counter() - began)
                assert episode.ok, [e.message for e in episode.errors]
            judge_calls = process.relay.stats.calls - before
    through_s = statistics.median(hop["through_nemo_gym_s"])
    direct_s = statistics.median(hop["direct_s"])
    return {
        "env": ENV,
        "nemo_gym_version": "0.4.0",
        "judge_call_through_nemo_gym_s": round(through_s, 4),
        "judge_call_direct_s": round(direct_s, 4),
        "judge_path_cost_s": round(through_s - direct_s, 4),
        "judge_calls_per_rollout": judge_calls / rollouts,
        "rollout_s_median": round(statistics.median(seconds), 4),
        "calls": calls,
        "rollouts": rollouts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--rollouts", type=int, default=20)
    args = parser.parse_args()
    result = asyncio.run(measure(args.calls, args.rollouts))
    path = RESULTS / f"{datetime.date.today().isoformat()}-judge.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()

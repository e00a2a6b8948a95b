"""NeMo Gym's aggregate metrics of agents that keep NeMo Gym's default, computed without a stack.

Run by `metrics.compute` as `<NeMo Gym runtime python> -I aggregate_probe.py` (imports nothing
of verifiers_nemogym). Reads one JSON object on stdin, `{"agents": {name: {"impl": <folder>,
"verify_responses": [...]}}}`, and prints one JSON line: `{"computed": {name: <the
/aggregate_metrics answer>}, "not_default": {name: <why>}}`. What keeps the default, and how it
is run in process: docs/metrics.md.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from types import SimpleNamespace
from typing import Any

HOOKS = ("aggregate_metrics", "compute_metrics", "get_key_metrics", "compute_repeat_metrics")


def _agent_class(impl: str) -> type:
    from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent

    module = importlib.import_module(f"responses_api_agents.{impl}.app")
    found = [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, SimpleResponsesAPIAgent) and cls.__module__ == module.__name__
    ]
    if len(found) != 1:
        raise LookupError(f"{len(found)} agent classes in responses_api_agents.{impl}.app")
    return found[0]


def _why_not_default(cls: type) -> str | None:
    from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent

    for hook in HOOKS:
        base = getattr(SimpleResponsesAPIAgent, hook, None)
        if base is not None and getattr(cls, hook) is not base:
            return f"{cls.__name__} overrides {hook}"
    return None


def _answer(verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
    """The default `/aggregate_metrics` answer, through FastAPI as an agent server gives it."""
    from fastapi import Body, FastAPI
    from fastapi.testclient import TestClient
    from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent
    from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest
    from nemo_gym.reward_profile import AggregateMetricsMixin

    hooks = AggregateMetricsMixin()
    agent = SimpleNamespace(
        config=SimpleNamespace(skip_verification=False),
        **{h: getattr(hooks, h) for h in HOOKS[1:] if hasattr(hooks, h)},
    )

    # Declared as NeMo Gym's agent servers declare it (`Body()` default included); the types
    # set as objects, as NeMo Gym's environment servers do (this module's annotations are text).
    async def aggregate_metrics(body: AggregateMetricsRequest = Body()) -> AggregateMetrics:  # noqa: B008
        return await SimpleResponsesAPIAgent.aggregate_metrics(agent, body)

    aggregate_metrics.__annotations__ = {
        "body": AggregateMetricsRequest,
        "return": AggregateMetrics,
    }

    app = FastAPI()
    app.post("/aggregate_metrics")(aggregate_metrics)
    with TestClient(app) as client:
        reply = client.post("/aggregate_metrics", json={"verify_responses": verify_responses})
    reply.raise_for_status()
    return reply.json()


def main() -> int:
    request = json.load(sys.stdin)
    computed: dict[str, Any] = {}
    not_default: dict[str, str] = {}
    for name, agent in request["agents"].items():
        try:
            why = _why_not_default(_agent_class(agent["impl"]))
        except Exception as e:  # a module that needs its own server venv's packages, say
            why = f"its agent module does not import in the runtime ({type(e).__name__}: {e})"
        if why is not None:
            not_default[name] = why
            continue
        computed[name] = _answer(agent["verify_responses"])
    print(json.dumps({"computed": computed, "not_default": not_default}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a rollout's time goes: its phases, on the trace (`trace.info["nemo_gym_phases"]`).

The harness times NeMo Gym's `/run` (sent to answered) and the proxy times each model call of
the rollout's route (arrived to answered). From those, in seconds:

- `start`: `/run` sent to the first model call: NeMo Gym's agent and resources server setting
  up (for a container environment: the container's create and start, the session's setup
  commands, the agent CLI starting inside it);
- `model`: a model call of the rollout in flight (the door, the proxy, verifiers, the model);
- `tools`: from the first call to the last, no call in flight (the agent running tools, its own
  work between turns);
- `finish`: the last call answered to `/run` answered (the agent's export, grading, teardown);
- `run`: `/run` sent to answered, the sum of the four; `model_calls`: how many calls.

With no model call, `start` is the whole `/run` and the others are 0. What verifiers does
around `/run` (opening the route, scoring) is in the trace's own `timing`.
"""

from __future__ import annotations

from collections.abc import Iterable

PHASES = ("start", "model", "tools", "finish")
"""The phases, in order; they add up to `run`."""


def rollout_phases(
    run_began: float, run_ended: float, calls: Iterable[tuple[float, float]]
) -> dict[str, float | int]:
    """The module's phases of a `/run` sent at `run_began` and answered at `run_ended`, whose
    model calls ran over the (began, ended) intervals `calls` (one clock, seconds). Calls are
    clipped to the run; overlapping calls count once in `model`."""
    spans = sorted((max(a, run_began), min(b, run_ended)) for a, b in calls)
    spans = [(a, b) for a, b in spans if b >= a]
    run = max(run_ended - run_began, 0.0)
    if not spans:
        return {"start": round(run, 3), "model": 0.0, "tools": 0.0, "finish": 0.0,
                "run": round(run, 3), "model_calls": 0}  # fmt: skip
    busy, end = 0.0, spans[0][0]
    for a, b in spans:  # the union of the calls' intervals
        busy += max(b - max(a, end), 0.0)
        end = max(end, b)
    first, last = spans[0][0], max(b for _, b in spans)
    phases = {
        "start": first - run_began,
        "model": busy,
        "tools": (last - first) - busy,
        "finish": run_ended - last,
    }
    return {**{k: round(v, 3) for k, v in phases.items()}, "run": round(run, 3),
            "model_calls": len(spans)}  # fmt: skip

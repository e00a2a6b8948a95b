"""Conformance: NeMo Gym's own recorded rollouts, replayed through nemo-gym-env, score as recorded.

`run_conformance(envs)` takes every line of each environment's `data/example_rollouts.jsonl`
(rollouts NeMo Gym recorded with a real model), turns it back into the row that produced it,
and runs all rows of all environments as one verifiers evaluation in this process: ONE NeMo Gym
stack (`load_env(nemo_env=envs, jsonl_path=...)`, `env.serving()`, `env.run_episode`), with the
model played by `ReplayPolicy`, which answers every model call with the recorded turn. Each
rollout's reward is then compared with the recorded one (exact float equality). A mismatch or
error carries a reason: a known property of the environment from `KNOWN_REASONS`, else what was
observed (replay gap, environment output drifted, error text).

The package by job: `tables` (the per-release tables of `tables.toml` and `offline_status`,
what `nemo-gym-env list` says runs here), `rows` (a recording's row and the plan of a run),
`run` (`run_conformance` on one stack, judges replayed too, and `run_in_stacks` on successive
ones), `compare` (rewards explained; NeMo Gym's aggregate metrics of the recordings next to the
replay's), `report` (`EnvReport`, `format_report`). Printing them and the exit status are the
CLI's (`nemo-gym-env conformance`).
"""

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

The package by job: `tables` (the per-release tables of `tables.toml` and `offline_status`,
what `nemo-gym-env list` says runs here), `rows` (a recording's row and the plan of a run),
`run` (`run_conformance` on one stack, `run_in_stacks` on successive ones), `compare` (rewards
explained, aggregate metrics compared), `report` (`EnvReport`, `format_report`). Printing them
and the exit status are the CLI's (`nemo-gym-env conformance`).
"""

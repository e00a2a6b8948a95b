"""Helpers shared by the tests (imported by conftest.py and test modules as `helpers.<job>`,
through pytest's `pythonpath`), one module per job: `processes` (run tags, bounded commands,
polls, process checks), `stacks` (held shared stacks, unstarted stacks, releases), `evals`
(vf-eval command lines and traces, model contexts, episodes), `env_servers` (prime-rl's
process split: tasks loaded in another process, verifiers' env server, its train client),
`rows` (rows of the single-tool example), `load` (load without a credential)."""

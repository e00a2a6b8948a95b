"""Helpers shared by the tests (imported by conftest.py and test modules as `helpers.<job>`,
through pytest's `pythonpath`), one module per job: `processes` (run tags, bounded commands,
polls, process checks), `stacks` (held shared stacks, unstarted stacks, releases), `evals`
(vf-eval command lines and traces, model contexts, episodes), `rows` (rows of the single-tool
example), `load` (load without a credential)."""

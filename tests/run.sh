#!/usr/bin/env bash
# The whole test suite: the README's "Development" command, and what CI (.ci/run) runs.
#  1. Every test on the verifiers release uv.lock pins, in the project venv (.venv).
#  2. On the verifiers pre-release named in tests/verifiers-prerelease.txt, in a second venv
#     (.venv-verifiers-dev: the same lock, then that verifiers installed over it): the fast tier
#     and the few stack tests marked `verifiers_dev`. prime-rl runs verifiers' dev versions.
set -euo pipefail
cd "$(dirname "$0")/.."

uv run pytest

DEV_VENV=.venv-verifiers-dev
UV_PROJECT_ENVIRONMENT="$DEV_VENV" uv sync --locked
uv pip install --python "$DEV_VENV/bin/python" -r tests/verifiers-prerelease.txt
"$DEV_VENV/bin/python" -m pytest -m "not stack or verifiers_dev"

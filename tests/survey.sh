#!/usr/bin/env bash
# The stack tests CI does not run: those marked `survey`, each of which repeats a claim a CI test
# shows, on another release or path (CI's time goes to one representative test per claim), and
# the `verifiers_dev` stack tests on the locked verifiers (CI runs them on the pre-release). Run
# the way tests/run.sh runs the stack tier; their outcomes and times go to
# docs/surveys/stack-tests.md, committed as the record that they pass. Extra arguments go to
# pytest (e.g. -k, or -n 1 on a busy machine).
set -euo pipefail
cd "$(dirname "$0")/.."

RESULTS="$(mktemp -d)"
trap 'rm -rf "$RESULTS"' EXIT
status=0
uv run pytest -m "survey or (stack and verifiers_dev)" -n 2 --dist loadfile --junitxml="$RESULTS/survey.xml" "$@" || status=1
uv run python tests/survey_report.py "$RESULTS/survey.xml" docs/surveys/stack-tests.md
exit "$status"

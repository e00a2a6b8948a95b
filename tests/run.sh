#!/usr/bin/env bash
# The whole test suite: the README's "Development" command, and what CI (.ci/run) runs.
#  1. The fast tier (every test outside tests/stack/) on the verifiers release uv.lock pins, in
#     the project venv (.venv), two test files at a time (pytest-xdist). Meanwhile, in the
#     background: the NeMo Gym runtimes the stack tier uses (`nemo-gym-env setup`, into
#     $VF_NEMOGYM_CACHE), the container tests' images (`nemo-gym-env make-tasks`: a Debian base
#     from debootstrap, the hand-made tasks on it), the OpenSandbox server's venv
#     (benchmarks/opensandbox_server.py) and the pre-release venv (.venv-verifiers-dev:
#     the same lock, then the verifiers of tests/verifiers-prerelease.txt installed over it).
#  2. The stack tier (tests/stack/), two test files at a time: a stack test waits on much besides
#     CPU (model and CLI round trips, containers, deadlines, Ray's node); each worker keeps its
#     shared stacks apart (tests/stack/conftest.py). Not the tests marked `survey` (each repeats
#     a claim a test here shows, on another release or path), nor the stack tests marked
#     `verifiers_dev` (step 3 runs them; on this verifiers the OpenSandbox and harness tests here
#     show their env-server and train-mode claims): tests/survey.sh runs both.
#  3. On the verifiers pre-release, beside step 2: the tests marked `verifiers_dev` (those that
#     touch verifiers, and mypy; tests/test_tiers.py checks that every other fast test's file is
#     excluded by name), fast and stack ones, one at a time. prime-rl runs verifiers' dev
#     versions.
# The tests that observe a first run (a cold runtime, an empty cache) use caches of their own.
set -euo pipefail
cd "$(dirname "$0")/.."

DEV_VENV=.venv-verifiers-dev
# Where the run's time goes, on record: each step's end, in seconds from the start.
mark() { echo "tests/run.sh: at ${SECONDS} s: $*"; }
BACKGROUND_LOGS="$(mktemp -d)"
# An interrupted run leaves no job. `|| true`: with no job left, `kill` alone is a usage error
# (2), which under `set -e` would end the trap, and the run, with 2 whatever the tests said.
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$BACKGROUND_LOGS"' EXIT

# What `uv run` does first (the background jobs below use .venv directly), with the venv's
# bytecode compiled once: where PYTHONDONTWRITEBYTECODE is set (CI machines, container images)
# every Python process of the tests would otherwise compile all it imports, each time.
uv sync --quiet --compile-bytecode
# Each runtime the stack tier asks for: the default release and the newest (the releases between
# are the surveyed tests' own, tests/stack/test_releases.py, which build theirs). The fast tier
# asks for the default too (a build holds a lock; the other waits). 0.5-0.7 declare a Python floor
# (>= 3.13.14) the tests opt below where no such Python is installed; the opt-in changes nothing
# for a release whose floor is met.
mapfile -t RUNTIMES < <(.venv/bin/python -c '
from verifiers_nemogym.nemo.release import DEFAULT_NEMO_GYM_VERSION, RELEASES, parse_version
print(*dict.fromkeys([DEFAULT_NEMO_GYM_VERSION, max(RELEASES, key=parse_version)]))' |
    tr " " "\n")
(
    for version in "${RUNTIMES[@]}"; do
        .venv/bin/nemo-gym-env --nemo-gym-version "$version" --allow-python-below-floor setup \
            >>"$BACKGROUND_LOGS/runtimes.log" 2>&1 || echo "$version" >>"$BACKGROUND_LOGS/failed"
    done
) &
RUNTIMES_PID=$!
# The container tests' images (a Debian base from debootstrap, the hand-made tasks on it): built
# once here, reused from docker by the tests (which build them themselves if this failed).
.venv/bin/nemo-gym-env make-tasks "$BACKGROUND_LOGS/kit" >"$BACKGROUND_LOGS/images.log" 2>&1 &
IMAGES_PID=$!
# The OpenSandbox server (from the package registry, in a venv of its own under the cache) for the
# OpenSandbox tests, which build it themselves if this failed.
.venv/bin/python -m benchmarks.opensandbox_server install >"$BACKGROUND_LOGS/opensandbox.log" 2>&1 &
OPENSANDBOX_PID=$!
(
    UV_PROJECT_ENVIRONMENT="$DEV_VENV" uv sync --locked --quiet --compile-bytecode &&
        uv pip install --quiet --compile-bytecode --python "$DEV_VENV/bin/python" \
            -r tests/verifiers-prerelease.txt
) >"$BACKGROUND_LOGS/dev-venv.log" 2>&1 &
DEV_VENV_PID=$!

# Every step runs whatever an earlier one gave; the script fails if any did.
trap 'exit 130' INT  # but an interrupt (Ctrl-C) stops the run, after the step's own teardown
status=0
uv run pytest -m "not stack" -n 2 --dist loadfile || status=1
mark "the fast tier ended"

# Both background jobs are waited for and reported.
wait "$RUNTIMES_PID"
cat "$BACKGROUND_LOGS/runtimes.log"
if [[ -e "$BACKGROUND_LOGS/failed" ]]; then
    # The stack tier builds what is missing itself (and fails there, naming why); say it here.
    echo "tests/run.sh: building the NeMo Gym runtime failed for:" \
        "$(tr '\n' ' ' <"$BACKGROUND_LOGS/failed")" >&2
fi
if ! wait "$IMAGES_PID"; then
    cat "$BACKGROUND_LOGS/images.log" >&2
    echo "tests/run.sh: building the container tests' images failed (the tests retry)" >&2
fi
if ! wait "$OPENSANDBOX_PID"; then
    cat "$BACKGROUND_LOGS/opensandbox.log" >&2
    echo "tests/run.sh: installing the OpenSandbox server failed (its tests retry)" >&2
fi
if ! wait "$DEV_VENV_PID"; then
    cat "$BACKGROUND_LOGS/dev-venv.log" >&2
    echo "tests/run.sh: the verifiers pre-release venv ($DEV_VENV) was not made" >&2
    exit 1
fi
mark "the background jobs ended"

# Step 3 runs beside step 2, one test at a time (its stack tests keep their shared stacks in the
# default folder, apart from the stack tier's workers'): the stack tier leaves about a tenth of
# the CPU idle (deadlines, containers, model round trips), which this takes up. One pytest, the
# job's own process, so the EXIT trap's kill reaches it.
"$DEV_VENV/bin/python" -m pytest -m "verifiers_dev and not survey" \
    >"$BACKGROUND_LOGS/prerelease.log" 2>&1 &
PRERELEASE_PID=$!
uv run pytest -m "stack and not survey and not verifiers_dev" -n 2 --dist loadfile || status=1
mark "the stack tier ended"
prerelease=0
wait "$PRERELEASE_PID" || prerelease=$?
mark "the pre-release's tests ended"
echo "tests/run.sh: on the verifiers pre-release (run beside the stack tier):"
cat "$BACKGROUND_LOGS/prerelease.log"
[[ "$prerelease" == 0 ]] || status=1
exit "$status"

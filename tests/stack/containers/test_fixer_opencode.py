"""The fixer against the real OpenCode (1.17.11, baked into the hand-made task images), without
NeMo Gym: two containers at once, each OpenCode given its own `/ng-rollout/<id>/v1` base URL as
NeMo Gym's agent gives it, one task fixed right and the other wrong. OpenCode streams; each
container ends with exactly its own task's edit, and the fixer's log ties every call to its
rollout, OpenCode session and task (skipped without root, debootstrap, docker or npm)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from verifiers_nemogym.containers import images
from verifiers_nemogym.containers.tasks import swebench_pro, terminal_bench
from verifiers_nemogym.errors import StackError
from verifiers_nemogym.policies.fixer import FixerPolicy, FixTask


def _ready() -> bool:
    try:
        images.docker()
    except StackError:
        return False
    tools = ("debootstrap", "npm")
    return os.geteuid() == 0 and all(
        shutil.which(t) or os.path.exists(f"/usr/sbin/{t}") for t in tools
    )


pytestmark = pytest.mark.skipif(not _ready(), reason="needs root, debootstrap, npm and docker")

TINYCALC = "vf-nemogym/test-fixer:tinycalc"
WORDSTATS = "vf-nemogym/test-fixer:wordstats"


@pytest.fixture(scope="module")
def task_images() -> Iterator[None]:
    images.task_image(TINYCALC, swebench_pro.REPO)
    images.task_image(WORDSTATS, terminal_bench.REPO)
    yield
    subprocess.run(["docker", "image", "rm", TINYCALC, WORDSTATS], capture_output=True, check=False)


async def _opencode(image: str, base_url: str, prompt: str) -> str:
    """Run `opencode run` in a fresh container of `image` (host network, so 127.0.0.1 is the
    fixer); the repository's `git diff` afterwards."""
    config = {
        "model": "nemo_gym/dummy_model",
        "provider": {
            "nemo_gym": {
                "npm": "@ai-sdk/openai-compatible",
                "options": {"baseURL": base_url, "apiKey": "dummy_key"},
                # As NeMo Gym's agent sets it: without `input`, OpenCode counts the context as
                # full after one turn and compacts it again and again.
                "models": {
                    "dummy_model": {"limit": {"context": 32768, "input": 32768, "output": 32768}}
                },
            }
        },
    }
    script = 'timeout 200 opencode run --title t -- "$PROMPT" >/dev/null 2>&1; git diff'
    name = f"vf-nemogym-test-{uuid.uuid4().hex[:12]}"
    process = await asyncio.create_subprocess_exec(
        "docker", "run", "--rm", "--name", name, "--network", "host",
        "-e", f"OPENCODE_CONFIG_CONTENT={json.dumps(config)}", "-e", f"PROMPT={prompt}",
        "-e", "OPENCODE_EXPERIMENTAL_OUTPUT_TOKEN_MAX=1000000000",
        image, "bash", "-c", script,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(process.communicate(), 240)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    return out.decode()


async def test_two_rollouts_each_get_their_own_fix(task_images: None) -> None:
    tasks = [
        FixTask(swebench_pro.PROBLEM, swebench_pro.FIX, swebench_pro.WRONG, "tinycalc"),
        FixTask(terminal_bench.INSTRUCTION, terminal_bench.FIX, terminal_bench.WRONG, "wordstats"),
    ]
    async with FixerPolicy(tasks=tasks, wrong=frozenset({1})) as fixer:
        calc, words = await asyncio.gather(
            _opencode(TINYCALC, f"{fixer.url}/ng-rollout/r-calc/v1", swebench_pro.prompt()),
            _opencode(WORDSTATS, f"{fixer.url}/ng-rollout/r-words/v1", terminal_bench.INSTRUCTION),
        )
    assert "+    return a + b" in calc and "wordstats" not in calc
    assert "/ (len(found) + 1)" in words and "calc.py" not in words
    by_rollout: dict[str | None, list[tuple[object, ...]]] = {}
    for call in fixer.log:
        by_rollout.setdefault(call.rollout_id, []).append(
            (call.task, call.wrong, call.step, call.stream)
        )
        assert call.session_id and call.session_id.startswith("ses_")
    assert by_rollout == {
        "r-calc": [(0, False, "fix", True), (0, False, "final", True)],
        "r-words": [(1, True, "fix", True), (1, True, "final", True)],
    }
    sessions = {c.rollout_id: c.session_id for c in fixer.log}
    assert len(set(sessions.values())) == 2
    assert {t["function"]["name"] for t in fixer.log[0].body["tools"]} >= {"bash", "edit", "read"}

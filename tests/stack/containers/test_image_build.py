"""containers.images against the real docker daemon (skipped without one, or without root):
the base image is built once and reused; a task image holds the repo at /app as one commit
whose id only the files decide (two builds, same `base_commit`), python -> python3, and
`/base_commit`; with OpenCode baked in, its executable runs offline."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from verifiers_nemogym.containers import images
from verifiers_nemogym.errors import StackError


def _docker_ready() -> bool:
    try:
        images.docker()
    except StackError:
        return False
    return os.geteuid() == 0 and shutil.which("debootstrap") is not None


pytestmark = pytest.mark.skipif(not _docker_ready(), reason="needs root, debootstrap and docker")


@pytest.fixture
def tag() -> Iterator[str]:
    name = f"vf-nemogym/test-task:{uuid.uuid4().hex[:12]}"
    yield name
    subprocess.run(["docker", "image", "rm", "-f", name], capture_output=True, check=False)


def _run(image: str, command: str) -> str:
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, "bash", "-c", command],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return out.stdout.strip()


def test_task_image_commit_is_stable(tag: str) -> None:
    base = images.base_image()
    assert images.base_image() == base  # reused, not rebuilt
    repo = {"m.py": "X = 1\n", "pkg/run.sh": "echo hi\n"}
    first = images.image_base_commit(images.task_image(tag, repo, opencode=None))
    assert images.image_base_commit(images.task_image(tag, repo, opencode=None)) == first
    shown = _run(tag, "cd /app && git status --porcelain && git log --format=%H && python -V")
    assert shown.splitlines() == [first, shown.splitlines()[-1]]
    assert shown.splitlines()[-1].startswith("Python 3.")
    label = subprocess.run(
        ["docker", "image", "inspect", "--format", f'{{{{index .Config.Labels "{images.LABEL}"}}}}',
         tag], capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert label == "task"


def test_opencode_runs_offline(tag: str) -> None:
    images.task_image(tag, {"a.txt": "a\n"}, opencode=images.DEFAULT_OPENCODE)
    assert _run(tag, "opencode --version") == images.DEFAULT_OPENCODE

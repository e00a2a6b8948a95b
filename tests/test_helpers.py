"""The tests' own helpers point where they say (a moved helper module once pointed REPO at
tests/, and every stack test that builds or runs from the repository failed)."""

from __future__ import annotations

from helpers.processes import REPO


def test_repo_is_the_repository_root() -> None:
    assert (REPO / "pyproject.toml").is_file() and (REPO / "verifiers_nemogym").is_dir()
    assert (REPO / "environments" / "nemo_gym_env").is_dir()

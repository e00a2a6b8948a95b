"""containers.images without a docker daemon: the apt mirror read from apt's configuration
(deb822 and one-line forms, comments ignored), the task Dockerfile, repository checks, and the
one-line errors for what the machine lacks; the hand-made tasks' rows, patches and scripts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from verifiers_nemogym.containers import images
from verifiers_nemogym.containers.kit import swe_next, swebench_pro, terminal_bench
from verifiers_nemogym.errors import ConfigError, StackError

SOURCES = """Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main

Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian/
Suites: bookworm bookworm-updates
Components: main
"""


def test_mirror_from_deb822_sources(tmp_path: Path) -> None:
    (tmp_path / "debian.sources").write_text(SOURCES)
    assert images.apt_mirror(tmp_path, tmp_path / "none") == "http://mirror.example/debian"


def test_mirror_from_sources_list(tmp_path: Path) -> None:
    listing = tmp_path / "sources.list"
    listing.write_text(
        "# deb http://old.example/debian bookworm main\n"
        "deb http://mirror.example/debian-security bookworm-security main\n"
        "deb [arch=amd64] http://mirror.example/debian bookworm main\n"
    )
    assert images.apt_mirror(tmp_path / "none", listing) == "http://mirror.example/debian"


def test_no_mirror_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no Debian archive found"):
        images.apt_mirror(tmp_path, tmp_path / "sources.list")


def test_missing_docker_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(StackError, match=r"^no `docker` CLI on PATH") as caught:
        images.docker()
    assert "\n" not in str(caught.value)


def test_dockerfile() -> None:
    text = images.dockerfile("base:1", opencode=True, ca_bundle=True)
    assert text.startswith("FROM base:1\n")
    for expected in (
        "RUN ln -sf python3 /usr/bin/python",
        "COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt",
        "COPY opencode /usr/local/bin/opencode",
        "OPENCODE_DISABLE_MODELS_FETCH=true",
        "HOME=/root",
        "COPY repo /app",
        f"GIT_COMMITTER_DATE={images.COMMIT_DATE}",
        "git rev-parse HEAD > /base_commit",
    ):
        assert expected in text
    bare = images.dockerfile("base:1", opencode=False, ca_bundle=False)
    assert "opencode" not in bare.replace("OPENCODE_", "") and "ca-certificates.crt" not in bare


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/../../x", ".git/config", ""])
def test_repository_paths_stay_inside(name: str) -> None:
    with pytest.raises(ConfigError):
        images._repo_files({name: "x"})


def test_bad_tag() -> None:
    with pytest.raises(ConfigError, match="not a docker image tag"):
        images.task_image("Bad Tag", {"a": "b"})


def _run_tests(repo: dict[str, str], folder: Path, patch: str | None = None) -> str:
    for name, text in repo.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    if patch is not None:
        subprocess.run(["git", "init", "-q"], cwd=folder, check=True)
        subprocess.run(["git", "apply", "-"], cwd=folder, input=patch, text=True, check=True)
    return str(folder)


@pytest.mark.parametrize(
    ("patch", "add_passes"), [(None, False), ("golden", True), ("wrong", False)]
)
def test_tinycalc_row_scripts_grade(tmp_path: Path, patch: str | None, add_passes: bool) -> None:
    """The row's run script and parser (run here, with this Python) grade the golden patch
    PASSED and no patch or the wrong one FAILED, under the row's test names."""
    diff = {"golden": swebench_pro.GOLDEN_PATCH, "wrong": swebench_pro.WRONG_PATCH}.get(patch or "")
    app = Path(_run_tests(swebench_pro.REPO, tmp_path / "app", diff))
    row = swebench_pro.row("tinycalc-0001", "0" * 40)
    test = subprocess.run(
        [sys.executable, "-m", "unittest", "-v", *row["selected_test_files_to_run"]],
        cwd=app, capture_output=True, text=True,
    )  # fmt: skip
    (tmp_path / "out.log").write_text(test.stdout)
    (tmp_path / "err.log").write_text(test.stderr)
    (tmp_path / "parser.py").write_text(row["parser_script"])
    subprocess.run(
        [sys.executable, tmp_path / "parser.py", tmp_path / "out.log", tmp_path / "err.log",
         tmp_path / "out.json"], check=True,
    )  # fmt: skip
    statuses = {
        t["name"]: t["status"] for t in json.loads((tmp_path / "out.json").read_text())["tests"]
    }
    [f2p], [p2p] = row["fail_to_pass"], row["pass_to_pass"]
    assert statuses == {f2p: "PASSED" if add_passes else "FAILED", p2p: "PASSED"}
    assert row["before_repo_set_cmd"].splitlines()[-1].endswith(swebench_pro.TEST_FILE)


def test_terminal_bench_folder_and_row(tmp_path: Path) -> None:
    files = terminal_bench.folder("img:1")
    assert set(files) >= {"tests/test.sh", "solution/solve.sh", "instruction.md"}
    assert "/logs/verifier/reward.txt" in files["tests/test.sh"]
    assert not any(w in files["tests/test.sh"] for w in ("curl", "wget", "pip", "uv "))
    row = terminal_bench.row("img:1", tmp_path)
    assert (row["task_name"], row["docker_image"], row["task_folder"]) == (
        terminal_bench.TASK_NAME,
        "img:1",
        str(tmp_path),
    )
    assert terminal_bench.INSTRUCTION in json.dumps(row["responses_create_params"])


@pytest.mark.parametrize(("patch", "resolved"), [(None, False), ("golden", True), ("wrong", False)])
def test_textkit_expected_output_matches_pytest(
    tmp_path: Path, patch: str | None, resolved: bool
) -> None:
    """swe_next's rule: every test `expected_output_json` marks PASSED must pass in pytest -rA's
    short summary, keyed by the test id after the file path."""
    diff = {"golden": swe_next.GOLDEN_PATCH, "wrong": swe_next.WRONG_PATCH}.get(patch or "")
    workdir = Path(_run_tests(swe_next.REPO, tmp_path / "testbed", diff))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "r2e_tests"],
        cwd=workdir, capture_output=True, text=True, env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    ).stdout  # fmt: skip
    summary = out.split("short test summary info", 1)[1].splitlines()
    seen = {
        line.split("::", 1)[1].split(" - ")[0]: line.split()[0]
        for line in summary
        if line.startswith(("PASSED", "FAILED", "ERROR"))
    }
    expected = json.loads(swe_next.row("img:1", "0" * 40)["expected_output_json"])
    assert all(seen.get(name) == "PASSED" for name in expected) == resolved
    assert set(seen) == set(expected)

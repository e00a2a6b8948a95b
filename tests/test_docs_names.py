"""What README and docs name exists in the code: the package files and tests they cite, the
Python names they spell out, the `--env.taskset.*` options, and every `nemo-gym-env` command
line with its options. Catches a rename or a removed option that the prose did not follow
(what they claim beyond names is shown by the tests and benchmarks they cite)."""

from __future__ import annotations

import argparse
import functools
import importlib
import re
from pathlib import Path

import pytest

from verifiers_nemogym.cli import _parser
from verifiers_nemogym.nemo.release import ReleaseFiles, release_files
from verifiers_nemogym.options import options

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "verifiers_nemogym"
PAGES = [
    ROOT / "README.md",
    ROOT / "environments/nemo_gym_env/README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
IDS = [str(p.relative_to(ROOT)) for p in PAGES]
SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
# Folders of this repository a cited path starts with (NeMo Gym's own `environments/<name>`
# and the files a run writes are not this repository's).
OURS = ("tests/", "docs/", "benchmarks/", "verifiers_nemogym/", *(
    f"{d.name}/" for d in PACKAGE.iterdir() if d.is_dir() and (d / "__init__.py").exists()
))  # fmt: skip


def _words(page: Path) -> list[str]:
    """Every word of the page's inline code spans and fenced blocks."""
    text = page.read_text()
    spans = SPAN.findall(FENCE.sub("", text)) + FENCE.findall(text)
    return [w.strip("()[],;:.'\"") for span in spans for w in span.split()]


def _cited_path(word: str) -> str | None:
    path = word.split("::")[0]
    if path.endswith(".py") and ("/" not in path or path.startswith(OURS)):
        return path
    return path if path.startswith(OURS) and "<" not in path else None


def _exists(path: str) -> bool:
    if "/" not in path:  # a module named by its file alone, e.g. in a folder's table row
        return any(PACKAGE.rglob(path)) or (ROOT / path).exists()
    if any((base / path).exists() for base in (ROOT, PACKAGE)):
        return True
    # NeMo Gym's own `benchmarks/` pairings share our folder's name: a YAML there is theirs.
    return path.endswith(".yaml") and (_nemo_gym_07().root / path).is_file()


@functools.cache
def _nemo_gym_07() -> ReleaseFiles:
    return release_files("0.7.0")


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_cited_files_exist(page: Path) -> None:
    missing = {p for w in _words(page) if (p := _cited_path(w)) and not _exists(p)}
    assert missing == set()


def _test_names() -> set[str]:
    source = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    # Module-level tests and the methods of test classes (`Test*`, indented).
    return set(re.findall(r"^(?:    )?(?:async )?def (test_\w+)", source, re.MULTILINE))


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_cited_tests_exist(page: Path) -> None:
    names = _test_names()
    cited = {m.group(1) for w in _words(page) if (m := re.search(r"(?:::|^)(test_\w+)$", w))}
    assert cited - names == set()


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_spelled_out_python_names_resolve(page: Path) -> None:
    unresolved = []
    for word in _words(page):
        if not re.fullmatch(r"verifiers_nemogym(\.\w+)+", word):
            continue
        parts = word.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                value: object = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for name in parts[cut:]:
                    value = getattr(value, name)
            except AttributeError:
                unresolved.append(word)
            break
        else:
            unresolved.append(word)
    assert unresolved == []


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_taskset_options_exist(page: Path) -> None:
    keys = {o.key for o in options()}
    named = {
        w.split("=")[0] for w in _words(page) if w.startswith("--env.taskset.") and "*" not in w
    }
    unknown = {o for o in named if o.removeprefix("--env.taskset.").replace("-", "_") not in keys}
    assert unknown == set()


def _command_lines(page: Path) -> list[list[str]]:
    """The `nemo-gym-env` command lines of the page (as a command, not as vf-eval's env id):
    each cut at a comment or the end of its line or span."""
    text = page.read_text()
    lines = SPAN.findall(FENCE.sub("", text)) + [
        line for block in FENCE.findall(text) for line in block.splitlines()
    ]
    found = []
    for line in lines:
        match = re.search(r"(?:^|uv run )nemo-gym-env\s+(.*)", line.strip())
        if match:
            found.append(match.group(1).split("#")[0].split())
    return found


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _problems(words: list[str]) -> list[str]:
    parser = _parser()
    problems = []
    for word in words:
        word = word.strip("[]|,.")
        options = {o for a in parser._actions for o in a.option_strings}
        if word.startswith("-"):
            option = word.split("=")[0]
            if option.endswith("*"):
                known = any(o.startswith(option.rstrip("*")) for o in options)
            else:
                known = option in options or option == "--"
            if not known:
                problems.append(f"{' '.join(words)}: no option {option}")
            if option == "--":
                break  # what follows goes to another program
        elif (sub := _subparsers(parser)) and word in sub:
            parser = sub[word]
        elif sub and re.fullmatch(r"[a-z][a-z-]*", word) and parser.prog.endswith("nemo-gym-env"):
            problems.append(f"{' '.join(words)}: no command {word}")
            break
    return problems


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_nemo_gym_env_command_lines_parse(page: Path) -> None:
    assert [p for words in _command_lines(page) for p in _problems(words)] == []


def test_the_checks_see_drift() -> None:
    """The checks above fail on the kinds of drift they are for."""
    assert not _exists("nemo/shared.py") and _exists("shared/protocol.py")
    assert _problems(["stack", "status", "--jsn"]) == ["stack status --jsn: no option --jsn"]
    assert _problems(["stak", "up"]) == ["stak up: no command stak"]
    assert _problems(["--nemo-gym-version", "0.7.0", "stack", "up", "ENV", "--judge.*"]) == []
    assert "test_options_page_matches_the_config" in _test_names()


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> set[str]:
    """Every command line's command words: `setup`, `stack up`, `serve replay`, ..."""
    found: set[str] = set()
    for name, sub in _subparsers(parser).items():
        found |= _commands(sub, f"{prefix}{name} ") or {f"{prefix}{name}"}
    return found


def test_the_cli_usage_docstring_lists_every_command() -> None:
    import verifiers_nemogym.cli

    commands = _commands(_parser())
    listed = set()
    for line in (verifiers_nemogym.cli.__doc__ or "").splitlines():
        if not line.startswith("nemo-gym-env "):
            continue
        words = line.split()[1:]
        named = [" ".join(words[:n]) for n in range(len(words), 0, -1)]
        found = next((c for c in named if c in commands), None)
        assert found is not None, f"the usage names no command: {line}"
        listed.add(found)
    assert listed == commands

"""The documentation stays true to the code: docs/options.md is what the config's docstrings
generate, and every relative link in the README and docs/ reaches an existing file and heading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.evals import ListSurvey

from verifiers_nemogym.options import REGENERATE, options, options_markdown

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    ROOT / "README.md",
    ROOT / "environments/nemo_gym_env/README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _locked_verifiers() -> str:
    lock = (ROOT / "uv.lock").read_text()
    found = re.search(r'\[\[package\]\]\nname = "verifiers"\nversion = "([^"]+)"', lock)
    assert found, "no verifiers in uv.lock"
    return found.group(1)


@pytest.mark.verifiers_dev  # its second half is for the verifiers pre-release (run.sh)
def test_options_page_matches_the_config() -> None:
    """Generated on the locked verifiers: this package's options must match on any verifiers
    (the suite also runs on a pre-release), the inherited ones on the locked release."""
    import verifiers

    written = (ROOT / "docs/options.md").read_text()
    generated = options_markdown()
    inherited = "## Inherited from verifiers"
    ours = written.split(inherited)[0] == generated.split(inherited)[0]
    assert ours, f"docs/options.md is out of date: run `{REGENERATE}`"
    if verifiers.__version__ == _locked_verifiers():
        assert written == generated, f"docs/options.md is out of date: run `{REGENERATE}`"


def test_every_option_has_a_docstring() -> None:
    """Every option this package declares; verifiers documents (or not) its own."""
    assert [o.key for o in options() if not o.doc and o.owner.startswith("verifiers_nemogym")] == []
    keys = {o.key for o in options()}
    assert {"nemo_env", "shared_stack", "task.run_timeout", "id"} <= keys
    assert "task" not in keys  # the nested config is expanded, not listed


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", _prose(page.read_text()), re.MULTILINE):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _prose(text: str) -> str:
    """The page without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target} (no heading #{anchor} in {linked.name})")
    assert broken == [], f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_runtime_page_quotes_the_040_survey() -> None:
    """docs/runtime.md's NeMo Gym 0.4.0 figures are the committed survey's (CI reruns the survey
    and compares it with the committed one: tests/stack/nemo/test_catalog_releases.py)."""
    survey = ListSurvey.read((ROOT / "docs/surveys/nemo-gym-0.4.0-environments.md").read_text())
    (rs, env), (all_rs, all_env) = survey.resolvable, survey.total
    assert env == all_env and [row[0] for row in survey.unresolved] == ["| gdpval"]
    page = " ".join((ROOT / "docs/runtime.md").read_text().split())
    assert (
        f"NeMo Gym 0.4.0, {rs} of {all_rs} resources servers and all {all_env} `environments/` "
        "entries (gdpval's config defines no agent; "
        "[the survey](surveys/nemo-gym-0.4.0-environments.md)"
    ) in page


def test_runtime_page_quotes_the_070_survey() -> None:
    """docs/runtime.md's NeMo Gym 0.7.0 figures are the committed `list --resolve` survey's:
    its count line, its table's rows, and the reasons of the ones that do not resolve."""
    survey = ListSurvey.read((ROOT / "docs/surveys/nemo-gym-0.7.0-environments.md").read_text())
    (rs, env), (all_rs, all_env) = survey.resolvable, survey.total
    unresolved = survey.unresolved
    no_agent = [row for row in unresolved if "defines no agent server" in row[5]]
    moved = [row for row in unresolved if " moved to " in row[5]]
    rejected = [row for row in unresolved if "NeMo Gym cannot merge" in row[5]]
    paired = [row for row in unresolved if row[5].startswith("ran here with --env.taskset")]
    assert len(no_agent) + len(paired) + len(moved) + len(rejected) == len(unresolved)
    page = " ".join((ROOT / "docs/runtime.md").read_text().split())
    assert (
        f"NeMo Gym 0.7.0, {rs} of {all_rs} resources servers and {env} of {all_env} "
        "`environments/` entries ([the survey](surveys/nemo-gym-0.7.0-environments.md))"
    ) in page
    assert (
        f"The other {len(unresolved)} get a one-line reason: {len(no_agent)} default configs "
        f"define no agent"
    ) in page
    assert f", {len(paired)} are container environments that ran here with the agent" in page
    assert f", {len(moved)} moved stubs, and {rejected[0][0].removeprefix('| ')}," in page
    assert len(rejected) == 1

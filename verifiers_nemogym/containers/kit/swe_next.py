"""The hand-made swe_next task `textkit` (NeMo Gym 0.7.0's `resources_servers/swe_next`, whose
rows name their own image in `image_ref`): `slugify` in `/workspace/textkit.py` joins words with
hyphens but does not lower-case them. The right fix lower-cases the text.

swe_next's layout, what its server expects of an R2E image: the repository in `/workspace` (the
server links `/testbed` to it and inits git there itself), `.venv/bin/python` with pytest in the
workdir, the hidden tests in `r2e_tests/` (removed while the agent works, present again in the
verifier's fresh container), graded by the fixed command `.venv/bin/python -m pytest -rA
r2e_tests` against `expected_output_json` (every test expected PASSED must pass).

Contract: `REPO` is the repository (relative path -> text), `WORKDIR` where the image holds it,
`SETUP` the image's setup commands (Debian's pytest from the base's apt mirror, which needs the
network at build time, and a venv that sees it); `row(image_ref, base_commit)` is the swe_next
row; `FIX`/`WRONG` are the right fix and a real but useless edit as shell commands, and
`GOLDEN_PATCH`/`WRONG_PATCH` the same edits as diffs.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

NAME = "textkit"
INSTANCE_ID = "vf-nemogym__textkit-0001"
WORKDIR = "/workspace"
ROW_WORKDIR = "/testbed"
"""The row's `workdir`: swe_next links it to `/workspace` in every container it starts."""

TEXTKIT = '''"""textkit: small text helpers."""


def slugify(text):
    """The words of text, lower-cased, joined by hyphens."""
    return "-".join(text.split())


def shout(text):
    """text in upper case with an exclamation mark."""
    return text.upper() + "!"
'''

TESTS = """from textkit import shout, slugify


def test_slugify_lowercases():
    assert slugify("Hello Big World") == "hello-big-world"


def test_slugify_joins_words():
    assert slugify("a  b c") == "a-b-c"


def test_shout():
    assert shout("hi") == "HI!"
"""

REPO: dict[str, str] = {
    "textkit.py": TEXTKIT,
    "r2e_tests/__init__.py": "",
    "r2e_tests/test_textkit.py": TESTS,
    ".gitignore": ".venv/\n__pycache__/\n.pytest_cache/\n",
}

SETUP = (
    "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
    "--no-install-recommends python3-pytest && rm -rf /var/lib/apt/lists/*",
    f"python3 -m venv --without-pip --system-site-packages {WORKDIR}/.venv",
)

PROBLEM = (
    "textkit issue (textkit-0001): textkit.slugify must lower-case the text, but "
    "slugify('Hello Big World') returns 'Hello-Big-World' instead of 'hello-big-world'. "
    "Fix slugify in textkit.py."
)
FIX = f'sed -i \'s/"-".join(text.split())/"-".join(text.lower().split())/\' {WORKDIR}/textkit.py'
WRONG = f'sed -i \'s/"-".join(text.split())/"-".join(text.strip().split())/\' {WORKDIR}/textkit.py'

EXPECTED = {
    "test_slugify_lowercases": "PASSED",
    "test_slugify_joins_words": "PASSED",
    "test_shout": "PASSED",
}
"""pytest -rA's short summary of the fixed repository, keyed as swe_next keys it (the test id
after the file path)."""


def _diff(old: str, new: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), "a/textkit.py", "b/textkit.py"
    )
    return "diff --git a/textkit.py b/textkit.py\n" + "".join(lines)


GOLDEN_PATCH = _diff(TEXTKIT, TEXTKIT.replace("text.split()", "text.lower().split()"))
WRONG_PATCH = _diff(TEXTKIT, TEXTKIT.replace("text.split()", "text.strip().split()"))


def row(image_ref: str, base_commit: str) -> dict[str, Any]:
    """The swe_next row for the task image `image_ref` (whose repository is at `base_commit`)."""
    return {
        "instance_id": INSTANCE_ID,
        "repo": "vf-nemogym/textkit",
        "language": "python",
        "workdir": ROW_WORKDIR,
        "image_ref": image_ref,
        "base_commit": base_commit,
        "patch": GOLDEN_PATCH,
        "test_patch": "",
        "problem_statement": PROBLEM,
        "FAIL_TO_PASS": ["test_slugify_lowercases"],
        "PASS_TO_PASS": ["test_slugify_joins_words", "test_shout"],
        "expected_output_json": json.dumps(EXPECTED),
        "responses_create_params": {"input": [{"role": "user", "content": PROBLEM}]},
    }

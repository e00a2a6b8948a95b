"""The hand-made swebench_pro task `tinycalc`: a tiny Python repository whose `add` returns
`a - b`; one unittest fails (`test_add`), one passes (`test_sub`). The right fix is `a + b`.

Contract: `REPO` is the repository (relative path -> text); `row(image_tag, base_commit)` is
the swebench_pro row with every field NeMo Gym 0.7.0's swebench_pro reads (instance fields, the
run and parser scripts, `before_repo_set_cmd`, `responses_create_params`); `FIX`/`WRONG` are
the shell commands a scripted agent runs (in the container, any cwd) for the right fix and for
a real but useless edit, and `GOLDEN_PATCH`/`WRONG_PATCH` the same edits as diffs.
"""

from __future__ import annotations

import difflib
from typing import Any

NAME = "tinycalc"
INSTANCE_ID = "tinycalc-0001"
TEST_FILE = "tests/test_calc.py"

CALC = '''"""tinycalc: two-number arithmetic."""


def add(a, b):
    """The sum of a and b."""
    return a - b


def sub(a, b):
    """a minus b."""
    return a - b
'''

TESTS = """import unittest

from calc import add, sub


class TestCalc(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_sub(self):
        self.assertEqual(sub(5, 3), 2)


if __name__ == "__main__":
    unittest.main()
"""

REPO: dict[str, str] = {
    "calc.py": CALC,
    "tests/__init__.py": "",
    TEST_FILE: TESTS,
    ".gitignore": "__pycache__/\n",
    "README.md": "# tinycalc\n\nTwo-number arithmetic: `add`, `sub`.\n",
}

PROBLEM = (
    "tinycalc bug report (tinycalc-0001): calc.add(a, b) must return the sum of a and b, but "
    "add(2, 3) returns -1 instead of 5. Fix add in calc.py without changing sub or the tests."
)
FIX = "sed -i '/^def add/,/return/ s/return a - b/return a + b/' /app/calc.py"
WRONG = "sed -i '/^def add/,/return/ s/return a - b/return b - a/' /app/calc.py"

# `python -m unittest -v` over the comma-separated test files swebench_pro passes as $1.
RUN_SCRIPT = """#!/bin/bash
set -e
cd /app
IFS=',' read -ra files <<< "$1"
python -m unittest -v "${files[@]}"
"""

# Reads unittest -v lines (`test_add (tests.test_calc.TestCalc.test_add) ... ok`, or the
# pre-3.11 form without the method) from both logs; writes {"tests": [{"name", "status"}]} with
# names as `tests/test_calc.py::TestCalc::test_add`.
PARSER_SCRIPT = r"""import json
import re
import sys

OUTCOMES = "ok|FAIL|ERROR|skipped|expected failure|unexpected success"
LINE = re.compile(r"^(\w+) \(([\w.]+)\) \.\.\. (" + OUTCOMES + ")")
STATUS = {"ok": "PASSED", "FAIL": "FAILED", "ERROR": "ERROR", "unexpected success": "FAILED",
          "expected failure": "PASSED"}


def main(stdout_path, stderr_path, output_path):
    tests = {}
    for path in (stdout_path, stderr_path):
        with open(path, errors="replace") as handle:
            for line in handle:
                match = LINE.match(line.rstrip("\n"))
                if not match:
                    continue
                method, dotted, outcome = match.groups()
                parts = dotted.split(".")
                if parts[-1] == method:
                    parts = parts[:-1]
                module, cls = parts[:-1], parts[-1]
                name = "/".join(module) + ".py::" + cls + "::" + method
                tests[name] = STATUS.get(outcome, "SKIPPED")
    with open(output_path, "w") as handle:
        json.dump({"tests": [{"name": n, "status": s} for n, s in tests.items()]}, handle)


if __name__ == "__main__":
    main(*sys.argv[1:4])
"""


def _diff(path: str, old: str, new: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


def _add_returns(expression: str) -> str:
    head, tail = CALC.split("def sub", 1)
    return head.replace("return a - b", f"return {expression}") + "def sub" + tail


GOLDEN_PATCH = _diff("calc.py", CALC, _add_returns("a + b"))
WRONG_PATCH = _diff("calc.py", CALC, _add_returns("b - a"))


def prompt() -> str:
    """The task prompt OpenCode receives (shaped like NeMo Gym's SWE-bench Pro prompt)."""
    return (
        "<uploaded_files>\n/app\n</uploaded_files>\n"
        "I've uploaded a code repository in the directory /app. Consider the following PR "
        f"description:\n\n<pr_description>\n{PROBLEM}\n</pr_description>\n\n"
        "Make the minimal changes to non-test files in /app so that the PR description is "
        "satisfied. Do not modify the tests."
    )


def row(image_tag: str, base_commit: str) -> dict[str, Any]:
    """The swebench_pro row for the image `<repository>:<image_tag>` holding the repo at
    `base_commit` (the config's `image_repository` supplies the repository)."""
    return {
        "repo": "vf-nemogym/tinycalc",
        "instance_id": INSTANCE_ID,
        "base_commit": base_commit,
        "patch": GOLDEN_PATCH,
        "test_patch": "",
        "problem_statement": PROBLEM,
        "requirements": "",
        "interface": "",
        "repo_language": "python",
        "fail_to_pass": [f"{TEST_FILE}::TestCalc::test_add"],
        "pass_to_pass": [f"{TEST_FILE}::TestCalc::test_sub"],
        "issue_specificity": "",
        "issue_categories": "",
        "before_repo_set_cmd": (
            f"git reset --hard {base_commit}\ngit checkout {base_commit} -- {TEST_FILE}"
        ),
        "selected_test_files_to_run": [TEST_FILE],
        "dockerhub_tag": image_tag,
        "image_digest": "",
        "run_script": RUN_SCRIPT,
        "parser_script": PARSER_SCRIPT,
        "base_dockerfile": "",
        "instance_dockerfile": "",
        "subset": "pro",
        "split": "test",
        "responses_create_params": {"input": [{"role": "user", "content": prompt()}]},
    }

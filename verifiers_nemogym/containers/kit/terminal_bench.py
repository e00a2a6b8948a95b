"""The hand-made terminal_bench_2_1 task `wordstats`: `/app/wordstats.py` counts the words of a
file, but its `mean_length` divides by one word too few. The right fix divides by the number of
words.

Contract: `REPO` is what the task image holds at `/app` (relative path -> text); `FOLDER` is the
task folder NeMo Gym 0.7.0's terminal_bench_2_1 reads (relative path -> text): `instruction.md`,
`task.toml`, `tests/test.sh` (plain `python3 -m unittest`, downloads nothing; writes
`/logs/verifier/reward.txt`: 1 if every test passes, else 0) with its test file, and
`solution/solve.sh` (the golden fix; the server uploads it to the image's WORKDIR and runs it).
`row(image, folder)` is the row `{task_name, docker_image, task_folder, responses_create_params}`.
`FIX`/`WRONG` are the right fix and a real but useless edit, as shell commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

NAME = "wordstats"
TASK_NAME = "vf-nemogym/wordstats"

WORDSTATS = '''"""wordstats: statistics of the words of a text file."""

import sys


def words(text):
    return text.split()


def mean_length(text):
    found = words(text)
    if not found:
        return 0.0
    return sum(len(w) for w in found) / (len(found) - 1)


if __name__ == "__main__":
    with open(sys.argv[1]) as handle:
        print(f"{mean_length(handle.read()):.2f}")
'''

REPO: dict[str, str] = {
    "wordstats.py": WORDSTATS,
    "sample.txt": "the quick brown fox\n",
    ".gitignore": "__pycache__/\n",
}

INSTRUCTION = (
    "wordstats task (vf-nemogym/wordstats): `python3 /app/wordstats.py /app/sample.txt` should "
    "print the mean word length of the file, 4.00 for the sample, but prints 5.33. Fix "
    "mean_length in /app/wordstats.py."
)

TEST_PY = """import sys
import unittest

sys.path.insert(0, "/app")

from wordstats import mean_length, words  # noqa: E402


class TestWordStats(unittest.TestCase):
    def test_words(self):
        self.assertEqual(words("a bb  ccc"), ["a", "bb", "ccc"])

    def test_mean_length(self):
        self.assertAlmostEqual(mean_length("the quick brown fox"), 4.0)
        self.assertAlmostEqual(mean_length("ab cdef"), 3.0)
        self.assertAlmostEqual(mean_length("word"), 4.0)

    def test_empty(self):
        self.assertEqual(mean_length(""), 0.0)


if __name__ == "__main__":
    unittest.main()
"""

TEST_SH = """#!/bin/bash
# Downloads nothing: the image's own python3 runs the tests.
mkdir -p /logs/verifier
if (cd /tests && python3 -m unittest -v test_wordstats) > /logs/verifier/tests.log 2>&1; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
cat /logs/verifier/tests.log
"""

FIX = "sed -i 's|/ (len(found) - 1)|/ len(found)|' /app/wordstats.py"
WRONG = "sed -i 's|/ (len(found) - 1)|/ (len(found) + 1)|' /app/wordstats.py"

SOLVE_SH = f"""#!/bin/bash
set -e
{FIX}
"""


def folder(docker_image: str) -> dict[str, str]:
    """The task folder's files for the task image `docker_image`."""
    return {
        "instruction.md": INSTRUCTION + "\n",
        "task.toml": (
            f'[task]\nname = "{TASK_NAME}"\n\n[environment]\ndocker_image = "{docker_image}"\n'
        ),
        "tests/test.sh": TEST_SH,
        "tests/test_wordstats.py": TEST_PY,
        "solution/solve.sh": SOLVE_SH,
    }


def row(docker_image: str, task_folder: Path) -> dict[str, Any]:
    """The terminal_bench_2_1 row (what NeMo Gym's prepare.py writes for a task)."""
    return {
        "responses_create_params": {"input": [{"role": "user", "content": INSTRUCTION}]},
        "task_name": TASK_NAME,
        "docker_image": docker_image,
        "task_folder": str(task_folder),
    }

"""Write the survey's report (tests/survey.sh): `python tests/survey_report.py JUNIT_XML REPORT`.

The report is a Markdown table of every surveyed test with its outcome and seconds, headed by
the date, the commit (with `+changes` when the tree differed from it) and the load average when
the run ended: the committed record of the stack tests CI does not run."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def outcome(case: ET.Element) -> str:
    """passed, or failed / error / skipped with the first line of its message."""
    for kind in ("failure", "error", "skipped"):
        found = case.find(kind)
        if found is not None:
            first = (found.get("message") or "").splitlines()[:1]
            return f"{kind}: {first[0][:120]}" if first else kind
    return "passed"


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    return f"{head}+changes" if git("status", "--porcelain", "--untracked-files=no") else head


def report(junit: Path) -> str:
    cases = ET.parse(junit).getroot().iter("testcase")
    rows = [
        (f"{c.get('classname', '').replace('.', '/')}.py::{c.get('name')}",
         outcome(c), float(c.get("time") or 0))
        for c in cases
    ]  # fmt: skip
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        "# Surveyed stack tests",
        "",
        "The stack tests CI does not run (marked `survey`; each repeats a claim a CI test shows, "
        "on another release or path), and the `verifiers_dev` stack tests on the locked "
        "verifiers (CI runs them on the pre-release), as `tests/survey.sh` last ran them: "
        "written by it, not by hand.",
        "",
        f"Run: {when}, commit {commit()}, load average at the end {load}; "
        f"{sum(o == 'passed' for _, o, _ in rows)} of {len(rows)} passed.",
        "",
        "| test | outcome | seconds |",
        "|---|---|---|",
        *(f"| `{name}` | {result} | {seconds:.0f} |" for name, result, seconds in sorted(rows)),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(report(Path(sys.argv[1])))

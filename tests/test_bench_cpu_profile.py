"""The warm figure's CPU profile (fast tier, no stack): py-spy's raw samples charged to the code
that ran them, a library's frames to their caller, imports apart; and a real py-spy run."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import cpu_profile

SITE = "/venv/lib/python3.11/site-packages"
LOOP = f"run_forever ({SITE}/../asyncio/base_events.py:608);_run_once (asyncio/base_events.py:1922)"
INTERCEPT = f"handle_request ({SITE}/verifiers/utils/interception.py:210)"
COMMIT = f"_commit_turn ({SITE}/verifiers/graph.py:88)"
PYDANTIC = f"model_construct ({SITE}/pydantic/main.py:310)"
SIGNATURE = "_signature_fromstr (/usr/lib/python3.11/inspect.py:2210)"
OURS = "_post_run (/work/repo/verifiers_nemogym/harness.py:400)"
JSON = "loads (/usr/lib/python3.11/json/__init__.py:346)"
IMPORT = "_find_and_load (<frozen importlib._bootstrap>:1176)"
RAW = "\n".join(
    [
        f"{LOOP};{INTERCEPT};{COMMIT};{PYDANTIC};{SIGNATURE} 30",
        f"{LOOP};{INTERCEPT} 20",
        f"{LOOP};{OURS};{JSON} 15",  # json charged to us, its caller
        f"{LOOP};{INTERCEPT};{OURS} 5",  # ours called by verifiers: ours (innermost)
        f"{LOOP} 25",
        f"<module> (/bin/vf-eval:3);{IMPORT};{INTERCEPT} 40",  # start-up
        "not a sample line",
    ]
)


def test_samples_go_to_the_innermost_owner_and_imports_apart() -> None:
    profile = cpu_profile.read_raw(RAW)
    assert profile.owners == {"verifiers": 0.5, "ours": 0.2, cpu_profile.EVENT_LOOP: 0.25}
    assert profile.import_s == 0.4 and profile.signature_s == 0.3
    assert profile.top["verifiers"] == {
        "_commit_turn (graph.py)": 0.3,
        "handle_request (interception.py)": 0.2,
    }
    table = cpu_profile.per_rollout(profile, rollouts=10)
    assert table["cpu_ms_per_rollout"] == {
        "verifiers": 50.0,
        cpu_profile.EVENT_LOOP: 25.0,
        "ours": 20.0,
    }
    assert table["cpu_ms_per_rollout_total"] == 95.0
    assert table["signature_ms_per_rollout"] == 30.0
    assert table["top_ms_per_rollout"]["ours"] == [["_post_run (harness.py)", 20.0]]


def test_a_real_py_spy_run_sees_the_sampled_programs_own_function(tmp_path: Path) -> None:
    """py-spy attached to a real process that spins in a function of a file named like our
    package's: its samples are charged to `ours`, and the program's output comes back."""
    package = tmp_path / "verifiers_nemogym"
    package.mkdir()
    (package / "spin.py").write_text(
        textwrap.dedent(
            """
            import time

            def spin_for_a_while():
                end = time.process_time() + 1.5
                while time.process_time() < end:
                    pass
                print("spun")
            """
        )
    )
    code = "import sys; sys.path.insert(0, sys.argv[1]); import spin; spin.spin_for_a_while()"
    cmd = [sys.executable, "-c", code, str(package)]
    status, out, profile = asyncio.run(cpu_profile.record(cmd, {}, None, timeout=120))
    assert status == 0 and "spun" in out
    assert profile.owners["ours"] >= 0.5, profile.owners  # 1.5 s of CPU, sampled
    assert "spin_for_a_while (spin.py)" in profile.top["ours"]


def test_a_missing_py_spy_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(RuntimeError, match="py-spy is in the dev group"):
        asyncio.run(cpu_profile.record(["true"], {}, None))

"""The reward ranges NeMo Gym's own manifests declare (0.7.0's files, no runtime), and the
`reward_range` option's checks. The harness's use of a range: tests/test_harness.py; on a real
stack: tests/stack/containers/test_containers.py (terminal_bench_2_1's reward writer)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from verifiers_nemogym.nemo import rewards
from verifiers_nemogym.nemo.release import release_files
from verifiers_nemogym.nemo.rewards import RewardRange, declared_ranges
from verifiers_nemogym.taskset import NeMoGymTasksetConfig

pytestmark = pytest.mark.verifiers_dev  # the taskset's config is verifiers'


@pytest.fixture(scope="module")
def release_07() -> Path:
    return release_files("0.7.0").root


def _pairing(agent: str, agent_impl: str, server: str, server_impl: str) -> dict:
    """An agent and its resources server as NeMo Gym's merged config holds them."""
    return {
        server: {"resources_servers": {server_impl: {"entrypoint": "app.py"}}},
        agent: {
            "responses_api_agents": {
                agent_impl: {
                    "entrypoint": "app.py",
                    "resources_server": {"type": "resources_servers", "name": server},
                }
            }
        },
    }


def test_ranges_nemo_gyms_manifests_declare(release_07: Path) -> None:
    """terminal_bench_2_1 and swebench_pro with OpenCode: [0, 1], from the manifest naming both
    the resources server and the agent; swe_next ships no manifest: [0, 1] from its grader's
    code, only while the installed file gives the reward by that line."""
    merged = [
        _pairing("tb", "opencode_sandboxed_agent", "tb_rs", "terminal_bench_2_1"),
        _pairing("pro", "opencode_sandboxed_agent", "pro_rs", "swebench_pro"),
        _pairing("next", "opencode_sandboxed_agent", "next_rs", "swe_next"),
    ]
    ranges = declared_ranges(release_07, merged)
    assert ranges == {
        "tb": RewardRange(
            0.0, 1.0, "NeMo Gym's benchmarks/terminal_bench_2_1/opencode/manifest.yaml"
        ),
        "pro": RewardRange(0.0, 1.0, "NeMo Gym's benchmarks/swebench/pro/opencode/manifest.yaml"),
        # No manifest: its grader's own line, `1.0 if result.resolved else 0.0`.
        "next": RewardRange(
            0.0,
            1.0,
            "NeMo Gym's resources_servers/swe_next/app.py "
            '(pass/fail: "reward": 1.0 if result.resolved else 0.0)',
        ),
    }
    # An agent no manifest pairs with the server: every manifest of the server, combined.
    (other,) = declared_ranges(
        release_07, [_pairing("tb2", "some_agent", "tb_rs", "terminal_bench_2_1")]
    ).values()
    assert (other.low, other.high) == (0.0, 1.0)
    assert "terminal_bench_2_1/opencode/" in other.source
    assert "terminal_bench_2_1/terminus_2/" in other.source


def test_only_the_manifests_naming_the_stacks_servers_are_parsed(
    release_07: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0.7.0 ships 174 manifests; an env start on example_single_tool_call parses the one that
    names its resources server, not all of them (their parse was a fixed cost of every start,
    0.5-0.9 s on 2 cores), and still finds its range."""
    parsed: list[str] = []
    load = yaml.safe_load

    def counting(text: str) -> object:
        parsed.append(text)
        return load(text)

    monkeypatch.setattr(rewards.yaml, "safe_load", counting)
    merged = [
        _pairing("agent", "simple_agent", "example_single_tool_call", "example_single_tool_call")
    ]
    assert declared_ranges(release_07, merged) == {
        "agent": RewardRange(
            0.0, 1.0, "NeMo Gym's environments/example_single_tool_call/manifest.yaml"
        )
    }
    assert len(list(release_07.glob("*/**/manifest.yaml"))) > 100
    assert len(parsed) == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[1, 0]", "finite numbers with low <= high"),
        ("[0, Infinity]", "finite numbers with low <= high"),
        ("[0]", "takes two numbers"),
        ("0..1", "takes \\[low, high\\]"),
    ],
)
def test_reward_range_option_checks(value: str, message: str) -> None:
    assert NeMoGymTasksetConfig(reward_range=[0, 1]).reward_range == (0.0, 1.0)  # type: ignore[arg-type]
    assert NeMoGymTasksetConfig(reward_range="[-1, 2.5]").reward_range == (-1.0, 2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        NeMoGymTasksetConfig(reward_range=value)  # type: ignore[arg-type]


def test_a_grader_range_needs_its_line_in_the_installed_code(tmp_path: Path) -> None:
    app = tmp_path / "resources_servers" / "swe_next" / "app.py"
    app.parent.mkdir(parents=True)
    app.write_text('reward = 2.0 * score  # "reward" changed\n')
    merged = [_pairing("next", "opencode_sandboxed_agent", "next_rs", "swe_next")]
    assert declared_ranges(tmp_path, merged) == {}

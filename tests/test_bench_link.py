"""The link benchmark's command line and arithmetic (fast tier, nothing started): its defaults,
the one-line errors, the rotation of placements, and ratios taken within a repeat."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import link

ROOT = Path(__file__).resolve().parent.parent


def test_defaults() -> None:
    args = link.parse_args([])
    assert (args.rollouts, args.in_flight, args.repeats, args.delay_ms) == (500, [64, 256], 3, 1.0)
    assert args.placement == ["local", "tls_local", "link", "link_delay"]
    args = link.parse_args(["--in-flight", "8", "--placement", "link", "--placement", "local"])
    assert (args.in_flight, args.placement) == ([8], ["link", "local"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repeats", "0"], "--repeats must be at least 1"),
        (["--in-flight", "0"], "--in-flight must be at least 1"),
        (["--rollouts", "100"], "--rollouts 100 is fewer than --in-flight 256"),
        (["--placement", "link"], "need `local`"),
        (["--delay-ms", "0"], "--delay-ms must be positive"),
        (["--placement", "wan"], "invalid choice"),
    ],
)
def test_bad_arguments_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        link.parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]


def test_each_placement_leads_in_turn() -> None:
    placements = ["local", "tls_local", "link"]
    orders = [link.order(placements, r) for r in range(4)]
    assert [o[0] for o in orders] == ["local", "tls_local", "link", "local"]
    assert all(sorted(o) == sorted(placements) for o in orders)


def test_batch_figures() -> None:
    latencies = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    figures = link.batch_figures(2.0, latencies, 0.5, 100)
    assert figures["rollouts_per_s"] == 50.0
    assert (figures["p50_ms"], figures["p90_ms"], figures["p99_ms"]) == pytest.approx((51, 90, 99))
    assert figures["cpu_ms_per_rollout"] == 5.0


def _batch(repeat: int, placement: str, rate: float, p50: float, errors: int = 0) -> dict[str, Any]:
    return {"repeat": repeat, "in_flight": 64, "placement": placement, "rollouts_per_s": rate,
            "p50_ms": p50, "p90_ms": p50, "p99_ms": p50, "cpu_ms_per_rollout": 1.0,
            "errors": errors}  # fmt: skip


def test_ratios_are_taken_within_a_repeat() -> None:
    """A slow repeat of `local` pairs with the same repeat of `link`: the ratio of medians (30 /
    20 = 1.5) would hide that `link` is 0.9x `local` in every repeat."""
    batches = [
        _batch(0, "local", 10, 100), _batch(0, "link", 9, 200),
        _batch(1, "local", 20, 100), _batch(1, "link", 18, 300, errors=2),
        _batch(2, "local", 40, 100), _batch(2, "link", 36, 400),
        _batch(0, "local", 99, 1) | {"in_flight": 256},  # another level: not mixed in
    ]  # fmt: skip
    level = link.summarize(batches, ["local", "link"], [64])["64"]
    assert level["local"]["rollouts_per_s"]["median"] == 20
    assert level["link"]["rollouts_per_s"]["values"] == [9, 18, 36]
    assert level["link"]["rate_vs_local"]["values"] == pytest.approx([0.9, 0.9, 0.9])
    assert level["link"]["p50_vs_local"]["median"] == pytest.approx(3.0)
    assert (level["local"]["errors"], level["link"]["errors"]) == (0, 2)
    assert "rate_vs_local" not in level["local"]


def test_performance_doc_quotes_the_result_file() -> None:
    """docs/performance.md's link table is the committed result's `table`, row for row (a rerun
    that changes a figure fails here until the page quotes it)."""
    result = json.loads((ROOT / "benchmarks/results/2026-11-26-link.json").read_text())
    assert result["repeats"] >= 3  # errors are in the table, quoted with the rest
    doc = (ROOT / "docs/performance.md").read_text().splitlines()
    missing = [row for row in link.table(result["figures"]) if row not in doc]
    assert missing == []

"""The soak's sampling (fast tier, nothing started): samples are taken drained, growth is a
least-squares slope after the first fifth, and `--trace-malloc` names the sites that grew."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest

from benchmarks import soak

ROOT = Path(__file__).resolve().parent.parent


def test_samples_are_taken_with_nothing_in_flight() -> None:
    in_flight = 0
    most = 0

    async def one(i: int) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(random.random() / 1000)
        in_flight -= 1
        if i % 7 == 3:
            raise ValueError(f"rollout {i} failed")

    samples, errors, first = asyncio.run(
        soak.drive(45, 8, 10, one, lambda: {"in_flight": in_flight})
    )
    assert [s["done"] for s in samples] == [10, 20, 30, 40, 45]
    assert [s["in_flight"] for s in samples] == [0] * 5
    assert most == 8
    assert (errors, first) == (6, "ValueError: rollout 3 failed")
    assert all(s["driver_py_blocks"] > 0 and s["rps"] > 0 for s in samples)
    assert all(0 < s["driver_rss_trimmed_mb"] < 4096 for s in samples)


def test_growth_is_the_slope_after_the_first_fifth() -> None:
    # The first fifth (two samples) climbs steeply, as warm-up does; the rest rises 3 per 10,000.
    samples = [{"done": d, "m": 500.0 if d <= 2000 else 100 + 3 * d / 10_000}
               for d in range(1000, 11_000, 1000)]  # fmt: skip
    assert soak.growth_per_10k(samples, "m") == pytest.approx((3.0, 0.0))
    assert soak.growth_per_10k(samples[:2], "m") is None
    # Noise around a flat line: a slope within a few standard errors of 0.
    noisy = [{"done": d, "m": 100.0 + (1 if d % 2000 else -1)} for d in range(1000, 21_000, 1000)]
    slope, se = soak.growth_per_10k(noisy, "m")
    assert abs(slope) < 3 * se and 0 < se < 1


def test_trace_malloc_names_the_site_that_grew() -> None:
    trace = soak.MallocTrace()
    kept: list[Any] = []
    trace.mark()
    kept.extend(bytearray(1000) for _ in range(2000))  # ~2 MB retained between the marks
    trace.mark()
    import tracemalloc

    tracemalloc.stop()
    growth = trace.top()
    top = growth["sites"][0]
    assert top["site"].startswith("tests/test_bench_soak.py:")
    assert top["kib"] > 1900 and top["blocks"] >= 2000
    assert growth["total_kib"] > 1900
    assert len(kept) == 2000


def test_pydantic_json_string_cache_is_bounded() -> None:
    """docs/performance.md "Long runs": verifiers' and our JSON parsing (`pydantic_core.
    from_json`) keeps short strings in a process-wide cache. It grows with the first ~30,000
    unique strings (ids: a few per rollout) and then stays at ~1.3 MiB: warm-up, not a leak."""
    import tracemalloc
    import uuid

    import pydantic_core

    salt = uuid.uuid4().hex[:8]  # strings no earlier test left in the cache
    count = iter(range(10**9))

    def parse(n: int) -> None:
        for i in itertools.islice(count, n):
            pydantic_core.from_json(f'{{"id": "resp_{salt}{i}", "call": "c{salt}{i}"}}'.encode())

    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        parse(25_000)
        filled = tracemalloc.get_traced_memory()[0] - base
        parse(25_000)
        later = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert 0.5 * 2**20 < filled < 2 * 2**20
    assert abs(later - filled) < 64 * 2**10


def test_performance_doc_quotes_the_result_files() -> None:
    """docs/performance.md's soak table is `table()` of the committed results, row for row (a
    rerun that changes a figure fails here until the page quotes it)."""
    results = ROOT / "benchmarks/results"
    together = json.loads((results / "2026-11-27-soak-100k.json").read_text())
    shared = json.loads((results / "2026-11-27-soak-100k-shared.json").read_text())
    sides = {"ours": together["ours"], "native": together["native"], "shared": shared["shared"]}
    assert all(s["errors"] == 0 and s["samples"][-1]["done"] == 100_000 for s in sides.values())
    trimmed = json.loads((results / "2026-11-27-soak-100k-trimmed.json").read_text())["ours"]
    assert trimmed["errors"] == 0 and trimmed["samples"][-1]["done"] == 100_000
    doc = (ROOT / "docs/performance.md").read_text().splitlines()
    missing = [row for row in soak.table(sides) + soak.table({"ours": trimmed}) if row not in doc]
    assert missing == []

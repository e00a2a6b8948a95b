"""Release numbers are ordered as PEP 440 orders them (packaging's `Version`), never by hand: a
pre-release comes before its release and after the release before it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo import release


def test_a_pre_release_takes_the_floor_of_the_release_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = {"0.7.0": release.Features((3, 13, 14)), "0.8.0": release.Features((3, 14))}
    monkeypatch.setattr(release, "RELEASES", table)
    assert release.python_floor("0.8.0rc1") == (3, 13, 14)  # before 0.8.0
    assert release.python_floor("0.8.1rc1") == (3, 14)  # after 0.8.0 (was read as 0.8)
    assert release.python_floor("0.8.0.post1") == (3, 14)
    assert release.python_floor("0.10.0") == (3, 14)
    assert release.python_floor("0.3.0") == release.MIN_PYTHON  # older than every row


def test_an_unknown_release_has_what_the_release_before_it_has() -> None:
    """A release the table does not know takes the row of the newest known one not newer than
    it (PEP 440 order), one older than every row nothing new; no caller compares versions."""
    assert release.features("0.7.1rc1") == release.RELEASES["0.7.0"]
    assert release.features("0.7.0rc1") == release.RELEASES["0.6.0"]
    assert release.features("0.3.0") == release.Features(release.MIN_PYTHON)
    assert not release.features("0.3.0").gym_cli


@pytest.mark.parametrize(
    ("older", "newer"),
    [("0.8.0rc1", "0.8.0"), ("0.7.0", "0.8.0rc1"), ("0.8.0", "0.8.0.post1"), ("0.9.0", "0.10.0"),
     ("0.8.0.dev3", "0.8.0a1"), ("3.13.0rc2", "3.13.0"), ("3.12.9", "3.13.0+")],
)  # fmt: skip
def test_versions_are_ordered_as_pep_440_orders_them(older: str, newer: str) -> None:
    assert release.parse_version(older) < release.parse_version(newer)


def test_a_version_that_does_not_parse_is_named() -> None:
    with pytest.raises(ConfigError, match="'latest' is not a version number"):
        release.parse_version("latest")


def test_a_new_release_is_one_row_and_every_table_answers_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NeMo Gym's next release, added as one `RELEASES` row: the features table, the
    conformance tables (verified, judge replay, judge survey, rescored), the container and
    harness surveys and `nemo-gym-env list`'s answers all serve it from the newest older row
    that has one, and name that row; nothing falls back to 0.4.0 because it is the oldest."""
    from verifiers_nemogym.conformance import tables

    monkeypatch.setitem(release.RELEASES, "0.8.0", replace(release.RELEASES["0.7.0"]))
    assert release.features("0.8.0") == release.RELEASES["0.7.0"]
    assert tables.default_envs("0.8.0") == tables.VERIFIED_OFFLINE["0.7.0"]
    assert tables.default_envs("0.8.0") != tables.VERIFIED_OFFLINE["0.4.0"]
    assert tables.judge_envs("0.8.0") == tables.JUDGE_REPLAY["0.4.0"]  # the only row: newest
    assert tables.rescored_on("0.8.0") == tables.RESCORED["0.7.0"]
    container = next(iter(tables.CONTAINERS["0.7.0"].items()))
    ran = next(n for n, c in tables.CONTAINERS["0.7.0"].items() if "ran" in c)
    assert tables.offline_status(ran, None, {}, "0.8.0") == tables.offline_status(
        ran, None, {}, "0.7.0"
    )
    assert "NeMo Gym 0.7.0" in tables.offline_status(ran, None, {}, "0.8.0")[1]
    assert tables.offline_status(container[0], None, {}, "0.8.0")[0] == ("ran" in container[1])
    harness = next(n for n, h in tables.HARNESSES["0.7.0"].items() if "ran" in h)
    assert tables.offline_status(harness, None, {}, "0.8.0")[0]
    verified = tables.VERIFIED_OFFLINE["0.7.0"][0]
    assert tables.offline_status(verified, None, {}, "0.8.0") == (
        True,
        "verified by conformance runs (NeMo Gym 0.7.0)",
    )
    surveyed = next(n for n, s in tables.JUDGE_SURVEY["0.7.0"].items() if s[1])
    assert tables.runs_here(surveyed, None, {}, "0.8.0") == tables.runs_here(
        surveyed, None, {}, "0.7.0"
    )
    # Older than every row of a table: that table has nothing for it.
    assert tables.offline_status(ran, None, {}, "0.6.0") != tables.offline_status(
        ran, None, {}, "0.7.0"
    )

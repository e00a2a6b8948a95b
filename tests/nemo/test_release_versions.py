"""Release numbers are ordered as PEP 440 orders them (packaging's `Version`), never by hand: a
pre-release comes before its release and after the release before it."""

from __future__ import annotations

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

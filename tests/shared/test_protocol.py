"""The lease protocol's messages (`shared/protocol.py`): what the host writes is what a user
reads."""

from __future__ import annotations

import json

import pytest

from verifiers_nemogym.errors import StackError
from verifiers_nemogym.judge.blame import JudgeFailure
from verifiers_nemogym.shared import protocol


def test_a_judge_failure_crosses_the_socket_as_the_same_value() -> None:
    failure = JudgeFailure.now("the judge m at u (chat) failed: 503", "Question:  2+2?\n")
    wire = json.loads(json.dumps(protocol.judge_failed_event(failure)))
    assert wire["event"] == protocol.EVENT_JUDGE_FAILED
    assert protocol.judge_failure_of(wire) == failure and failure.prompt == "Question: 2+2?"


def test_a_malformed_judge_event_is_an_error_not_a_failure() -> None:
    with pytest.raises(KeyError):
        protocol.judge_failure_of({"event": protocol.EVENT_JUDGE_FAILED, "message": "m"})


@pytest.mark.parametrize("value", [-1, float("inf"), float("nan"), True, "soon"])
def test_an_idle_timeout_must_be_finite_seconds(value: object) -> None:
    with pytest.raises(StackError, match="idle timeout"):
        protocol.check_idle_timeout(value)
    assert protocol.check_idle_timeout(None) is None and protocol.check_idle_timeout("2") == 2.0

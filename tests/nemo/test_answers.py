"""One reader for what a NeMo Gym server answered (harness `/run`, `/aggregate_metrics`, the
head server's config): JSON on 200, else one line in the caller's error type naming where."""

from __future__ import annotations

import pytest

from verifiers_nemogym.errors import AgentRunError, StackError
from verifiers_nemogym.nemo.answers import read_json_answer


def test_a_200_json_answer_is_its_value() -> None:
    assert read_json_answer("agent /run", 200, '{"reward": 1.0}', AgentRunError) == {"reward": 1.0}


def test_another_status_is_the_callers_error_with_the_texts_end() -> None:
    text = "x" * 5000 + "Traceback: boom"
    with pytest.raises(StackError) as caught:
        read_json_answer("agent 'a' /aggregate_metrics", 500, text, StackError)
    message = str(caught.value)
    assert message.startswith("agent 'a' /aggregate_metrics answered 500: ")
    assert message.endswith("Traceback: boom") and len(message) < 2200


def test_non_json_is_the_callers_error_naming_where() -> None:
    with pytest.raises(AgentRunError, match=r"^agent /run answered non-JSON: <html>"):
        read_json_answer("agent /run", 200, "<html>oops</html>", AgentRunError)

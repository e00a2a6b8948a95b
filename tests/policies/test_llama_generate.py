"""The generate adapter's translation, on the shape llama.cpp's `/completion` really answers
(recorded from the packaged model: two tokens, the last its end-of-generation token). The
adapter running against the real llama.cpp is shown by `tests/stack/test_train_mode.py`'s eval-local
test."""

from __future__ import annotations

import pytest

from verifiers_nemogym.policies.llama_generate import (
    DEFAULT_MAX_TOKENS,
    completion_request,
    generate_choice,
)

ANSWER = {
    "index": 0,
    "content": "hi",
    "tokens": [108386, 151645],
    "stop": True,
    "stop_type": "eos",
    "completion_probabilities": [
        {"id": 108386, "token": "hi", "logprob": -6.1372456550598145, "top_logprobs": []},
        {"id": 151645, "token": "", "logprob": -0.28644734621047974, "top_logprobs": []},
    ],
}


def test_request_switches_off_truncating_samplers() -> None:
    body = completion_request([1, 2, 3], {"stop_token_ids": [151645]}, 100)
    assert body["prompt"] == [1, 2, 3]
    assert (body["temperature"], body["top_k"], body["top_p"], body["min_p"]) == (1.0, 0, 1.0, 0)
    assert body["n_probs"] == 1 and body["return_tokens"] is True and body["stream"] is False
    assert body["n_predict"] == 97  # never past the context
    asked = completion_request(
        [1], {"temperature": 0.7, "top_k": 5, "max_tokens": 9, "seed": 3}, 8192
    )
    assert (asked["temperature"], asked["top_k"], asked["n_predict"], asked["seed"]) == (
        0.7,
        5,
        9,
        3,
    )
    assert completion_request([1], {}, 8192)["n_predict"] == DEFAULT_MAX_TOKENS


def test_choice_has_ids_and_logprobs_of_the_same_length() -> None:
    choice = generate_choice(ANSWER)
    assert choice["token_ids"] == [108386, 151645]  # end-of-generation token included
    assert [c["token"] for c in choice["logprobs"]["content"]] == [
        "token_id:108386",
        "token_id:151645",
    ]
    assert choice["logprobs"]["content"][1]["logprob"] == pytest.approx(-0.2864473)
    assert choice["finish_reason"] == "stop"
    assert generate_choice([{**ANSWER, "stop_type": "limit"}])["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({**ANSWER, "completion_probabilities": None}, "no completion_probabilities"),
        ({**ANSWER, "tokens": [1, 2]}, "disagree"),
        (
            {
                **ANSWER,
                "completion_probabilities": [
                    {"id": 108386, "logprob": None},
                    {"id": 151645, "logprob": -1.0},
                ],
            },
            "not finite",
        ),
        ("oops", "not a completion object"),
    ],
)
def test_unusable_answers_are_errors(payload: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate_choice(payload)

"""A `Judge` carries its key: never shown by its repr, `public()`, `identity()` or `to_dict()`,
handed on only as `secrets()` (a shared stack's host reads them from its stdin), and removed from
a child's environment by `scrubbed`."""

from __future__ import annotations

import json
import pickle

from verifiers_nemogym.judge.endpoint import Judge
from verifiers_nemogym.shared.protocol import HostSpec, host_secrets

KEY = "judge-key-" + "s" * 24
HEADER = "header-secret-" + "h" * 20


def _judge() -> Judge:
    return Judge(
        base_url="http://127.0.0.1:1/v1", model="m", key_var="JUDGE_KEY",
        headers={"X-Api-Key": HEADER}, key=KEY,
    )  # fmt: skip


def test_the_key_and_headers_stay_out_of_every_form_but_secrets() -> None:
    judge = _judge()
    shown = [repr(judge), str(judge), json.dumps(judge.public()), json.dumps(judge.to_dict())]
    shown.append(json.dumps(judge.identity()))
    for text in shown:
        assert KEY not in text and HEADER not in text, text
    assert judge.secrets() == {"key": KEY, "headers": {"X-Api-Key": HEADER}}
    assert sorted(judge.secret_values()) == sorted([KEY, HEADER])


def test_a_host_gets_the_same_judge_back_from_its_spec_and_stdin() -> None:
    judge = _judge()
    spec = HostSpec("0.7.0", "python", [], None, 60.0, judge=judge.to_dict())
    assert KEY not in spec.to_json() and HEADER not in spec.to_json()
    stdin = json.loads(json.dumps(host_secrets(judge)))
    again = HostSpec.from_json(spec.to_json()).judge_with(stdin)
    assert again == judge and again is not None and again.key == KEY
    assert again.headers == judge.headers
    assert pickle.loads(pickle.dumps(judge)).key == KEY  # a value, not a handle


def test_scrubbed_removes_only_the_key_variable() -> None:
    env = {"JUDGE_KEY": KEY, "PATH": "/bin", "OTHER": "x"}
    assert _judge().scrubbed(env) == {"PATH": "/bin", "OTHER": "x"}
    assert Judge(base_url="u", model="m").scrubbed(env) == env

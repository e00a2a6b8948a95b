"""ReplayPolicy: which recorded turn answers a request, over HTTP, on NeMo Gym's own recordings
(the real `example_rollouts.jsonl` files of the runtime) and on the rewrites a request suffers
between the agent and the policy (verifiers' interception, our proxy)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from helpers.evals import recordings_of

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.policies.replay import (
    REPLAY_KEY,
    Recording,
    ReplayIndex,
    ReplayPolicy,
    _response,
    is_model_item,
    load_recordings,
)

ENVS = ("example_single_tool_call", "example_multi_step", "example_multi_turn_gymnasium", "mcqa")


@pytest.fixture(scope="module")
def recordings(catalog: Catalog) -> list[Recording]:
    return recordings_of(catalog, ENVS)


def requests_of(rec: Recording) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """What the agent sends before each model turn of `rec`, and what the model answered,
    rebuilt from the recorded output (initial input + every item before the turn)."""
    params = rec.row["responses_create_params"]
    initial = params["input"]
    initial = [{"role": "user", "content": initial}] if isinstance(initial, str) else initial
    output = rec.row["response"]["output"]
    out: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    i = 0
    while i < len(output):
        if not is_model_item(output[i]):
            i += 1
            continue
        j = i
        while j < len(output) and is_model_item(output[j]):
            j += 1
        body = {"input": copy.deepcopy(initial + output[:i]), "tools": params.get("tools") or []}
        out.append((body, output[i:j]))
        i = j
    return out


def test_every_turn_of_every_recording_replays_as_recorded(recordings: list[Recording]) -> None:
    index = ReplayIndex(recordings)
    turns = 0
    for rec in recordings:
        for body, expected in requests_of(rec):
            body["metadata"] = {REPLAY_KEY: rec.id}
            match = index.match(body)
            assert match.recording.id == rec.id and match.exact
            assert match.turn.items == expected
            turns += 1
    # multi-step and multi-turn recordings have several model turns per rollout
    assert turns > len(recordings)
    multi = [r for r in recordings if len(r.turns) > 2]
    assert {r.id.split(":")[0] for r in multi} >= {
        "example_multi_step",
        "example_multi_turn_gymnasium",
    }


def test_matching_survives_the_rewrites_between_agent_and_policy(recordings):
    index = ReplayIndex(recordings)
    rec = next(r for r in recordings if r.id.startswith("example_multi_step") and len(r.turns) > 2)
    body, expected = requests_of(rec)[-1]
    # What the interception does (model rewritten, sampling dropped), what agents do (items
    # without `type`, ids dropped, reasoning not echoed), and key order in arguments.
    rewritten: dict[str, Any] = {"model": "replay", "input": [], "tools": body["tools"]}
    for item in body["input"]:
        item = {k: v for k, v in item.items() if k not in ("id", "status")}
        if item.get("type") == "message":
            del item["type"]
        if item.get("type") == "function_call":
            args = json.loads(item["arguments"])
            item["arguments"] = json.dumps(dict(reversed(list(args.items()))), indent=1)
        rewritten["input"].append(item)
    match = index.match(rewritten)
    assert match.recording.id == rec.id and match.turn.items == expected


def test_same_prompt_recorded_twice_is_told_apart_by_the_metadata_hint(catalog: Catalog):
    # aalcr's five recordings cover two prompts, several rollouts each, with different answers.
    recs = load_recordings(catalog.env("aalcr").example_rollouts, "aalcr")
    index = ReplayIndex(recs)
    by_prompt: dict[str, list[Recording]] = {}
    for rec in recs:
        by_prompt.setdefault(json.dumps(rec.row["responses_create_params"]["input"]), []).append(
            rec
        )
    same = max(by_prompt.values(), key=len)
    assert len(same) > 1 and len({json.dumps(r.turns[0].items) for r in same}) > 1
    body = {"input": same[0].row["responses_create_params"]["input"]}
    assert index.match(body).recording.id == same[0].id  # no hint: first in load order
    for rec in same:
        hinted = {**body, "metadata": {REPLAY_KEY: rec.id}}
        assert index.match(hinted).turn.items == rec.turns[0].items


def test_drifted_tool_output_replays_leniently(recordings):
    index = ReplayIndex(recordings)
    rec = next(r for r in recordings if r.id.startswith("example_multi_step") and len(r.turns) > 2)
    body, expected = requests_of(rec)[1]
    for item in body["input"]:
        if item.get("type") == "function_call_output":
            item["output"] = item["output"] + " (drifted)"
    match = index.match(body)
    assert match.recording.id == rec.id and not match.exact
    assert match.turn.items == expected


async def test_unmatched_request_is_a_clear_404(recordings):
    async with ReplayPolicy(index=ReplayIndex(recordings)) as policy:
        rec = next(r for r in recordings if r.id.startswith("example_multi_step"))
        body, _ = requests_of(rec)[1]
        # The model's own earlier call is not what was recorded: no recording continues this.
        call = next(i for i in body["input"] if i.get("type") == "function_call")
        call["arguments"] = json.dumps({"synonym": "never said"})
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{policy.base_url}/responses", json=body) as response:
                assert response.status == 404
                error = (await response.json())["error"]
            assert error["code"] == "no_matching_recording"
            assert "no recorded rollout continues this conversation" in error["message"]
            assert rec.id in error["message"] and "never said" in error["message"]
            unknown = {"input": "hello", "metadata": {REPLAY_KEY: "nowhere:1"}}
            async with http.post(f"{policy.base_url}/responses", json=unknown) as response:
                assert response.status == 404
                assert "nowhere:1" in (await response.json())["error"]["message"]
            good, expected = requests_of(rec)[0]
            async with http.post(f"{policy.base_url}/responses", json=good) as response:
                assert response.status == 200
                assert response.headers["X-Replay-Recording"] == rec.id
                reply = await response.json()
        assert reply["object"] == "response" and reply["output"] == expected
        assert len(policy.misses) == 2


def test_a_finished_conversation_matches_no_turn(recordings):
    index = ReplayIndex(recordings)
    rec = next(r for r in recordings if r.id.startswith("example_single_tool_call"))
    params = rec.row["responses_create_params"]
    body = {"input": params["input"] + rec.row["response"]["output"]}
    with pytest.raises(LookupError, match="did not speak next"):
        index.match(body)


def test_unusable_recordings_fail_naming_file_and_line(tmp_path: Path, catalog: Catalog):
    # Some environments ship placeholder lines instead of rollouts.
    with pytest.raises(ConfigError, match=r"example_rollouts\.jsonl:1: not a JSON rollout"):
        load_recordings(catalog.env("tavily_search").example_rollouts)
    bad = tmp_path / "rollouts.jsonl"
    bad.write_text(json.dumps({"responses_create_params": {"input": "hi"}}) + "\n")
    with pytest.raises(ConfigError, match="rollouts:1: no responses_create_params/response"):
        load_recordings(bad)
    with pytest.raises(ConfigError, match="unique"):
        ReplayIndex(load_recordings(catalog.env("mcqa").example_rollouts) * 2)


def test_a_turn_is_never_answered_twice_and_cut_short_turns_stay_incomplete(catalog: Catalog):
    # equivalence_rule:3's model produced reasoning only; echoing it back must not replay it again
    # (simple_agent would call forever).
    recs = load_recordings(catalog.env("equivalence_rule").example_rollouts, "equivalence_rule")
    ruler = load_recordings(catalog.env("ruler").example_rollouts, "ruler")
    index = ReplayIndex(recs + ruler)
    rec = next(r for r in recs if [i["type"] for i in r.turns[-1].items] == ["reasoning"])
    first = {"input": list(rec.row["responses_create_params"]["input"])}
    answer = index.match(first).turn.items
    with pytest.raises(LookupError, match="did not speak next"):
        index.match({"input": first["input"] + answer})
    # ruler's recordings were cut at max_output_tokens: the replay says so, so the agent stops.
    cut = ruler[0]
    assert cut.incomplete == {"reason": "max_output_tokens"}
    body = {"input": cut.row["responses_create_params"]["input"]}
    reply = _response(body, index.match(body), 0)
    assert reply["status"] == "incomplete" and reply["incomplete_details"] == cut.incomplete

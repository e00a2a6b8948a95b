"""Which of NeMo Gym's servers grade with a judge, the config that gives them the user's, and
the refusals before anything starts (real release files; no stack)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from verifiers_nemogym.judge.endpoint import Judge
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.judges import (
    JUDGE_INSTANCE,
    JudgeRef,
    active,
    judge_refs,
    write_judge_config,
)
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.shared.client import stack_key


def _refs(catalog: Catalog, name: str) -> list[JudgeRef]:
    (path,) = catalog.env(name).config_paths
    return judge_refs(catalog.merged_config(path))


def test_judge_references_of_the_shipped_configs(catalog: Catalog) -> None:
    assert _refs(catalog, "equivalence_llm_judge") == [
        JudgeRef("equivalence_llm_judge", "equivalence_llm_judge", "policy_model")
    ]
    assert [r.target for r in _refs(catalog, "simpleqa")] == ["genrm_model"]
    assert [r.target for r in _refs(catalog, "frontierscience_judge")] == ["judge_model"]
    # Shipped switched off: no judge needed unless asked for.
    (math,) = _refs(catalog, "math_with_judge")
    assert math.optional and active([math], enable_optional=False) == []
    assert active([math], enable_optional=True) == [math]
    # verifif calls a judge URL itself.
    assert [r.target for r in _refs(catalog, "verifif")] == [""]
    assert _refs(catalog, "example_single_tool_call") == []


def test_judge_config_redirects_defines_and_replaces(catalog: Catalog, tmp_path: Path) -> None:
    names = [
        "equivalence_llm_judge", "simpleqa", "frontierscience_judge", "math_with_judge", "verifif"
    ]  # fmt: skip
    merged = [catalog.merged_config(p) for n in names for p in catalog.env(n).config_paths]
    refs = active([r for m in merged for r in judge_refs(m)], enable_optional=True)
    path = write_judge_config(
        tmp_path, refs, api="chat", base_url="http://127.0.0.1:1/v1", token="tok-123456789",
        model="judge-m", defined={str(k) for m in merged for k in m},
    )  # fmt: skip
    config = yaml.safe_load(path.read_text())
    equivalence = config["equivalence_llm_judge"]["resources_servers"]["equivalence_llm_judge"]
    assert equivalence["judge_model_server"]["name"] == JUDGE_INSTANCE  # was policy_model
    math = config["math_with_judge"]["resources_servers"]["math_with_judge"]
    assert math["should_use_judge"] is True and math["judge_model_server"]["name"] == JUDGE_INSTANCE
    assert "simpleqa" not in config  # its reference stays; genrm_model becomes the judge
    for target in (JUDGE_INSTANCE, "genrm_model", "judge_model"):
        block = config[target]["responses_api_models"]
        assert block["inference_provider"]["base_url"] == "http://127.0.0.1:1/v1"
        assert block["inference_provider"]["api_key"] == "tok-123456789"
    # frontierscience_judge's own judge_model block (openai_model reading ${judge_*}) goes.
    assert "openai_model" in config["judge_model"]["responses_api_models"]["_delete_key"]
    assert "_delete_key" not in config["genrm_model"]["responses_api_models"]
    assert config["judge_base_url"] == "http://127.0.0.1:1/v1"
    # verifif calls its judge URL itself: it gets the relay's address, token and the model.
    verifif = config["verifif"]["resources_servers"]["verifif"]
    assert (verifif["judge_base_url"], verifif["judge_api_key"], verifif["judge_model"]) == (
        "http://127.0.0.1:1/v1", "tok-123456789", "judge-m"
    )  # fmt: skip


def test_a_judge_with_a_stack_url_is_a_config_error() -> None:
    from verifiers_nemogym.taskset import NeMoGymTasksetConfig

    with pytest.raises(ValidationError, match="grades with the judge its own config names"):
        NeMoGymTasksetConfig(
            stack_url="http://127.0.0.1:1", judge={"base_url": "http://x/v1", "model": "m"}
        )


def test_the_judge_and_its_key_are_part_of_a_shared_stacks_identity(
    nemo_venv: NeMoGymVenv, catalog: Catalog
) -> None:
    paths = catalog.env("simpleqa").config_paths
    judge = Judge(base_url="http://127.0.0.1:1/v1", model="m", key_var="K", key="key-a")
    keys = {
        stack_key(nemo_venv, paths),
        stack_key(nemo_venv, paths, judge),
        stack_key(nemo_venv, paths, replace(judge, key="key-b")),
        stack_key(nemo_venv, paths, replace(judge, base_url="http://127.0.0.1:2/v1")),
        stack_key(nemo_venv, paths, replace(judge, model="n")),
    }
    assert len(keys) == 5
    assert stack_key(nemo_venv, paths, judge) == stack_key(nemo_venv, paths, replace(judge))


def test_list_says_which_environments_need_a_judge(nemo_venv: NeMoGymVenv) -> None:
    from verifiers_nemogym.cli.list import list_table

    rows = {line.split("|")[1].strip(): line.split("|")[4].strip()
            for line in list_table(nemo_venv).splitlines() if line.startswith("| ")}  # fmt: skip
    assert rows["simpleqa"] == rows["equivalence_llm_judge"] == "needs --env.taskset.judge"
    assert rows["xstest"] == "needs --env.taskset.judge: a WildGuard-style safety classifier"
    assert rows["math_with_judge"].startswith("optional")
    assert rows["example_single_tool_call"] == "-"

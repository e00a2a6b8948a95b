"""The judge options of the CLI: `eval-local --judge local` hands vf-eval a judge verifiers'
own config parser reads, and `stack up/down --judge.*` name the same judge as the env's
`--env.taskset.judge.*` (the key from its variable, never on a command line)."""

from __future__ import annotations

import argparse

import pytest
from pydantic_config import cli
from verifiers.v1.cli.resolve import narrow_config
from verifiers.v1.configs.cli.eval import EvalConfig

from verifiers_nemogym.cli import _parser
from verifiers_nemogym.cli.arguments import judge_of
from verifiers_nemogym.cli.eval_local import LocalEvalOptions, vf_eval_command


def test_eval_local_judge_local_names_the_local_server_as_judge() -> None:
    options = LocalEvalOptions(nemo_env="simpleqa", judge="local")
    url = "http://127.0.0.1:9/v1"
    # vf-eval's positional env id, as the flag the config parser reads it from.
    argv = [
        "--env.taskset.id",
        "nemo-gym-env",
        *vf_eval_command(options, "qwen", url, judge_url=url)[2:],
    ]
    config = cli(narrow_config(EvalConfig, argv), args=argv)
    judge = config.env.taskset.judge
    assert (judge.base_url, judge.model, judge.api) == (url, "qwen", "chat")
    without = ["--env.taskset.id", "nemo-gym-env"]
    without += vf_eval_command(LocalEvalOptions(nemo_env="simpleqa"), "qwen", url)[2:]
    assert cli(narrow_config(EvalConfig, without), args=without).env.taskset.judge is None


def test_stack_up_and_down_take_the_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VF_NEMOGYM_TEST_JUDGE_KEY", "a-judge-key-123456")
    flags = [
        "--judge.base-url", "http://127.0.0.1:9/v1", "--judge.model", "m",
        "--judge.api-key-var", "VF_NEMOGYM_TEST_JUDGE_KEY", "--judge.api", "responses",
    ]  # fmt: skip
    for command in (["stack", "up", "simpleqa"], ["stack", "down", "simpleqa"]):
        judge = judge_of(_parser().parse_args([*command, *flags]))
        assert judge is not None and judge.key == "a-judge-key-123456"
        assert (judge.base_url, judge.model, judge.api) == (
            "http://127.0.0.1:9/v1",
            "m",
            "responses",
        )
    assert judge_of(_parser().parse_args(["stack", "up", "simpleqa"])) is None


def test_judge_flags_are_the_judge_configs_own_fields_with_their_docstrings() -> None:
    # One flag per field NeMoGymJudgeConfig declares itself, explained as docs/options.md does.
    from verifiers_nemogym.judge.config import NeMoGymJudgeConfig
    from verifiers_nemogym.options import options

    documented = {
        "--judge." + o.key.replace("_", "-"): o.doc
        for o in options(NeMoGymJudgeConfig)
        if o.owner == NeMoGymJudgeConfig.__module__
    }
    assert set(documented) == {
        "--judge.base-url", "--judge.model", "--judge.api-key-var", "--judge.api",
        "--judge.enable-optional",
    }  # fmt: skip

    def sub(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
        (found,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return found.choices[name]

    stack = sub(_parser(), "stack")
    for parser in (sub(stack, "up"), sub(stack, "down"), sub(_parser(), "metrics")):
        flags = {o: a.help for a in parser._actions for o in a.option_strings if "judge." in o}
        assert flags == documented, parser.prog


def test_metrics_hands_on_only_the_judge_fields_given() -> None:
    from verifiers_nemogym.cli.arguments import judge_fields

    assert judge_fields(_parser().parse_args(["metrics", "out"])) is None
    given = _parser().parse_args(
        ["metrics", "out", "--judge.model", "m", "--judge.enable-optional"]
    )
    assert judge_fields(given) == {"model": "m", "enable_optional": True}

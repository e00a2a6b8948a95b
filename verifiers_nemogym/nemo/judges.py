"""Which NeMo Gym servers grade with an LLM judge, and the config that gives them the user's.

`judge_refs` finds a config's judge references; `write_judge_config` writes the YAML that, listed
after the environment's configs (later files win), points every active reference at one judge
block served by the relay (`judge/relay.py`). The file holds the relay's address and per-stack
token, never the judge's key. What the file changes: docs/judges.md, "How it works".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from verifiers_nemogym.nemo.catalog import MODELS, POLICY_INSTANCE, RESOURCES_SERVERS, server_blocks

JUDGE_INSTANCE = "vf_judge_model"
"""The model-server instance the redirected `policy_model` judge references name."""
_REF_FIELD = "judge_model_server"
_OPTIONAL_FLAG = "should_use_judge"
_URL_FIELDS = ("judge_base_url", "judge_api_key", "judge_model")
_IMPLS = {"chat": "inference_provider", "responses": "openai_model"}


@dataclass(frozen=True)
class JudgeRef:
    """One resources server's judge: `server` (instance) of `impl` asks `target` (a model-server
    instance name; "" when it calls a URL itself), switched off by default if `optional`."""

    server: str
    impl: str
    target: str
    optional: bool = False


def judge_refs(config: dict[str, Any]) -> list[JudgeRef]:
    """The judge references of `config` (a file or a merged config): every resources server
    whose `judge_model_server` names a model server, and those that call a judge URL themselves
    (`judge_base_url`, verifif). One whose server ships `should_use_judge: false` is optional."""
    refs: list[JudgeRef] = []
    for name, (impl, settings) in server_blocks(config, RESOURCES_SERVERS).items():
        optional = settings.get(_OPTIONAL_FLAG) is False
        ref = settings.get(_REF_FIELD)
        if isinstance(ref, dict) and isinstance(ref.get("name"), str) and ref["name"]:
            refs.append(JudgeRef(name, impl, ref["name"], optional))
        elif any(f in settings for f in _URL_FIELDS):
            refs.append(JudgeRef(name, impl, "", optional))
    return refs


SPECIALISED = {
    "xstest": "a WildGuard-style safety classifier",
    "jailbreak_detection": "a Nemotron content-safety judge",
    "aegis_v4_safety": "a Nemotron content-safety judge",
}
"""Environments whose judge must be a particular kind of model: any judge makes them run, but
a general model mostly misses their verdict format, so they measure nothing."""


def judge_need(name: str, refs: list[JudgeRef]) -> str:
    """What `nemo-gym-env list` says of environment `name` (folder name) with `refs`."""
    if not refs:
        return "-"
    if all(r.optional for r in refs):
        return "optional (off unless --env.taskset.judge.enable-optional)"
    if name in SPECIALISED:
        return f"needs --env.taskset.judge: {SPECIALISED[name]}"
    return "needs --env.taskset.judge"


def active(refs: list[JudgeRef], enable_optional: bool) -> list[JudgeRef]:
    """The references a judge must serve (optional ones only with `enable_optional`)."""
    return [r for r in refs if enable_optional or not r.optional]


def write_judge_config(
    workdir: Path,
    refs: list[JudgeRef],
    *,
    api: str,
    base_url: str,
    token: str,
    model: str,
    defined: set[str],
) -> Path:
    """The judge YAML for `refs` (active ones) in `workdir`; `base_url` and `token` are the
    relay's, `api` chooses NeMo Gym's adapter (`chat`: inference_provider, which turns
    Responses calls into Chat Completions; `responses`: openai_model, which passes both
    through). `defined` names the top-level instances the merged configs already define."""
    impl = _IMPLS[api]
    if impl == "inference_provider":
        settings: dict[str, Any] = {
            "entrypoint": "app.py", "base_url": base_url, "api_key": token, "model": model,
            "uses_reasoning_parser": False,
        }  # fmt: skip
    else:
        settings = {
            "entrypoint": "app.py", "openai_base_url": base_url, "openai_api_key": token,
            "openai_model": model, "openai_default_headers": {},
        }  # fmt: skip
    config: dict[str, Any] = {
        "judge_base_url": base_url,
        "judge_api_key": token,
        "judge_model_name": model,
    }
    targets: set[str] = set()
    for ref in refs:
        overrides: dict[str, Any] = {}
        if ref.optional:
            overrides[_OPTIONAL_FLAG] = True
        if not ref.target:
            overrides.update(dict(zip(_URL_FIELDS, (base_url, token, model), strict=True)))
        elif ref.target == POLICY_INSTANCE:
            overrides[_REF_FIELD] = {"type": MODELS, "name": JUDGE_INSTANCE}
            targets.add(JUDGE_INSTANCE)
        else:
            targets.add(ref.target)
        if overrides:
            config[ref.server] = {RESOURCES_SERVERS: {ref.impl: overrides}}
    for target in sorted(targets):
        block: dict[str, Any] = {impl: dict(settings)}
        if target in defined:
            # Every implementation the configs may give it goes; ours (listed last) stays.
            block["_delete_key"] = ",".join(sorted((set(_IMPLS.values()) | _OTHER_IMPLS) - {impl}))
        config[target] = {MODELS: block}
    path = workdir / "vf_judge.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# Model-server implementations a judge block may have in NeMo Gym's shipped configs.
_OTHER_IMPLS = frozenset(
    {
        "vllm_model",
        "local_vllm_model",
        "azure_openai_model",
        "genrm_model",
        "local_vllm_model_proxy",
    }
)

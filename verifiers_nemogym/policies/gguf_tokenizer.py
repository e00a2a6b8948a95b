"""A Hugging Face tokenizer folder built from a GGUF file's metadata: no hub, no `gguf` package.

`tokenizer_dir()` reads the GGUF's key/value header (`tokenizer.ggml.*`,
`tokenizer.chat_template`; never the weights) and writes a `tokenizer.json` +
`tokenizer_config.json` folder once into the cache, for verifiers' train client to render with
offline. Only GPT-2 style byte-level BPE with the Qwen2 pre-tokenizer (the packaged Qwen2.5 model)
is supported; anything else raises `TokenizerBuildError`.
"""

from __future__ import annotations

import json
import os
import struct
import uuid
from pathlib import Path
from typing import Any, BinaryIO

from verifiers_nemogym.errors import NeMoGymError
from verifiers_nemogym.util import private_cache

# Qwen2's pre-tokenizer split (its tokenizer.json), as llama.cpp's "qwen2" pre-tokenizer.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_FORMAT = 1  # bump when the folder layout or the conversion changes

# GGUF value types (the format's spec): struct code per scalar type.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q"}
_SCALARS[12] = "d"
_STRING, _ARRAY = 8, 9
# llama.cpp token types.
_CONTROL, _USER_DEFINED = 3, 4


class TokenizerBuildError(NeMoGymError):
    """A GGUF file whose tokenizer cannot be rebuilt here."""


def _read(f: BinaryIO, code: str) -> Any:
    size = struct.calcsize("<" + code)
    data = f.read(size)
    if len(data) != size:
        raise EOFError
    return struct.unpack("<" + code, data)[0]


def _string(f: BinaryIO) -> str:
    length = _read(f, "Q")
    return f.read(length).decode("utf-8", errors="surrogateescape")


def _value(f: BinaryIO, kind: int) -> Any:
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        item_kind, count = _read(f, "I"), _read(f, "Q")
        if item_kind in _SCALARS:  # one read for a numeric array
            code = _SCALARS[item_kind]
            data = f.read(struct.calcsize(code) * count)
            return list(struct.unpack(f"<{count}{code}", data))
        return [_value(f, item_kind) for _ in range(count)]
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind])
    raise TokenizerBuildError(f"unknown GGUF value type {kind}")


def read_metadata(path: Path) -> dict[str, Any]:
    """The key/value header of the GGUF file at `path` (tensor data is not read)."""
    try:
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise TokenizerBuildError(f"{path}: not a GGUF file")
            version = _read(f, "I")
            if version not in (2, 3):
                raise TokenizerBuildError(f"{path}: unsupported GGUF version {version}")
            _read(f, "Q")  # tensor count
            count = _read(f, "Q")
            metadata = {}
            for _ in range(count):
                key = _string(f)
                metadata[key] = _value(f, _read(f, "I"))
            return metadata
    except (EOFError, struct.error, OSError) as e:
        raise TokenizerBuildError(f"{path}: truncated or unreadable GGUF header ({e})") from e


def _tokenizer_json(meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(`tokenizer.json`, `tokenizer_config.json`) for a byte-level BPE GGUF tokenizer."""
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges: list[str] = meta.get("tokenizer.ggml.merges") or []
    added = [
        {
            "id": i,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": kind == _CONTROL,
        }
        for i, (token, kind) in enumerate(zip(tokens, types, strict=True))
        if kind in (_CONTROL, _USER_DEFINED)
    ]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN2_SPLIT},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": False,
                    "use_regex": False,
                },
            ],
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {token: i for i, token in enumerate(tokens)},
            "merges": [merge.split(" ", 1) for merge in merges],
        },
    }

    def token(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else None

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": meta.get("qwen2.context_length", 32768),
        "eos_token": token("eos"),
        "pad_token": token("padding"),
        "bos_token": None,
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    return tokenizer, config


def tokenizer_dir(gguf: Path, cache: Path | None = None) -> Path:
    """A folder `AutoTokenizer.from_pretrained` (and verifiers' renderers) load offline.

    Built once from `gguf`'s header into `cache` (default: the package cache's `tokenizers/`),
    keyed by the GGUF's name and size, written atomically (a folder at the final path is
    complete), then reused.
    """
    gguf = Path(gguf)
    root = cache if cache is not None else private_cache("tokenizers")
    target = root / f"{gguf.stem}-{gguf.stat().st_size}-v{_FORMAT}"
    if (target / "tokenizer.json").is_file():
        return target
    meta = read_metadata(gguf)
    model, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
    if model != "gpt2" or pre != "qwen2":
        raise TokenizerBuildError(
            f"{gguf}: tokenizer {model!r}/{pre!r} is not supported (only gpt2/qwen2 BPE)"
        )
    tokenizer, config = _tokenizer_json(meta)
    tmp = root / f".tmp-{target.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    (tmp / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (tmp / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    try:
        os.rename(tmp, target)
    except OSError:
        # Another process built it first: theirs is complete, drop ours.
        for child in tmp.iterdir():
            child.unlink()
        tmp.rmdir()
        if not (target / "tokenizer.json").is_file():
            raise
    return target

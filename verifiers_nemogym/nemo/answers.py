"""What a NeMo Gym server answered, read one way: its JSON when the status is 200, else one line
naming where it came from (the status and the end of the text, or that it was not JSON)."""

from __future__ import annotations

import json
from typing import Any

from verifiers_nemogym.bridge.redact import cut


def read_json_answer(where: str, status: int, text: str, error: type[Exception]) -> Any:
    """The JSON of `text`, NeMo Gym's answer from `where` with HTTP `status`; an `error` (the
    caller's type: what such a failure means there) when `status` is not 200 (its text's last
    2,000 characters) or `text` is not JSON (its first 500)."""
    if status != 200:
        raise error(f"{where} answered {status}: {cut(text, 2000, keep='tail')}")
    try:
        return json.loads(text)
    except ValueError:
        raise error(f"{where} answered non-JSON: {cut(text, 500)}") from None

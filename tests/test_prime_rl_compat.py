"""Why prime-rl 0.8.0's RL loop stops with verifiers 0.4 (README, "Which prime-rl"): its
`orchestrator/trajectories.py:134` reads `branch.multi_modal_data`, which the installed verifiers'
`Branch` does not have (it carries `mm_token_type_id_map`)."""

from __future__ import annotations

import pytest
from verifiers.v1.trace import Branch


def test_verifiers_branch_has_no_multi_modal_data() -> None:
    assert "multi_modal_data" not in Branch.model_fields
    assert "mm_token_type_id_map" in Branch.model_fields
    branch = Branch.model_construct(index=0, nodes=[])
    with pytest.raises(AttributeError, match="'Branch' object has no attribute 'multi_modal_data'"):
        branch.multi_modal_data  # noqa: B018

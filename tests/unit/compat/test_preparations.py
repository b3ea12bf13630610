"""modeltap/compat/preparations.py: the release whose preparation applies, chosen by engine and
version, and vLLM's test of whether a template handles the developer role (the facts themselves are
held to each release's own code by test_prompts.py)."""

from __future__ import annotations

import pytest

from modeltap.compat import preparations
from modeltap.compat.preparations import preparation, template_names_developer


@pytest.mark.parametrize(
    ("engine", "version", "expected"),
    [
        ("vllm", None, preparations.VLLM),  # no version told: the newest release read
        ("vllm", "0.33.0", preparations.VLLM),
        ("vllm", "0.40.1", preparations.VLLM),
        ("vllm", "0.25.0", preparations.VLLM_0_19),  # the newest release read that is not newer
        ("vllm", "0.19.1", preparations.VLLM_0_19),
        ("vllm", "0.10.2", preparations.VLLM_0_19),  # older than any read: the oldest read
        ("vllm", "not-a-version", preparations.VLLM),
        ("sglang", "0.5.23", preparations.SGLANG),
        ("sglang", "0.5.20", preparations.SGLANG_0_5_10),
        ("sglang", None, preparations.SGLANG),
        ("transformers", None, preparations.TRANSFORMERS),
        ("areal", None, preparations.AREAL),
        ("areal", "1.0.4", preparations.AREAL_1_0_4),
        ("unknown", None, preparations.UNKNOWN),
    ],
)
def test_a_release_is_chosen_by_version(engine: str, version: str | None, expected: object) -> None:
    assert preparation(engine, version) is expected


def test_a_template_handles_the_developer_role_when_it_names_it() -> None:
    assert template_names_developer("{% if m.role == 'developer' %}")
    assert template_names_developer('{% if m.role == "developer" %}')
    assert not template_names_developer("{{ developer_note }}")

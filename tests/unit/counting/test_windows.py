"""modeltap/counting/windows.py: the one-time proof finds which earlier messages a template
rewrites and whether its generation prompt is constant, refuses templates windows cannot reproduce,
and a window's delta is exactly what the full renders add.

Templates here are rendered by template.py, which test_chat_template.py checks against
transformers; the windows are checked against its full renders.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from modeltap.counting import windows
from modeltap.counting.template import ChatTemplate
from modeltap.counting.windows import (
    AppendStability,
    Delta,
    Windows,
    context,
    head_length,
    render_delta,
    shape,
)

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Every message numbered: a full render is append-stable, but a window numbers from its own start.
NUMBERED = "{% for m in messages %}[{{ loop.index }}] {{ m.content }}\n{% endfor %}"
REASONING = {"role": "assistant", "content": "Done.", "reasoning_content": "I thought."}


@pytest.fixture(scope="module")
def qwen3_style(qwen_dir: str) -> ChatTemplate:
    """The Qwen3 folder's template: stripping reasoning before the last user query."""
    config = json.loads(Path(qwen_dir, "tokenizer_config.json").read_text())
    return ChatTemplate(config["chat_template"], {"eos_token": "<|im_end|>"})


def test_a_qwen3_style_template_rewrites_assistant_turns_with_reasoning(qwen3_style: ChatTemplate) -> None:
    windows = AppendStability(qwen3_style).windows({}, None)
    assert windows == Windows(
        frozenset({("assistant", True, False), ("assistant", True, True)}), "<|im_start|>assistant\n"
    )
    thinking_off = AppendStability(qwen3_style).windows({"enable_thinking": False}, [{"type": "function"}])
    assert (
        thinking_off is not None and thinking_off.prompt == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_a_plain_template_rewrites_nothing() -> None:
    assert AppendStability(ChatTemplate(CHATML, {})).windows({}, None) == Windows(
        frozenset(), "<|im_start|>assistant\n"
    )


def test_a_template_windows_cannot_reproduce_is_counted_in_full() -> None:
    assert AppendStability(ChatTemplate(NUMBERED, {})).windows({}, None) is None


def test_a_generation_prompt_that_varies_takes_a_third_render() -> None:
    # After a tool result the prompt differs (as in DeepSeek's templates): no constant prompt.
    template = CHATML.replace(
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        "{% if add_generation_prompt %}{% if messages[-1].role == 'tool' %}<|tool_done|>{% endif %}"
        "<|im_start|>assistant\n{% endif %}",
    )
    windows = AppendStability(ChatTemplate(template, {})).windows({}, None)
    assert windows == Windows(frozenset(), None)


def test_proofs_are_kept_per_kwargs_and_kind_of_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    stability = AppendStability(ChatTemplate(CHATML, {}))
    first = stability.windows({"a": 1}, None)
    monkeypatch.setattr(windows, "_Proof", None)  # any new proof would fail
    assert stability.windows({"a": 1}, None) is first
    with pytest.raises(TypeError):
        stability.windows({"a": 2}, None)


def test_the_delta_is_what_the_full_renders_add(qwen3_style: ChatTemplate) -> None:
    history = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, REASONING]
    new: list[dict[str, Any]] = [{"role": "assistant", "content": "More."}]
    delta = render_delta(qwen3_style, history, new, None, {})
    assert delta is not None
    earlier = qwen3_style.render(history, add_generation_prompt=False)
    later = qwen3_style.render([*history, *new], add_generation_prompt=False)
    assert delta == Delta(later[len(earlier) :], "<|im_start|>assistant\n")
    assert render_delta(qwen3_style, history, new, None, {}, prompt="<|im_start|>assistant\n") == delta


def test_no_delta_where_the_new_messages_rewrite_the_history(qwen3_style: ChatTemplate) -> None:
    # A new user turn drops the reasoning of the assistant turn before it.
    history = [{"role": "user", "content": "U"}, REASONING]
    assert render_delta(qwen3_style, history, [{"role": "user", "content": "Next"}], None, {}) is None
    # And a prompt that is not the template's is no reason to cut the render anywhere.
    assert render_delta(qwen3_style, history, [REASONING], None, {}, prompt="<|other|>") is None


def test_the_head_and_the_window() -> None:
    system, user, other = {"role": "system"}, {"role": "user"}, {"role": "assistant"}
    assert head_length([system, user, other]) == 2
    assert head_length([user, other]) == 1
    assert head_length([system, system, system, system, user]) == 1  # no user within HEAD_MAX
    # The head, kept messages before the last two, the last two.
    assert context(10, 2, [3, 5, 8]) == [0, 1, 3, 5, 8, 9]
    assert context(3, 2, []) == [0, 1, 2]


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"role": "assistant", "content": "x"}, ("assistant", False, False)),
        ({"role": "assistant", "content": "x", "thinking": "t"}, ("assistant", True, False)),
        ({"role": "assistant", "content": "<think>t</think>x"}, ("assistant", True, False)),
        (
            {"role": "assistant", "content": [{"type": "text", "text": "a</think>"}]},
            ("assistant", True, False),
        ),
        (
            {"role": "assistant", "content": "", "reasoning_content": "", "tool_calls": [{}]},
            ("assistant", False, True),
        ),
        ({"role": "tool", "content": "out"}, ("tool", False, False)),
    ],
)
def test_the_shape_a_template_may_rewrite_a_message_by(
    message: dict[str, Any], expected: tuple[str, bool, bool]
) -> None:
    assert shape(message) == expected

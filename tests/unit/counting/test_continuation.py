"""modeltap/counting/continuation.py: prompt ids built from the previous turn's own ids, checked against
transformers' apply_chat_template (the oracle) on Qwen3's template and on a ChatML one that rewrites
nothing, for generated conversations of every shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from modeltap import dialects
from modeltap.counting.continuation import BuiltTurn, PromptBuilder, continues, same_reply, study_turn_end
from modeltap.counting.counter import TokenCounter
from tests import echo_changes as echoes
from tests.factories import qwen_folder

CHAT = dialects.named("chat")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
# ChatML as Qwen2.5 writes it, without reasoning: a template that renders every turn the same whatever
# follows, so a continued prompt must equal the full render's ids.
CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] %}{{- message['content'] }}{%- endif %}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{{- '<tool_call>\\n' + call['function'] | tojson + '\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def qwen3(qwen_dir: str) -> tuple[PromptBuilder, PreTrainedTokenizerBase]:
    return PromptBuilder(TokenCounter.load(qwen_dir)), AutoTokenizer.from_pretrained(
        qwen_dir, local_files_only=True
    )


@pytest.fixture(scope="module")
def chatml(
    qwen_dir: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[PromptBuilder, PreTrainedTokenizerBase]:
    folder = qwen_folder(tmp_path_factory.mktemp("chatml") / "tok", qwen_dir, {"chat_template": CHATML})
    return PromptBuilder(TokenCounter.load(folder)), AutoTokenizer.from_pretrained(
        folder, local_files_only=True
    )


def prepared(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as vLLM and SGLang hand them to the template: content None as "", tool-call
    arguments parsed (docs/engines.md)."""
    out = []
    for message in messages:
        message = {**message, "content": message.get("content") or ""}
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                for c in message["tool_calls"]
            ]
        out.append(message)
    return out


def oracle(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] = TOOLS,
    **kwargs: Any,
) -> list[int]:
    messages = prepared(messages)
    ids = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, **kwargs
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def call(command: str, call_id: str = "c1") -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }


def earlier(previous: BuiltTurn | None) -> list[BuiltTurn]:
    return [previous] if previous is not None else []


def turn(
    builder: PromptBuilder,
    body: dict[str, Any],
    previous: BuiltTurn | None,
    reply: dict[str, Any],
    completion: list[int],
) -> BuiltTurn:
    return builder.turn(builder.build(CHAT, body, earlier(previous)), [completion], [reply])


def test_qwen3_ends_a_turn_with_im_end_and_may_stop_on_end_of_text(qwen3: tuple[PromptBuilder, Any]) -> None:
    builder, _ = qwen3
    assert (builder.turn_end.token, builder.turn_end.token_id) == ("<|im_end|>", 151645)
    assert builder.turn_end.stop_ids == {151645, 151643}


def test_a_first_turn_is_the_full_render(qwen3: tuple[PromptBuilder, PreTrainedTokenizerBase]) -> None:
    builder, tok = qwen3
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Run ls"}]
    built = builder.build(CHAT, {"model": "m", "messages": messages, "tools": TOOLS}, [])
    assert built.ids == oracle(tok, messages) and built.continued is None
    assert built.reason == "no earlier turn of this session"


def test_qwen3_keeps_the_models_reasoning_and_ids_where_a_render_would_drop_them(
    qwen3: tuple[PromptBuilder, PreTrainedTokenizerBase],
) -> None:
    builder, tok = qwen3
    first = [{"role": "user", "content": "Run ls"}]
    body = {"model": "m", "messages": first, "tools": TOOLS}
    # What the model sampled after the generation prompt: reasoning, a call, the end of its turn.
    sampled = (
        "<think>\nI should list.\n</think>\n\n<tool_call>\n"
        '{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'
    )
    completion = tok.encode(sampled, add_special_tokens=False)
    reply = {
        "role": "assistant",
        "content": "",
        "reasoning_content": "I should list.",
        "tool_calls": [call("ls")],
    }
    previous = turn(builder, body, None, reply, completion)
    # The agent echoes the reply without its reasoning and with arguments spaced its own way.
    echoed = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{**call("ls"), "function": {"name": "bash", "arguments": '{"command":"ls"}'}}],
    }
    second = [*first, echoed, {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}]
    built = builder.build(CHAT, {"model": "m", "messages": second, "tools": TOOLS}, earlier(previous))
    assert built.continued == 0 and built.reason is None
    assert built.ids[: len(previous.prompt) + len(completion)] == [*previous.prompt, *completion]
    # What follows the model's turn end is exactly what transformers renders after the reply's turn end.
    full = tok.apply_chat_template(prepared(second), tools=TOOLS, add_generation_prompt=True, tokenize=False)
    after = full[full.index("<|im_end|>", full.index("<|im_start|>assistant")) + len("<|im_end|>") :]
    assert tok.decode(built.ids[len(previous.prompt) + len(completion) :]) == after
    # A full render would have dropped the reasoning: the ids differ there, by design.
    assert built.ids != oracle(tok, second)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    turns=st.lists(
        st.tuples(st.sampled_from(["tool", "user"]), st.text(alphabet="ab c\n", min_size=1, max_size=12)),
        min_size=1,
        max_size=5,
    ),
    content=st.sampled_from(["", "Sure.", "  two words \n"]),
)
def test_on_a_template_that_rewrites_nothing_continuing_equals_the_full_render(
    chatml: tuple[PromptBuilder, PreTrainedTokenizerBase], turns: list[tuple[str, str]], content: str
) -> None:
    builder, tok = chatml
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "go"},
    ]
    previous = None
    for n, (kind, text) in enumerate(turns):
        built = builder.build(
            CHAT,
            {"model": "m", "messages": messages, "tools": TOOLS},
            earlier(previous),
        )
        assert built.ids == oracle(tok, messages), (n, built.reason)
        assert (built.continued is None) == (previous is None)
        reply = {"role": "assistant", "content": content, "tool_calls": [call(text, f"c{n}")]}
        rendered = tok.apply_chat_template(prepared([*messages, reply]), tools=TOOLS, tokenize=False)
        generated = rendered[
            len(
                tok.apply_chat_template(
                    prepared(messages), tools=TOOLS, add_generation_prompt=True, tokenize=False
                )
            ) :
        ]
        completion = tok.encode(
            generated[: generated.rindex("<|im_end|>") + len("<|im_end|>")], add_special_tokens=False
        )
        previous = turn(
            builder, {"model": "m", "messages": messages, "tools": TOOLS}, previous, reply, completion
        )
        follow = (
            {"role": "tool", "tool_call_id": f"c{n}", "content": text}
            if kind == "tool"
            else {"role": "user", "content": text}
        )
        messages = [*messages, reply, follow]


def test_a_completion_cut_short_or_stopped_on_end_of_text_gets_the_templates_turn_end(
    chatml: tuple[PromptBuilder, PreTrainedTokenizerBase],
) -> None:
    builder, tok = chatml
    first = [{"role": "user", "content": "go"}]
    body = {"model": "m", "messages": first}
    for completion, expected in (
        (tok.encode("ok", add_special_tokens=False), [*tok.encode("ok", add_special_tokens=False), 151645]),
        (
            [*tok.encode("ok", add_special_tokens=False), 151643],
            [*tok.encode("ok", add_special_tokens=False), 151645],
        ),
    ):
        previous = turn(builder, body, None, {"role": "assistant", "content": "ok"}, completion)
        second = [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
        built = builder.build(CHAT, {"model": "m", "messages": second}, earlier(previous))
        assert built.ids[len(previous.prompt) : len(previous.prompt) + len(expected)] == expected


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda m: [{**m[0], "content": "other"}, *m[1:]], "message 1 (user) changed"),
        (
            lambda m: [m[0], {**m[1], "content": "something else"}, m[2]],
            "the previous reply came back changed (its content)",
        ),
        (
            lambda m: [m[0], {**m[1], "tool_calls": [call("pwd")]}, m[2]],
            "the previous reply came back changed (its tool-call arguments)",
        ),
        (lambda m: m[:2], "no message follows the echoed reply"),
        (
            lambda m: [m[0], m[2]],
            "the previous reply came back changed (role 'tool' where the reply was the assistant's)",
        ),
    ],
)
def test_an_edit_is_rendered_in_full_and_says_why(
    chatml: tuple[PromptBuilder, PreTrainedTokenizerBase], change: Any, reason: str
) -> None:
    builder, tok = chatml
    first = [{"role": "user", "content": "go"}]
    reply = {"role": "assistant", "content": "Listing.", "tool_calls": [call("ls")]}
    previous = turn(builder, {"model": "m", "messages": first, "tools": TOOLS}, None, reply, [1, 2, 151645])
    messages = change([*first, reply, {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}])
    built = builder.build(CHAT, {"model": "m", "messages": messages, "tools": TOOLS}, earlier(previous))
    assert built.continued is None and built.reason == reason
    assert built.ids == oracle(tok, messages)


def test_changed_tools_or_kwargs_do_not_continue(
    chatml: tuple[PromptBuilder, PreTrainedTokenizerBase],
) -> None:
    builder, _ = chatml
    first = [{"role": "user", "content": "go"}]
    reply = {"role": "assistant", "content": "ok"}
    previous = turn(builder, {"model": "m", "messages": first, "tools": TOOLS}, None, reply, [1, 151645])
    messages = [*first, reply, {"role": "user", "content": "more"}]
    prepared = builder.build(CHAT, {"model": "m", "messages": messages}, earlier(previous)).prepared
    assert continues(previous, prepared) == (None, "the tools changed")
    body = {"model": "m", "messages": messages, "tools": TOOLS, "chat_template_kwargs": {"x": 1}}
    kwargs = builder.build(CHAT, body, [previous])
    assert kwargs.reason == "the chat template kwargs changed"


@pytest.mark.parametrize(
    ("echoed", "same"),
    [
        ({"role": "assistant", "content": "r1"}, True),
        ({"role": "assistant", "content": "r1 "}, True),  # whitespace: the same words
        ({"role": "assistant", "content": "\n\nr1"}, True),
        ({"role": "assistant", "content": "r1!"}, False),
        ({"role": "assistant", "content": "r1", "reasoning_content": "other thoughts"}, False),
        ({"role": "assistant", "content": "r1", "reasoning_content": "thinking"}, True),
    ],
)
def test_same_reply_is_the_same_words_calls_and_arguments(echoed: dict[str, Any], same: bool) -> None:
    reply = {"role": "assistant", "content": "r1", "reasoning_content": "thinking"}
    assert (same_reply(echoed, reply) is None) is same


def test_arguments_compare_as_json_whatever_their_spacing_and_key_order() -> None:
    reply = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1, "b": [2]}'}}],
    }
    reordered = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": "f", "arguments": '{"b":[2],"a":1}'}}],
    }
    assert same_reply(reordered, reply) is None
    assert (
        same_reply({**reordered, "tool_calls": [{"function": {"name": "g", "arguments": "{}"}}]}, reply)
        == "its tool calls"
    )


def test_a_template_without_an_added_turn_end_is_refused(qwen_dir: str, tmp_path: Path) -> None:
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    folder = qwen_folder(tmp_path / "tok", qwen_dir, {"chat_template": plain})
    loaded = TokenCounter.load(folder).tokenizer
    with pytest.raises(ValueError, match="not an added token"):
        study_turn_end(loaded.template, loaded.added_ids)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=echoes.echo_cases())
def test_exact_mode_keeps_the_models_ids_unless_the_echo_changed_their_meaning(
    qwen3: tuple[PromptBuilder, PreTrainedTokenizerBase], case: echoes.EchoCase
) -> None:
    builder, tokenizer = qwen3
    first = {"model": "m", "messages": case.first_history, "tools": echoes.TOOLS}
    completion = [*tokenizer.encode(case.completion_text, add_special_tokens=False), 151645]
    previous = turn(builder, first, None, case.reply, completion)
    second = {"model": "m", "messages": case.second_history, "tools": echoes.TOOLS}
    built = builder.build(CHAT, second, [previous])
    if case.meaning_kept:
        # The model's prompt and completion ids, untouched, then what the template adds after them.
        assert built.continued == 0, built.reason
        assert built.ids[: len(previous.prompt) + len(completion)] == [*previous.prompt, *completion]
        assert (
            built.ids[len(previous.prompt) + len(completion) :]
            == oracle(tokenizer, case.second_history, echoes.TOOLS)[
                -(len(built.ids) - len(previous.prompt) - len(completion)) :
            ]
        )
    else:
        # An edit: the history is rendered in full from the messages as sent, as the engine renders it.
        assert built.continued is None and built.reason is not None
        assert built.ids == oracle(tokenizer, case.second_history, echoes.TOOLS)

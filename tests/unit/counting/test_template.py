"""modeltap/counting/template.py: renders exactly what transformers renders, and encodes exactly as it
encodes, without importing it.

The oracle in every test is transformers' `AutoTokenizer.from_pretrained(folder)` over the same folder:
`apply_chat_template(..., tokenize=False)` for the text (or the same exception), `encode` for the ids,
`special_tokens_map` and `added_tokens_decoder` for what the folder declares. The folders are the real
Qwen3 tokenizer (whose template takes reasoning_content and enable_thinking) and copies of it with
templates and configs written here.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import numpy
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import chat_template_utils

from modeltap.counting import template
from modeltap.counting.template import ChatTemplate
from modeltap.counting.tokenizer_files import TokenizerFiles
from tests.factories import qwen_folder

# Hypothesis budgets: enough generated conversations per template to cover tools, tool calls, reasoning,
# unicode, code and empty turns, few enough that the file runs in under a minute on two shared cores.
QWEN_CONVERSATIONS = 300
FIXTURE_CONVERSATIONS = 150

# strftime_now reads the clock: both renderers see this instant, so a test never straddles midnight.
FROZEN_NOW = datetime(2024, 7, 26, 9, 30)

# --- templates written here, each exercising part of transformers' Jinja environment --------------

# Llama 3.1's shape: bos_token, strftime_now with a date_string override, tools in the system turn
# with tojson(indent=4), tool calls as JSON, and `| trim`.
LLAMA3_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none %}
    {{- "You have access to the following functions.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
        {{- message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- for tool_call in message.tool_calls %}
            {%- set tool_call = tool_call.function %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- '{"name": "' + tool_call.name + '", "parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endfor %}
        {{- "<|eot_id|>" }}
    {%- else %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
{{- image_token if image_token is defined }}"""

# Every tojson argument, over whole messages: shows the key order, the keys dropped for None, the
# reasoning aliases, unicode kept or escaped, tuples, and the documents.
TOJSON_TEMPLATE = """{% for message in messages %}
{{ message | tojson }}
{{ message | tojson(indent=2, sort_keys=true) }}
{{ message | tojson(ensure_ascii=true, separators=(',', ':')) }}
{{ message.thinking | default(none) | tojson }}/{{ message.reasoning_content | default(none) | tojson }}
{% endfor %}
{{ tools | tojson(indent='\t') }}
{{ documents | tojson }}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Loop controls, namespace, the sandboxed dict, the generation tag, and trim/lstrip around all of them.
CONTROLS_TEMPLATE = """{% set ns = namespace(tools=0, shown=0) %}
{% for m in messages %}
    {% if m.role == 'tool' %}{% set ns.tools = ns.tools + 1 %}{% continue %}{% endif %}
    {% if ns.shown >= 5 %}{% break %}{% endif %}
    {% set ns.shown = ns.shown + 1 %}
<|im_start|>{{ m.role }}
{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<|im_end|>{% endgeneration %}
{% else %}{{ m.content }}<|im_end|>
{% endif %}
{% endfor %}
{{ dict(tools=ns.tools, shown=ns.shown, total=messages|length) | tojson }}
{{ dict.fromkeys(['a', 'b'], 0) | tojson }}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# raise_exception, as templates refuse a conversation they cannot render.
RAISING_TEMPLATE = """{% if messages[0].role not in ('system', 'user') %}
{{ raise_exception('Conversation roles must start with system or user, not ' + messages[0].role) }}
{% endif %}
{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}"""

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOL_USE_TEMPLATE = "# Tools {{ tools | length }}: {{ tools | tojson }}\n" + CHATML_TEMPLATE
DOCUMENTS_TEMPLATE = "{% for d in documents %}[{{ d.title }}] {{ d.text }}\n{% endfor %}" + CHATML_TEMPLATE


# --- folders --------------------------------------------------------------------------------------


def with_template(template: str | list[dict[str, str]], **config: Any) -> dict[str, Any]:
    return {"chat_template": template, **config}


LLAMA3_SPECIAL_TOKENS = {
    "bos_token": {
        "__type": "AddedToken",
        "content": "<|endoftext|>",
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "single_word": False,
        "special": True,
    },
    "image_token": "<|image_pad|>",
}

FOLDERS: dict[str, Callable[[Path, str], Path]] = {
    "qwen": lambda root, qwen: Path(qwen),
    "llama3": lambda root, qwen: qwen_folder(
        root, qwen, with_template(LLAMA3_TEMPLATE, **LLAMA3_SPECIAL_TOKENS)
    ),
    "tojson": lambda root, qwen: qwen_folder(root, qwen, with_template(TOJSON_TEMPLATE)),
    "controls": lambda root, qwen: qwen_folder(root, qwen, with_template(CONTROLS_TEMPLATE)),
}


@pytest.fixture(scope="module")
def folder(request: pytest.FixtureRequest, qwen_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    name: str = request.param
    return FOLDERS[name](tmp_path_factory.mktemp(name) / "tokenizer", qwen_dir)


@pytest.fixture(scope="module")
def pair(folder: Path) -> tuple[TokenizerFiles, PreTrainedTokenizerBase]:
    return TokenizerFiles.load(folder), AutoTokenizer.from_pretrained(folder, local_files_only=True)


def load_both(path: Path) -> tuple[TokenizerFiles, PreTrainedTokenizerBase]:
    return TokenizerFiles.load(path), AutoTokenizer.from_pretrained(path, local_files_only=True)


def freeze_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    class Frozen(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Frozen:
            return cls.combine(FROZEN_NOW.date(), FROZEN_NOW.time(), tzinfo=tz)

    monkeypatch.setattr(template, "datetime", Frozen)
    monkeypatch.setattr(chat_template_utils, "datetime", Frozen)


def outcome(render: Callable[[], Any]) -> tuple[str, Any]:
    """("text", the render) or ("error", its type and message), so a refusal must match too."""
    try:
        return "text", render()
    except Exception as exc:
        return "error", (type(exc).__name__, str(exc))


def both(
    ours: TokenizerFiles,
    oracle: PreTrainedTokenizerBase,
    messages: Any,
    tools: Any = None,
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> tuple[tuple[str, Any], tuple[str, Any]]:
    """(our outcome, transformers' outcome), each renderer given its own copy of the inputs."""
    mine = outcome(
        lambda: ours.template.render(
            copy.deepcopy(messages),
            tools=copy.deepcopy(tools),
            add_generation_prompt=add_generation_prompt,
            **copy.deepcopy(kwargs),
        )
    )
    theirs = outcome(
        lambda: oracle.apply_chat_template(
            copy.deepcopy(messages),
            tools=copy.deepcopy(tools),
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **copy.deepcopy(kwargs),
        )
    )
    return mine, theirs


# --- generated conversations ----------------------------------------------------------------------

SNIPPETS = [
    "<think>\nlet me see\n</think>\n\n",
    "</think>",
    "<|im_end|>",
    "<tool_call>",
    "<tool_response>",
    "\n\n",
    "```python\n",
    "   ",
    "e\u0301",
    "a\u0308\u0301",
    "🤖",
    "👩‍💻",
    "日本語のテキスト、句読点。",
    "한국어",
    "\r\n",
    "\t",
    "{{ not_a_variable }}",
    '"quoted" \\ backslash',
    "ｆｕｌｌ　width",
]
CODE = Path(json.__file__).with_name("decoder.py").read_text(encoding="utf-8")

texts = st.lists(
    st.one_of(
        st.text(st.characters(exclude_categories=("Cs",)), max_size=30),
        st.sampled_from(SNIPPETS),
        st.integers(0, len(CODE)).flatmap(lambda a: st.integers(0, 600).map(lambda n: CODE[a : a + n])),
    ),
    max_size=4,
).map("".join)
names = st.from_regex(r"[a-z_][a-z0-9_]{0,11}", fullmatch=True)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=6,
)
arguments = st.dictionaries(names, json_values, max_size=3)
tool_lists = st.lists(
    st.builds(
        lambda name, doc, props, required: {
            "type": "function",
            "function": {
                "name": name,
                "description": doc,
                "parameters": {"type": "object", "properties": props, "required": required},
            },
        },
        names,
        texts,
        st.dictionaries(
            names,
            st.sampled_from(
                [{"type": "string"}, {"type": "integer", "description": "größe ✓"}, {"enum": ["a", "b"]}]
            ),
            max_size=3,
        ),
        st.lists(names, max_size=2),
    ),
    max_size=3,
)


@st.composite
def contents(draw: st.DrawFn, unusual: bool) -> Any:
    """Text, sometimes empty; if `unusual`, also None (dropped like a missing key) or a list of parts,
    which most templates refuse."""
    kinds = ["text", "empty", *(["none", "parts"] if unusual else [])]
    kind = draw(st.sampled_from(kinds))
    if kind == "none":
        return None
    if kind == "parts":
        return [{"type": "text", "text": draw(texts)}]
    return "" if kind == "empty" else draw(texts)


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """System, user, assistant (with reasoning under any of its names, and tool calls whose arguments
    are a dict or a JSON string) and tool turns."""
    # Half the conversations have only string contents, so that most of them render.
    unusual = draw(st.booleans())
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(contents(unusual))})
    for _ in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": draw(contents(unusual))})
        assistant: dict[str, Any] = {"role": "assistant", "content": draw(contents(unusual))}
        if draw(st.booleans()):
            assistant[draw(st.sampled_from(template.REASONING_FIELDS))] = draw(texts)
        calls = draw(st.lists(st.tuples(names, arguments), max_size=2))
        if calls:
            as_string = draw(st.booleans())
            assistant["tool_calls"] = [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {
                        "name": n,
                        "arguments": json.dumps(a, ensure_ascii=False) if as_string else a,
                    },
                }
                for i, (n, a) in enumerate(calls)
            ]
        messages.append(assistant)
        messages.extend(
            {"role": "tool", "tool_call_id": f"call_{i}", "content": draw(contents(unusual))}
            for i in range(len(calls))
        )
    return messages


template_kwargs = st.fixed_dictionaries(
    {},
    optional={
        "enable_thinking": st.booleans(),
        "date_string": st.sampled_from(["01 Jan 2025", "31 Dec 1999"]),
        "custom_tools": tool_lists,
        "eos_token": st.just("<override>"),
    },
)


def assert_same_ids(ours: TokenizerFiles, oracle: PreTrainedTokenizerBase, text: str) -> None:
    assert ours.tokenizer.encode(text, add_special_tokens=False).ids == oracle.encode(
        text, add_special_tokens=False
    )


@pytest.mark.parametrize("folder", ["qwen"], indirect=True)
@settings(
    max_examples=QWEN_CONVERSATIONS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    messages=conversations(),
    tools=st.none() | tool_lists,
    add_generation_prompt=st.booleans(),
    kwargs=template_kwargs,
)
def test_qwen_renders_and_encodes_as_transformers(
    pair: tuple[TokenizerFiles, PreTrainedTokenizerBase],
    monkeypatch: pytest.MonkeyPatch,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    kwargs: dict[str, Any],
) -> None:
    freeze_clock(monkeypatch)
    ours, oracle = pair
    mine, theirs = both(ours, oracle, messages, tools, add_generation_prompt, **kwargs)
    assert mine == theirs
    if mine[0] == "text":
        assert_same_ids(ours, oracle, mine[1])


@pytest.mark.parametrize("folder", ["llama3", "tojson", "controls"], indirect=True)
@settings(
    max_examples=FIXTURE_CONVERSATIONS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    messages=conversations(),
    tools=st.none() | tool_lists,
    add_generation_prompt=st.booleans(),
    kwargs=template_kwargs,
)
def test_fixture_templates_render_as_transformers(
    pair: tuple[TokenizerFiles, PreTrainedTokenizerBase],
    monkeypatch: pytest.MonkeyPatch,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    kwargs: dict[str, Any],
) -> None:
    freeze_clock(monkeypatch)
    ours, oracle = pair
    mine, theirs = both(ours, oracle, messages, tools, add_generation_prompt, **kwargs)
    assert mine == theirs


# --- fixed conversations: each renders (not just fails alike) on every template -------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file — returns its text",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]
AGENT_TURNS: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent. 日本語 OK 🤖"},
    {"role": "user", "content": "Fix the bug in main.py"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Read it first.",
        "tool_calls": [
            {"type": "function", "function": {"name": "read_file", "arguments": {"path": "main.py"}}}
        ],
    },
    {"role": "tool", "content": "def f(x):\n    return x ** 2  # e\u0301"},
    {
        "role": "assistant",
        "content": "Looking again.",
        "tool_calls": [
            {"type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
        ],
    },
    {"role": "tool", "content": "pass"},
    {"role": "assistant", "content": "<think>\nold reasoning\n</think>\n\nDone.", "tool_calls": None},
    {"role": "user", "content": "Thanks"},
]


@pytest.mark.parametrize("folder", ["qwen", "llama3", "tojson", "controls"], indirect=True)
@pytest.mark.parametrize("tools", [None, [], TOOLS])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_an_agent_conversation_renders_as_transformers(
    pair: tuple[TokenizerFiles, PreTrainedTokenizerBase],
    monkeypatch: pytest.MonkeyPatch,
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
) -> None:
    freeze_clock(monkeypatch)
    ours, oracle = pair
    mine, theirs = both(ours, oracle, AGENT_TURNS, tools, add_generation_prompt)
    assert mine[0] == "text", mine
    assert mine == theirs
    assert_same_ids(ours, oracle, mine[1])


@pytest.mark.parametrize("folder", ["qwen"], indirect=True)
@pytest.mark.parametrize("enable_thinking", [True, False])
def test_qwen3_template_strips_earlier_turns_reasoning(
    pair: tuple[TokenizerFiles, PreTrainedTokenizerBase], enable_thinking: bool
) -> None:
    ours, oracle = pair
    mine, theirs = both(ours, oracle, AGENT_TURNS, TOOLS, enable_thinking=enable_thinking)
    assert mine == theirs
    text = mine[1]
    # The reasoning of turns before the last user message is dropped, and `enable_thinking=False` closes
    # an empty think block in the generation prompt.
    assert "Read it first." not in text and "old reasoning" not in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") is not enable_thinking


@pytest.mark.parametrize("folder", ["llama3"], indirect=True)
def test_strftime_now_reads_the_clock(pair: tuple[TokenizerFiles, PreTrainedTokenizerBase]) -> None:
    ours, oracle = pair
    messages = [{"role": "user", "content": "What day is it?"}]
    before = datetime.now()
    mine, theirs = both(ours, oracle, messages)
    after = datetime.now()
    if before.date() == after.date():  # else midnight fell between the two renders
        assert mine == theirs
    assert any(f"Today Date: {t.strftime('%d %b %Y')}\n" in mine[1] for t in (before, after))
    # bos_token from an AddedToken object in the config, and a model-specific *_token variable.
    assert mine[1].startswith("<|endoftext|><|start_header_id|>system")
    assert mine[1].endswith("<|image_pad|>")
    dated = ours.template.render(messages, date_string="01 Jan 2025")
    assert "Today Date: 01 Jan 2025\n" in dated


@pytest.mark.parametrize("folder", ["qwen", "llama3"], indirect=True)
def test_special_tokens_and_added_tokens_are_transformers(
    pair: tuple[TokenizerFiles, PreTrainedTokenizerBase],
) -> None:
    ours, oracle = pair
    assert dict(ours.template.special_tokens) == oracle.special_tokens_map
    assert dict(ours.added_tokens) == oracle.added_tokens_decoder
    post_tokens = oracle.backend_tokenizer.num_special_tokens_to_add(False)
    assert ours.tokenizer.num_special_tokens_to_add(False) == post_tokens


# --- how a folder's templates are found -----------------------------------------------------------


def test_raise_exception_raises_the_same_template_error(qwen_dir: str, tmp_path: Path) -> None:
    ours, oracle = load_both(qwen_folder(tmp_path / "t", qwen_dir, with_template(RAISING_TEMPLATE)))
    refused = [{"role": "assistant", "content": "hi"}]
    mine, theirs = both(ours, oracle, refused)
    assert (
        mine
        == theirs
        == ("error", ("TemplateError", "Conversation roles must start with system or user, not assistant"))
    )
    with pytest.raises(jinja2.TemplateError):
        ours.template.render(refused)
    assert both(ours, oracle, [{"role": "user", "content": "hi"}])[0][0] == "text"


def test_a_list_of_named_templates_picks_tool_use_when_tools_are_passed(
    qwen_dir: str, tmp_path: Path
) -> None:
    named = [
        {"name": "default", "template": CHATML_TEMPLATE},
        {"name": "tool_use", "template": TOOL_USE_TEMPLATE},
    ]
    ours, oracle = load_both(qwen_folder(tmp_path / "t", qwen_dir, with_template(named)))
    assert dict(ours.template.templates) == oracle.chat_template
    messages = [{"role": "user", "content": "hi"}]
    for tools in (None, [], TOOLS):
        mine, theirs = both(ours, oracle, messages, tools)
        assert mine == theirs
        assert mine[1].startswith("# Tools") is (tools is not None)
    assert ours.template.source(TOOLS) == TOOL_USE_TEMPLATE
    assert ours.template.source() == CHATML_TEMPLATE


def test_named_templates_without_a_default_are_refused_like_transformers(
    qwen_dir: str, tmp_path: Path
) -> None:
    named = [
        {"name": "tool_use", "template": TOOL_USE_TEMPLATE},
        {"name": "rag", "template": DOCUMENTS_TEMPLATE},
    ]
    ours, oracle = load_both(qwen_folder(tmp_path / "t", qwen_dir, with_template(named)))
    messages = [{"role": "user", "content": "hi"}]
    mine, theirs = both(ours, oracle, messages)
    assert (mine[0], mine[1][0], theirs[0], theirs[1][0]) == ("error", "ValueError", "error", "ValueError")
    mine, theirs = both(ours, oracle, messages, TOOLS)
    assert mine[0] == "text" and mine == theirs


def test_chat_template_jinja_wins_over_the_config_and_reads_as_text(qwen_dir: str, tmp_path: Path) -> None:
    files = {
        # CRLF line ends: transformers reads the file in text mode, which turns them into "\n".
        "chat_template.jinja": CHATML_TEMPLATE.replace("\n", "\r\n") + "{{ '\\r\\n' }}",
        "additional_chat_templates/tool_use.jinja": TOOL_USE_TEMPLATE,
    }
    path = qwen_folder(tmp_path / "t", qwen_dir, with_template(LLAMA3_TEMPLATE), files=files)
    ours, oracle = load_both(path)
    assert dict(ours.template.templates) == oracle.chat_template
    for tools in (None, TOOLS):
        mine, theirs = both(ours, oracle, AGENT_TURNS, tools)
        assert mine[0] == "text" and mine == theirs


def test_additional_templates_alone_replace_the_configs(qwen_dir: str, tmp_path: Path) -> None:
    files = {"additional_chat_templates/tool_use.jinja": TOOL_USE_TEMPLATE}
    ours, oracle = load_both(
        qwen_folder(tmp_path / "t", qwen_dir, with_template(CHATML_TEMPLATE), files=files)
    )
    assert dict(ours.template.templates) == oracle.chat_template == {"tool_use": TOOL_USE_TEMPLATE}
    messages = [{"role": "user", "content": "hi"}]
    for tools in (None, TOOLS):
        mine, theirs = both(ours, oracle, messages, tools)
        assert mine[0] == theirs[0] and mine[1][0] == theirs[1][0]


def test_a_processors_chat_template_json_is_the_last_resort(qwen_dir: str, tmp_path: Path) -> None:
    files = {"chat_template.json": json.dumps({"chat_template": TOOL_USE_TEMPLATE})}
    only_json = qwen_folder(tmp_path / "json", qwen_dir, drop=("chat_template",), files=files)
    ours, oracle = load_both(only_json)
    # AutoTokenizer never reads chat_template.json (AutoProcessor does): the render must equal
    # transformers' with that template passed explicitly.
    assert oracle.chat_template is None
    assert ours.template.source() == TOOL_USE_TEMPLATE
    mine = ours.template.render(AGENT_TURNS, tools=TOOLS)
    assert mine == oracle.apply_chat_template(
        AGENT_TURNS, tools=TOOLS, chat_template=TOOL_USE_TEMPLATE, add_generation_prompt=True, tokenize=False
    )
    both_files = qwen_folder(tmp_path / "both", qwen_dir, with_template(CHATML_TEMPLATE), files=files)
    assert TokenizerFiles.load(both_files).template.source() == CHATML_TEMPLATE


def test_documents_reach_the_template(qwen_dir: str, tmp_path: Path) -> None:
    ours, oracle = load_both(qwen_folder(tmp_path / "t", qwen_dir, with_template(DOCUMENTS_TEMPLATE)))
    documents = [{"title": "Guide", "text": "Use 🤖 carefully"}, {"title": "FAQ", "text": "", "extra": None}]
    messages = [{"role": "user", "content": "hi"}]
    mine = ours.template.render(messages, documents=documents)
    assert mine.startswith("[Guide] Use 🤖 carefully\n[FAQ] \n")
    assert mine == oracle.apply_chat_template(
        messages, documents=documents, add_generation_prompt=True, tokenize=False
    )


def test_legacy_special_tokens_map_overrides_the_config(qwen_dir: str, tmp_path: Path) -> None:
    # A config saved before added_tokens_decoder existed: special_tokens_map.json overrides it.
    legacy = {"bos_token": {"content": "<|im_start|>", "lstrip": False, "rstrip": False, "normalized": False}}
    files = {"special_tokens_map.json": json.dumps(legacy)}
    path = qwen_folder(
        tmp_path / "legacy",
        qwen_dir,
        with_template(LLAMA3_TEMPLATE),
        drop=("added_tokens_decoder",),
        files=files,
    )
    ours, oracle = load_both(path)
    assert dict(ours.template.special_tokens) == oracle.special_tokens_map
    assert ours.template.special_tokens["bos_token"] == "<|im_start|>"
    assert dict(ours.added_tokens) == oracle.added_tokens_decoder


def test_tokens_the_config_declares_are_added_as_transformers_adds_them(
    qwen_dir: str, tmp_path: Path
) -> None:
    decoder = json.loads(Path(qwen_dir, "tokenizer_config.json").read_text(encoding="utf-8"))[
        "added_tokens_decoder"
    ]
    # The config's flags win over tokenizer.json's; special tokens missing from the vocabulary are added.
    decoder["151667"] = {**decoder["151667"], "special": True, "lstrip": True}
    config = {
        "tokenizer_class": "TokenizersBackend",
        "added_tokens_decoder": decoder,
        "eos_token": "<|my_eos|>",
        "image_token": "<my_image>",
        "additional_special_tokens": ["<|im_start|>", "<|extra_new|>"],
    }
    ours, oracle = load_both(qwen_folder(tmp_path / "t", qwen_dir, config))
    assert dict(ours.template.special_tokens) == oracle.special_tokens_map
    assert dict(ours.added_tokens) == oracle.added_tokens_decoder
    assert {"<|my_eos|>", "<|extra_new|>", "<my_image>"} <= {t.content for t in ours.added_tokens.values()}
    assert_same_ids(ours, oracle, "a<|my_eos|>b <|extra_new|>  <think>x</think> <my_image><|im_start|>user")


def _pipeline_facts(files: TokenizerFiles) -> tuple[Any, ...]:
    """What a folder says besides its vocabulary: templates, special tokens, the added tokens' contents
    and flags (their ids depend on the vocabulary's size), the post-processor, special-token splitting."""
    tokenizer = files.tokenizer
    added = sorted(
        (t.content, t.special, t.lstrip, t.rstrip, t.single_word, t.normalized)
        for t in files.added_tokens.values()
    )
    return (
        dict(files.template.templates),
        dict(files.template.special_tokens),
        added,
        tokenizer.num_special_tokens_to_add(False),
        tokenizer.num_special_tokens_to_add(True),
        tokenizer.encode_special_tokens,
        tokenizer.padding,
    )


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"split_special_tokens": True},
        {
            "eos_token": "<|my_eos|>",
            "image_token": "<my_image>",
            "additional_special_tokens": ["<|extra_new|>"],
        },
    ],
)
def test_a_folder_loaded_without_its_vocabulary_says_the_same_about_everything_else(
    qwen_dir: str, tmp_path: Path, config: dict[str, Any]
) -> None:
    folder = qwen_folder(tmp_path / "t", qwen_dir, config)
    light, full = TokenizerFiles.load(folder, vocabulary=False), TokenizerFiles.load(folder)
    assert _pipeline_facts(light) == _pipeline_facts(full)
    assert light.tokenizer.get_vocab_size(with_added_tokens=False) == 0


def test_render_prefixes_renders_each_prefix_as_render_does(qwen_dir: str) -> None:
    template = TokenizerFiles.load(qwen_dir, vocabulary=False).template
    cuts = [(1, False), (3, True), (len(AGENT_TURNS), False), (len(AGENT_TURNS), True)]
    expected = [
        template.render(
            AGENT_TURNS[:length], tools=TOOLS, add_generation_prompt=prompt, enable_thinking=False
        )
        for length, prompt in cuts
    ]
    assert template.render_prefixes(AGENT_TURNS, cuts, tools=TOOLS, enable_thinking=False) == expected
    with pytest.raises(ValueError, match="empty conversation"):
        template.render_prefixes(AGENT_TURNS, [(0, True)])
    assert template.name_for(None) == template.name_for(TOOLS) == "default"


def test_split_special_tokens_encodes_them_as_text(qwen_dir: str, tmp_path: Path) -> None:
    ours, oracle = load_both(qwen_folder(tmp_path / "t", qwen_dir, {"split_special_tokens": True}))
    text = "<|im_start|>user\nhi<|im_end|>\n<think>"
    assert_same_ids(ours, oracle, text)
    assert len(ours.tokenizer.encode(text, add_special_tokens=False).ids) > 6


def test_a_pad_token_from_tokenizer_json_padding(tmp_path: Path) -> None:
    # A config without pad_token over a tokenizer.json that pads: the pad token comes from the padding.
    small = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "hi": 2}, unk_token="[UNK]"))
    small.pre_tokenizer = pre_tokenizers.Whitespace()
    small.enable_padding(pad_token="[PAD]", pad_id=0)
    small.save(str(tmp_path / "tokenizer.json"))
    config = {"tokenizer_class": "TokenizersBackend", "chat_template": "{{ pad_token }}|" + CHATML_TEMPLATE}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours, oracle = load_both(tmp_path)
    assert dict(ours.template.special_tokens) == oracle.special_tokens_map == {"pad_token": "[PAD]"}
    assert dict(ours.added_tokens) == oracle.added_tokens_decoder
    mine, theirs = both(ours, oracle, [{"role": "user", "content": "hi"}])
    assert mine == theirs and mine[1].startswith("[PAD]|")


class Colour(enum.StrEnum):
    RED = "red"


@dataclasses.dataclass
class DataclassMessage:
    role: str
    content: str | None
    extra: Any = None


class PydanticMessage(pydantic.BaseModel):
    role: str
    content: str


def test_rich_objects_reach_the_template_as_plain_data_like_transformers(
    qwen_dir: str, tmp_path: Path
) -> None:
    ours, oracle = load_both(qwen_folder(tmp_path / "t", qwen_dir, with_template(TOJSON_TEMPLATE)))
    extra = {
        "numpy": [numpy.int64(3), numpy.bool_(False), numpy.float32(1.5), numpy.str_("s")],
        "enum": Colour.RED,
        "tuple": (1, (2, 3)),
        "object": object(),
        "nested": PydanticMessage(role="r", content="c"),
    }
    messages = [DataclassMessage("user", "hi", extra), PydanticMessage(role="assistant", content="yo")]
    mine, theirs = both(ours, oracle, messages, documents=({"title": "t", "text": "x"},))
    assert mine[0] == "text" and mine == theirs
    assert '"object": "<object>"' in mine[1] and '"numpy": [3, false, 1.5, "s"]' in mine[1]


# --- errors ---------------------------------------------------------------------------------------


def test_a_folder_without_tokenizer_json_names_it(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML_TEMPLATE}))
    with pytest.raises(ValueError, match=r"no tokenizer\.json in"):
        TokenizerFiles.load(tmp_path)
    with pytest.raises(ValueError, match=r"tokenizer\.json"):
        TokenizerFiles.load(tmp_path / "missing")


def test_a_folder_without_a_template_names_every_place_it_looked(qwen_dir: str, tmp_path: Path) -> None:
    path = qwen_folder(tmp_path / "t", qwen_dir, drop=("chat_template",))
    with pytest.raises(ValueError) as raised:
        TokenizerFiles.load(path)
    for name in (
        "chat_template.jinja",
        "additional_chat_templates/*.jinja",
        "tokenizer_config.json",
        "chat_template.json",
    ):
        assert name in str(raised.value)
    assert AutoTokenizer.from_pretrained(path, local_files_only=True).chat_template is None


@pytest.mark.parametrize(
    ("config", "files", "message"),
    [
        ({"chat_template": "{% for m in messages %}"}, {}, "does not compile"),
        ({"chat_template": 7}, {}, "chat_template must be"),
        ({"bos_token": 7}, {}, "bos_token must be"),
        ({}, {"tokenizer_config.json": "{not json"}, "not valid JSON"),
    ],
)
def test_a_malformed_folder_is_a_value_error(
    qwen_dir: str, tmp_path: Path, config: dict[str, Any], files: dict[str, str], message: str
) -> None:
    path = qwen_folder(tmp_path / "t", qwen_dir, config)
    for name, text in files.items():
        (path / name).write_text(text)
    with pytest.raises(ValueError, match=message):
        TokenizerFiles.load(path)


@pytest.mark.parametrize("folder", ["qwen"], indirect=True)
@pytest.mark.parametrize(
    ("messages", "tools", "documents"),
    [
        ([], None, None),
        (["hello"], None, None),
        ([{"role": "user", "content": "hi"}], ["not a schema"], None),
        ([{"role": "user", "content": "hi"}], None, ["not a document"]),
    ],
)
def test_bad_inputs_are_refused_with_transformers_exception_types(
    pair: tuple[TokenizerFiles, PreTrainedTokenizerBase], messages: Any, tools: Any, documents: Any
) -> None:
    ours, oracle = pair
    mine = outcome(lambda: ours.template.render(messages, tools=tools, documents=documents))
    theirs = outcome(
        lambda: oracle.apply_chat_template(
            messages, tools=tools, documents=documents, add_generation_prompt=True, tokenize=False
        )
    )
    assert mine[0] == theirs[0] == "error"
    assert mine[1][0] == theirs[1][0]


@pytest.mark.parametrize("folder", ["qwen"], indirect=True)
def test_kwargs_apply_chat_template_consumes_are_refused(
    pair: tuple[TokenizerFiles, PreTrainedTokenizerBase],
) -> None:
    with pytest.raises(TypeError, match="chat_template"):
        pair[0].template.render([{"role": "user", "content": "hi"}], chat_template="x")


def test_namespace_refuses_underscore_names_like_transformers(qwen_dir: str, tmp_path: Path) -> None:
    escape = "{% set ns = namespace(_x=1) %}{{ ns }}"
    ours, oracle = load_both(qwen_folder(tmp_path / "t", qwen_dir, with_template(escape)))
    mine, theirs = both(ours, oracle, [{"role": "user", "content": "hi"}])
    assert mine == theirs and mine[1][0] == "SecurityError"


# --- compiled once, thread-safe, no transformers --------------------------------------------------


@pytest.mark.parametrize("folder", ["qwen"], indirect=True)
def test_render_compiles_nothing_and_is_thread_safe(
    pair: tuple[TokenizerFiles, PreTrainedTokenizerBase], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, _ = pair
    conversations_ = [AGENT_TURNS[: n + 1] for n in range(1, len(AGENT_TURNS))]
    want = [ours.template.render(c, tools=TOOLS) for c in conversations_]

    def no_compiling(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("render compiled a template")

    monkeypatch.setattr(ImmutableSandboxedEnvironment, "from_string", no_compiling)
    results: list[list[str]] = []
    threads = [
        threading.Thread(
            target=lambda: results.append([ours.template.render(c, tools=TOOLS) for c in conversations_])
        )
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [want] * 8


def test_template_kwargs_override_special_tokens() -> None:
    template = ChatTemplate("{{ eos_token }}|{{ messages | length }}", {"eos_token": "</s>"})
    assert template.render([{"role": "user", "content": "hi"}]) == "</s>|1"
    assert template.render([{"role": "user", "content": "hi"}], eos_token="<e>") == "<e>|1"


def test_loading_and_rendering_never_imports_transformers(qwen_dir: str) -> None:
    code = (
        "import sys\n"
        "from modeltap.counting.tokenizer_files import TokenizerFiles\n"
        "files = TokenizerFiles.load(sys.argv[1])\n"
        "text = files.template.render([{'role': 'user', 'content': 'hi'}])\n"
        "files.tokenizer.encode(text, add_special_tokens=False)\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] in ('transformers', 'torch')))\n"
    )
    run = subprocess.run([sys.executable, "-c", code, qwen_dir], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"

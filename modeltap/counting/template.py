"""A model's chat template, rendered without transformers.

Owns: rendering one conversation byte for byte as `apply_chat_template(..., tokenize=False)` does,
in transformers' sandboxed Jinja environment. Does not own: reading a tokenizer folder
(tokenizer_files.py), counting (counter.py), turning a request body into messages (the dialects),
converting Python functions into tool schemas (transformers' `get_json_schema`: tools arrive as JSON
schema dicts), batches of conversations, `continue_final_message`, assistant-token masks, or
`sanitize_control_tokens`.

It needs jinja2 only (with tokenizer_files.py, `tokenizers` too): a fresh process holding the Qwen3
tokenizer takes about 110 MB of RSS this way against about 180 MB through AutoTokenizer, which also
imports numpy and half of transformers. transformers remains the oracle of the tests.

    template = ChatTemplate(source, {"eos_token": "<|im_end|>"})
    text = template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)

Reproduces transformers v5.24.0 (the version this was checked against; every citation below is a file
under https://github.com/huggingface/transformers/blob/v5.24.0/src/transformers/). What it cannot
reproduce is what a model-specific tokenizer class does in code: the defaults of its `__init__`
(Qwen2Tokenizer passes `unk_token="<|endoftext|>"` to templates when the config has no `unk_token`
key), a backend it rebuilds from vocab and merges instead of loading tokenizer.json, Mistral's regex
patch, the legacy `added_tokens.json`, and versioned `fast_tokenizer_files`.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.runtime
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The template a name-less template, or a folder's chat_template.jinja, is stored under; and the one
# transformers picks instead when tools are passed and the folder has it (`get_chat_template`).
DEFAULT_TEMPLATE = "default"
TOOL_USE_TEMPLATE = "tool_use"

# The names a message's reasoning arrives under; templates read the first, gpt-oss's read "thinking",
# and transformers fills both from whichever is set (`_alias_reasoning_fields`).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

# `apply_chat_template`'s own parameters, which it consumes instead of passing them to the template:
# a template kwarg by one of these names would mean something else to transformers, so `render`
# refuses it rather than render what transformers would not. "conversations" is
# `render_jinja_template`'s, where transformers raises a TypeError for it too.
APPLY_CHAT_TEMPLATE_PARAMETERS = frozenset(
    {
        "conversation",
        "conversations",
        "chat_template",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)

# Values templates see unchanged; anything else is rebuilt from these (`_plain_template_data`).
_JSON_SCALAR_TYPES = (str, int, float, bool)


class ChatTemplate:
    """A tokenizer's chat templates, compiled once, rendering as transformers' `apply_chat_template`.

    `templates` maps a name to Jinja source (one template is named "default"); `special_tokens` are
    the variables transformers passes every template (`bos_token`, `eos_token`, ...). Immutable and
    thread-safe: `render` may run in several threads at once.
    """

    __slots__ = ("_compiled", "_special_tokens", "_templates")

    def __init__(self, templates: str | Mapping[str, str], special_tokens: Mapping[str, str]) -> None:
        """Raises ValueError when a template does not compile."""
        named = {DEFAULT_TEMPLATE: templates} if isinstance(templates, str) else dict(templates)
        self._templates = types.MappingProxyType(named)
        self._special_tokens = types.MappingProxyType(dict(special_tokens))
        # transformers compiles each template on first use; compiling here fails at start instead of
        # at the first request, and leaves nothing to compile (or lock) while rendering.
        self._compiled = {name: _compile(name, source) for name, source in named.items()}

    @property
    def templates(self) -> Mapping[str, str]:
        """The Jinja source of each template, by name."""
        return self._templates

    @property
    def special_tokens(self) -> Mapping[str, str]:
        """The special-token variables every template sees, by name."""
        return self._special_tokens

    def source(self, tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The template `render` uses with these tools, as transformers' `get_chat_template` picks it."""
        return self._templates[self.name_for(tools)]

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text of one conversation: `apply_chat_template(messages, tools=tools,
        documents=documents, add_generation_prompt=..., tokenize=False, **template_kwargs)`.

        `template_kwargs` reach the template as variables, over the special tokens of the same name.
        Like transformers, it hands the template plain copies of its inputs (a dataclass or pydantic
        message becomes a dict, keys whose value is None are dropped from each message) and never
        changes the caller's.

        Raises ValueError (no template for these tools, an empty conversation, a tool that is not a
        dict), TypeError (a message or document that is not a mapping, a kwarg transformers consumes
        itself), or jinja2.TemplateError (the template refused the conversation: `raise_exception`).
        """
        cut = (len(messages), add_generation_prompt)
        return self.render_prefixes(messages, [cut], tools=tools, documents=documents, **template_kwargs)[0]

    def render_prefixes(
        self,
        messages: Sequence[Mapping[str, Any]],
        cuts: Sequence[tuple[int, bool]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> list[str]:
        """`render(messages[:length], add_generation_prompt=prompt, ...)` for each (length, prompt) of
        `cuts`, converting the inputs once: what comparing the renders of one growing conversation
        costs without copying its tools for each. Raises as `render` does (ValueError for an empty
        prefix)."""
        consumed = APPLY_CHAT_TEMPLATE_PARAMETERS.intersection(template_kwargs)
        if consumed:
            raise TypeError(
                f"apply_chat_template consumes {sorted(consumed)} itself; they are not template kwargs"
            )
        template = self._compiled[self.name_for(tools)]
        chat = _conversation(messages)
        schemas, context = _tool_schemas(tools), _template_data({**self._special_tokens, **template_kwargs})
        renders = []
        for length, prompt in cuts:
            _refuse_empty(chat[:length])
            # The sandbox lets no template change a list or dict, so the renders share the copies.
            renders.append(
                template.render(
                    messages=chat[:length],
                    tools=schemas,
                    documents=_documents(documents),
                    add_generation_prompt=prompt,
                    **context,
                )
            )
        return renders

    def name_for(self, tools: Sequence[Mapping[str, Any]] | None) -> str:
        """The name of the template `render` uses with these tools. Raises ValueError where none is
        named "default" and no tool_use one applies."""
        # transformers asks `tools is not None`, so an empty list still picks the tool_use template.
        if tools is not None and TOOL_USE_TEMPLATE in self._templates:
            return TOOL_USE_TEMPLATE
        if DEFAULT_TEMPLATE in self._templates:
            return DEFAULT_TEMPLATE
        raise ValueError(
            "this tokenizer has several chat templates and none named 'default' (templates: "
            f"{sorted(self._templates)}); transformers refuses to pick one"
        )


# --- the Jinja environment (utils/chat_template_utils.py `_cached_compile_jinja_template`) ------------


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`, which marks the assistant's tokens for
    `return_assistant_tokens_mask`. Rendering never tracks them, so the tag renders its body as
    transformers' AssistantTracker does when tracking is off."""

    tags = {"generation"}  # noqa: RUF012 -- jinja2 declares Extension.tags as an instance-level set

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        block = jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body)
        block.set_lineno(lineno)
        return block

    def _body(self, caller: jinja2.runtime.Macro) -> str:
        return str(caller())


class _TemplateDict:
    """`dict` inside templates: construction only, so a template cannot reach dict's attributes."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace()` inside templates, refusing underscore names that lead to CPython internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        # No named `self`, as in jinja2's Namespace, so that `namespace(self=...)` still works.
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(
                "Chat templates cannot store underscore-prefixed attributes on a namespace, "
                f"but got {name!r}. Please rename the attribute."
            )


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters and takes only `indent`; transformers' keeps the text.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:  # transformers' parameter name, which a template may pass by keyword
    return datetime.now().strftime(format)


def _compile(name: str, source: str) -> jinja2.Template:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.globals["dict"] = _TemplateDict()
    environment.globals["namespace"] = _TemplateNamespace
    try:
        return environment.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"the chat template {name!r} does not compile: {exc}") from exc


# --- what the template sees (utils/chat_template_utils.py `render_jinja_template`) -----------------


def _conversation(messages: Sequence[Mapping[str, Any]]) -> list[dict[Any, Any]]:
    """The messages as plain data, without None-valued keys, with the reasoning aliases filled in
    (`_normalize_chat_messages`, then `_plain_template_data` and `_alias_reasoning_fields`)."""
    _refuse_empty(messages)
    chat = []
    for message in messages:
        data = _template_data(message)
        if not isinstance(data, dict):
            raise TypeError(
                f"Chat messages should be dicts, dataclasses or pydantic models, but got {message!r}."
            )
        # Clients send `content: null` or `tool_calls: null`; templates handle a missing key instead.
        chat.append(_with_reasoning_aliases({key: value for key, value in data.items() if value is not None}))
    return chat


def _refuse_empty(messages: Sequence[Any]) -> None:
    if len(messages) == 0:
        raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")


def _with_reasoning_aliases(message: dict[Any, Any]) -> dict[Any, Any]:
    reasoning = next((message[key] for key in REASONING_FIELDS if message.get(key) is not None), None)
    if reasoning is None:
        return message
    # The key order is transformers' too: a template that prints the message shows it.
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _tool_schemas(tools: Sequence[Mapping[str, Any]] | None) -> Any:
    if tools is None:
        return None
    for tool in tools:
        if not isinstance(tool, dict):
            raise ValueError(
                f"a tool must be a JSON schema dict (functions are not converted here), got {tool!r}"
            )
    return _template_data(list(tools))


def _documents(documents: Sequence[Mapping[str, Any]] | None) -> Any:
    for document in documents or ():
        if not isinstance(document, dict):
            raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
    return _template_data(documents)


def _template_data(value: Any) -> Any:
    """`value` rebuilt from plain JSON types, as transformers' `_plain_template_data` does: the sandbox
    does not know which methods of a rich object are dangerous, so templates never see one."""
    kind = type(value)
    if value is None or kind in _JSON_SCALAR_TYPES:
        return value
    # JSON's own containers first, by exact type: the ABC checks below cost more than the copy.
    if kind is dict:
        return {_template_data(key): _template_data(item) for key, item in value.items()}
    if kind is list:
        return [_template_data(item) for item in value]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_template_data(key): _template_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_template_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_template_data(item) for item in value)
    # A numpy scalar can only exist once numpy is imported, so looking it up costs no import.
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic):
        return _template_data(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _template_data(getattr(value, field.name)) for field in dataclasses.fields(value)}
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        return _template_data(model_dump())
    return f"<{type(value).__name__}>"

"""A model's chat template and tokenizer, read from its tokenizer folder without transformers.

Owns: finding a folder's chat templates and the special tokens templates see, the way
`AutoTokenizer.from_pretrained` does; rendering one conversation byte for byte as
`apply_chat_template(..., tokenize=False)` does; and loading `tokenizer.json` as a `tokenizers.Tokenizer`
with the added tokens transformers declares on top of it (or, with `vocabulary=False`, its pipeline
without a BPE vocabulary, read through tokenizer_json.py). Does not own: counting (tokens.py), turning a
request body into messages (compat/prompts.py), converting Python functions into tool schemas
(transformers' `get_json_schema`: tools arrive as JSON schema dicts), batches of conversations,
`continue_final_message`, assistant-token masks, or `sanitize_control_tokens`.

It needs jinja2 and `tokenizers` only: a fresh process holding the Qwen2.5 tokenizer takes about 110 MB
of RSS this way against about 180 MB through AutoTokenizer, which also imports numpy and half of
transformers. transformers remains the oracle of the tests.

    files = TokenizerFiles.load("/models/qwen2.5")
    text = files.template.render([{"role": "user", "content": "hi"}], enable_thinking=False)
    files.tokenizer.encode(text, add_special_tokens=False).ids

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
import os
import sys
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.runtime
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer

from modeltap.proxy.tokenizer_json import TokenizerJson

# The files transformers reads a tokenizer folder's chat templates and special tokens from
# (utils/hub.py, tokenization_utils_base.py `from_pretrained`).
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
# A processor's legacy template file. AutoTokenizer never reads it (only AutoProcessor does,
# processing_utils.py): it is used here only when the folder has no tokenizer template at all, where
# AutoTokenizer would have none and a server would fall back on the processor's.
PROCESSOR_CHAT_TEMPLATE_FILE = "chat_template.json"

# The template a name-less template, or a folder's chat_template.jinja, is stored under; and the one
# transformers picks instead when tools are passed and the folder has it (`get_chat_template`).
DEFAULT_TEMPLATE = "default"
TOOL_USE_TEMPLATE = "tool_use"

# The named special tokens every template sees, in this order (PreTrainedTokenizerBase's
# SPECIAL_TOKENS_ATTRIBUTES). Since v5 the `extra_special_tokens` (formerly `additional_special_tokens`)
# list is not among them; model-specific `*_token` keys such as `image_token` are, after these.
NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
SPECIAL_TOKEN_SUFFIX = "_token"

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


@dataclass(frozen=True, slots=True)
class TokenizerFiles:
    """What modeltap needs from a tokenizer folder, in place of a transformers tokenizer object.

    `template` renders prompts (`tokenizer.apply_chat_template`), `tokenizer` encodes them
    (`tokenizer.backend_tokenizer`), and `added_tokens` maps an id to its added token with the
    `content`, `special`, `lstrip`, `rstrip`, `single_word` and `normalized` flags
    (`tokenizer.added_tokens_decoder`).
    """

    template: ChatTemplate
    tokenizer: Tokenizer
    added_tokens: Mapping[int, AddedToken]

    @classmethod
    def load(cls, directory: str | os.PathLike[str], *, vocabulary: bool = True) -> TokenizerFiles:
        """Read a local tokenizer folder: tokenizer.json, tokenizer_config.json and the chat template
        files. Raises ValueError naming the files it looked for when tokenizer.json or every chat
        template is missing, or when a file is malformed.

        `vocabulary=False` leaves out a BPE model's vocabulary and merges: `tokenizer` is then the
        pipeline around an empty model, which knows the added tokens, the normaliser, pre-tokenizer
        and post-processor (`num_special_tokens_to_add`) and encodes nothing else. That is what a
        caller reading the vocabulary itself needs (bpe.py), without the ~80 MB Qwen2.5's takes in
        the tokenizers library.
        """
        folder = Path(directory)
        tokenizer_path = folder / TOKENIZER_FILE
        if not tokenizer_path.is_file():
            raise ValueError(f"no {TOKENIZER_FILE} in {folder}: modeltap needs a fast (tokenizers) tokenizer")
        config = _read_json_object(folder / TOKENIZER_CONFIG_FILE)
        templates = _find_templates(folder, config)
        tokenizer = _read_tokenizer(tokenizer_path) if vocabulary else _read_pipeline(tokenizer_path)
        named, extra = _special_tokens(folder, config, tokenizer.padding)
        _declare_added_tokens(tokenizer, config, named, extra)
        # `split_special_tokens` makes transformers encode special tokens' text as ordinary text.
        tokenizer.encode_special_tokens = bool(config.get("split_special_tokens", False))
        return cls(
            template=ChatTemplate(templates, {key: _content(token) for key, token in named.items()}),
            tokenizer=tokenizer,
            added_tokens=types.MappingProxyType(tokenizer.get_added_tokens_decoder()),
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


# --- reading the folder (tokenization_utils_base.py `from_pretrained` and `_from_pretrained`) -------


def _find_templates(folder: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """The folder's templates by name. Template files replace the config's templates altogether."""
    templates: dict[str, str] = {}
    single = folder / CHAT_TEMPLATE_FILE
    if single.is_file():
        templates[DEFAULT_TEMPLATE] = _read_text(single)
    extra = folder / CHAT_TEMPLATE_DIR
    if extra.is_dir():
        for path in sorted(extra.glob("*.jinja")):
            templates[path.name.removesuffix(".jinja")] = _read_text(path)
    if templates:
        return templates
    configured = config.get("chat_template")
    if configured is not None:
        return _configured_templates(configured, folder / TOKENIZER_CONFIG_FILE)
    processor_template = _read_json_object(folder / PROCESSOR_CHAT_TEMPLATE_FILE).get("chat_template")
    if isinstance(processor_template, str):
        return {DEFAULT_TEMPLATE: processor_template}
    raise ValueError(
        f"no chat template in {folder}: looked for {CHAT_TEMPLATE_FILE}, {CHAT_TEMPLATE_DIR}/*.jinja, "
        f"the chat_template field of {TOKENIZER_CONFIG_FILE} and {PROCESSOR_CHAT_TEMPLATE_FILE}"
    )


def _configured_templates(configured: Any, path: Path) -> dict[str, str]:
    """tokenizer_config.json's `chat_template`: one template, a list of {name, template} (how
    transformers saves several), or a name-to-template object (which it also accepts)."""
    if isinstance(configured, str):
        return {DEFAULT_TEMPLATE: configured}
    if isinstance(configured, dict) and all(isinstance(source, str) for source in configured.values()):
        return dict(configured)
    if isinstance(configured, list) and all(
        isinstance(entry, dict)
        and isinstance(entry.get("name"), str)
        and isinstance(entry.get("template"), str)
        for entry in configured
    ):
        return {entry["name"]: entry["template"] for entry in configured}
    raise ValueError(f"{path}: chat_template must be a string or a list of {{name, template}} objects")


def _special_tokens(
    folder: Path, config: Mapping[str, Any], padding: Mapping[str, Any] | None
) -> tuple[dict[str, str | AddedToken], list[str | AddedToken]]:
    """(the named special tokens in transformers' order, the extra special tokens), each a string or
    an AddedToken as transformers holds them.

    Mirrors `_from_pretrained`, then `PreTrainedTokenizerBase.__init__`: a custom `*_token` key with a
    string value, or an `extra_special_tokens` dict, declares a model-specific token at once; a custom
    key holding a serialised AddedToken is found later, and comes first.
    """
    kwargs = dict(config)
    if "additional_special_tokens" in kwargs and not kwargs.get("extra_special_tokens"):
        kwargs["extra_special_tokens"] = kwargs.pop("additional_special_tokens")
    declared = {
        key: kwargs.pop(key) for key in list(kwargs) if _is_custom(key) and isinstance(kwargs[key], str)
    }
    declared.update(_pop_extra_dict(kwargs))
    if "added_tokens_decoder" not in config:
        # A config saved before transformers 4.34 keeps its special tokens in the legacy file too.
        _merge_legacy_special_tokens(kwargs, folder / SPECIAL_TOKENS_MAP_FILE)
        declared.update(_pop_extra_dict(kwargs))
    if "additional_special_tokens" in kwargs and "extra_special_tokens" not in kwargs:
        kwargs["extra_special_tokens"] = kwargs.pop("additional_special_tokens")
    if padding is not None and "pad_token" not in kwargs:
        # TokenizersBackend takes the pad token from tokenizer.json's padding when the config has none.
        kwargs["pad_token"] = padding["pad_token"]
    where = folder / TOKENIZER_CONFIG_FILE
    named = {
        key: _token(kwargs[key], where, key) for key in NAMED_SPECIAL_TOKENS if kwargs.get(key) is not None
    }
    found_later = {
        key: value
        for key, value in kwargs.items()
        if _is_custom(key) and (isinstance(value, str) or _is_added_token_dict(value))
    }
    named.update((key, _token(value, where, key)) for key, value in {**found_later, **declared}.items())
    extra = [
        _token(value, where, "extra_special_tokens") for value in kwargs.get("extra_special_tokens") or ()
    ]
    return named, extra


def _is_custom(key: str) -> bool:
    return key.endswith(SPECIAL_TOKEN_SUFFIX) and key not in NAMED_SPECIAL_TOKENS


def _pop_extra_dict(kwargs: dict[str, Any]) -> dict[str, Any]:
    extra = kwargs.get("extra_special_tokens")
    return dict(kwargs.pop("extra_special_tokens")) if isinstance(extra, dict) else {}


def _merge_legacy_special_tokens(kwargs: dict[str, Any], path: Path) -> None:
    """special_tokens_map.json over the config, its token objects marked special, as transformers
    merges it."""
    for key, value in _read_json_object(path).items():
        if isinstance(value, dict) and key != "extra_special_tokens":
            value = _legacy_token(value)
        elif key == "extra_special_tokens" and isinstance(value, list):
            existing = list(kwargs.get("extra_special_tokens") or ())
            value = existing + [token for token in map(_legacy_token, value) if token not in existing]
        kwargs[key] = value


def _legacy_token(value: Any) -> Any:
    return {**value, "__type": "AddedToken", "special": True} if isinstance(value, dict) else value


def _is_added_token_dict(value: Any) -> bool:
    return isinstance(value, dict) and value.get("__type") == "AddedToken"


def _token(value: Any, where: Path, key: str) -> str | AddedToken:
    """A special token as transformers holds it: a string, or an AddedToken from a serialised one.

    transformers reads a dict as an AddedToken only with its `"__type": "AddedToken"` marker; any dict
    with a "content" string is read as one here.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return AddedToken(**{name: item for name, item in value.items() if name != "__type"})
    raise ValueError(f"{where}: {key} must be a string or an AddedToken object, got {value!r}")


def _content(token: str | AddedToken) -> str:
    return token if isinstance(token, str) else token.content


def _declare_added_tokens(
    tokenizer: Tokenizer,
    config: Mapping[str, Any],
    named: Mapping[str, str | AddedToken],
    extra: Sequence[str | AddedToken],
) -> None:
    """Add the tokens TokenizersBackend.__init__ adds to tokenizer.json's (tokenization_utils_tokenizers.py):
    the config's `added_tokens_decoder` in id order (its flags win over tokenizer.json's), then each
    special token the tokenizer does not have yet, which would otherwise be split like text."""
    declared: list[str | AddedToken] = [
        AddedToken(**spec)
        for _, spec in sorted(
            (int(index), spec) for index, spec in config.get("added_tokens_decoder", {}).items()
        )
    ]
    known = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
    known.update(_content(token) for token in declared)
    for token in [*named.values(), *extra]:
        if _content(token) not in known and token not in declared:
            declared.append(token)
    named_contents = {_content(token) for token in named.values()}
    tokens = [_as_added_token(token, named_contents) for token in declared]
    if tokens:
        tokenizer.add_tokens(tokens)


def _as_added_token(token: str | AddedToken, named_contents: set[str]) -> AddedToken:
    if isinstance(token, str):
        return AddedToken(token, special=True)
    if not token.special and token.content in named_contents:
        token.special = True
    return token


def _read_tokenizer(path: Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise ValueError(f"{path} is not a tokenizers file: {exc}") from exc


def _read_pipeline(path: Path) -> Tokenizer:
    """tokenizer.json with its BPE vocabulary and merges left empty, never held whole in memory."""
    with TokenizerJson.read(path) as document:
        spec = document.spec
    try:
        return Tokenizer.from_str(json.dumps(spec))
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise ValueError(f"{path} is not a tokenizers file: {exc}") from exc


def _read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from `path`, or {} when there is no such file."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return value


def _read_text(path: Path) -> str:
    # Text mode, as transformers opens template files: "\r\n" in a .jinja file reads as "\n".
    return path.read_text(encoding="utf-8")

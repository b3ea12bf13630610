"""A model's tokenizer folder, read the way `AutoTokenizer.from_pretrained` reads it, without
transformers.

Owns: finding a folder's chat templates and the special tokens templates see, and loading
`tokenizer.json` as a `tokenizers.Tokenizer` with the added tokens transformers declares on top of it
(or, with `vocabulary=False`, its pipeline without a BPE vocabulary, read through tokenizer_json.py).
Does not own: rendering a template (template.py) or counting (counter.py).

    files = TokenizerFiles.load("/models/qwen2.5")
    text = files.template.render([{"role": "user", "content": "hi"}], enable_thinking=False)
    files.tokenizer.encode(text, add_special_tokens=False).ids

Reproduces transformers v5.24.0 (every citation below is a file under
https://github.com/huggingface/transformers/blob/v5.24.0/src/transformers/); what it cannot reproduce
is listed in template.py.
"""

from __future__ import annotations

import json
import os
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

from modeltap.counting.template import DEFAULT_TEMPLATE, ChatTemplate
from modeltap.counting.tokenizer_json import TokenizerJson

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
        caller reading the vocabulary itself needs (bpe.py), without the ~80 MB Qwen3's takes in
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

"""A tokenizer folder loaded for counting, and the loaded folders one process shares.

Owns: what the counter needs from a tokenizer folder (LoadedTokenizer: the chat template, the pieces'
encoder and cache, the proofs of its windows, the reference encode the sampled checks use), which
encoder it trusts (tiktoken where bpe.py proves it exact, else the tokenizers library), whether pieces
between added tokens may be counted apart, finding a model name in the local Hugging Face cache, and
the process's loaded folders (SHARED). Does not own counting (counter.py) or reading the files
(template.py, tokenizer_json.py, bpe.py).

    loaded = SHARED.get(resolve("/models/qwen2.5"), cache_max_chars=SEGMENT_CACHE_MAX_CHARS)
    loaded.encoder, loaded.segments, loaded.template
"""

from __future__ import annotations

import functools
import json
import os
import threading
import types
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from modeltap.counting import bpe
from modeltap.counting.segments import Segments
from modeltap.counting.template import ChatTemplate
from modeltap.counting.tokenizer_files import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, TokenizerFiles
from modeltap.counting.tokenizer_json import TokenizerJson
from modeltap.counting.windows import AppendStability

# Piece counts kept, by the pieces' characters: the openings many conversations share (system prompt,
# tools) and each conversation's last pieces. 4M characters is ~4 MB of ASCII.
SEGMENT_CACHE_MAX_CHARS = 4_000_000

# Loaded tokenizers a process keeps for reuse: a process serves one model per upstream, and tests load
# a handful of folders. A dropped one lives on in the counters that hold it.
SHARED_TOKENIZERS_MAX = 4

# Where the Hugging Face hub keeps downloaded models, by precedence
# (https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables), and its layout
# (https://huggingface.co/docs/huggingface_hub/guides/manage-cache): models--ORG--NAME/refs/main holds
# the commit whose files are in snapshots/COMMIT/.
_HUB_CACHE_ENV = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")


@dataclass(frozen=True, slots=True, eq=False)
class LoadedTokenizer:
    """A tokenizer folder loaded for counting: the chat template, the pieces' encoder and cache, and
    the one-time proofs of its windows. Shared by every counter of the process on that folder, and by
    what renders or builds token ids (ids.py, continuation.py): `encode_ids` gives the ids of text as
    the tokenizer encodes it (added tokens recognised, nothing added around it), `token_bytes` the
    bytes an id stands for (None where ids cannot be decoded byte for byte: a tokenizer that is not
    byte-level BPE), `added_ids` each added token's id, `special_tokens` the added tokens marked special
    (those an engine leaves out of a reply's text: `<|im_end|>`, not `<think>` or `<tool_call>`)."""

    folder: Path
    template: ChatTemplate
    encoder: str
    # None where pieces between added tokens do not encode as in the whole text.
    segments: Segments | None
    stability: AppendStability
    # Tokens the post-processor adds to a completions prompt (BOS).
    special_tokens_added: int
    reference_count: Callable[[str], int]
    string_content: Mapping[str, bool]
    encode_ids: Callable[[str], list[int]]
    token_bytes: Callable[[int], bytes] | None
    added_ids: Mapping[str, int]
    special_tokens: frozenset[str]

    @classmethod
    def load(cls, folder: Path, cache_max_chars: int = SEGMENT_CACHE_MAX_CHARS) -> LoadedTokenizer:
        """Load a tokenizer folder. Raises ValueError naming the fix when it has no usable tokenizer."""
        try:
            light = TokenizerFiles.load(folder, vocabulary=False)
        except ValueError:
            # A model with no vocabulary cannot be built empty (WordPiece wants its unknown token):
            # loading it whole says what, if anything, is wrong with the folder.
            light = TokenizerFiles.load(folder)
        pipeline = json.loads(light.tokenizer.to_str())  # small for BPE: no vocabulary
        splittable = _segments_are_exact(pipeline, light)
        added = [token.content for token in light.added_tokens.values()]
        fast = bpe.exact_tiktoken(folder / TOKENIZER_FILE, light.tokenizer, added) if splittable else None
        files = light if fast is not None else TokenizerFiles.load(folder)
        backend = files.tokenizer

        def piece(text: str) -> list[int]:
            return list(backend.encode(text, add_special_tokens=False).ids)

        # The vocabulary-less pipeline numbers its added tokens from 0: their ids are read from the files.
        added_ids = _added_ids(folder, added) if fast is not None else None
        if fast is not None and added_ids is None:
            fast, files = None, TokenizerFiles.load(folder)
            backend = files.tokenizer
        if added_ids is None:
            added_ids = {token.content: index for index, token in files.added_tokens.items()}
        encode = fast.encode if fast is not None else piece
        segments = Segments(added, encode, cache_max_chars) if splittable else None
        if fast is not None and segments is not None:
            reference = segments.encode_count
            encode_ids = functools.partial(segments.ids, added_ids=added_ids, encode=fast.encode)
            token_bytes: Callable[[int], bytes] | None = _with_added(fast.token_bytes, added_ids)
        else:
            reference = functools.partial(_encoded_length, backend)
            encode_ids = functools.partial(_encoded_ids, backend)
            token_bytes = _byte_level_bytes(backend, pipeline)
        names = files.template.templates
        return cls(
            folder=folder,
            template=files.template,
            encoder="tiktoken" if fast is not None else "tokenizers",
            segments=segments,
            stability=AppendStability(files.template),
            special_tokens_added=backend.num_special_tokens_to_add(False),
            reference_count=reference,
            string_content={name: _template_wants_string_content(source) for name, source in names.items()},
            encode_ids=encode_ids,
            token_bytes=token_bytes,
            added_ids=types.MappingProxyType(added_ids),
            special_tokens=frozenset(t.content for t in files.added_tokens.values() if t.special),
        )


class SharedTokenizers:
    """The loaded tokenizers of one process, by resolved folder and load options.

    One per process (`SHARED`, owned by this module): the proxies of one process (the adapter's
    per-process proxy, tests) load a folder once. Bounded at SHARED_TOKENIZERS_MAX, the least
    recently used dropped first; a changed tokenizer.json or tokenizer_config.json is loaded anew.
    Thread-safe: loads run one at a time.
    """

    def __init__(self, max_entries: int) -> None:
        self._max_entries = max_entries
        self._loaded: OrderedDict[tuple[Any, ...], LoadedTokenizer] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, folder: Path, cache_max_chars: int) -> LoadedTokenizer:
        """The folder loaded, from this process's cache when it is there."""
        key = (folder, cache_max_chars, *(_signature(folder / name) for name in _SIGNED_FILES))
        with self._lock:
            loaded = self._loaded.get(key)
            if loaded is None:
                loaded = LoadedTokenizer.load(folder, cache_max_chars)
                self._loaded[key] = loaded
                while len(self._loaded) > self._max_entries:
                    self._loaded.popitem(last=False)
            self._loaded.move_to_end(key)
            return loaded

    def clear(self) -> None:
        """Forget every loaded tokenizer (counters keep theirs)."""
        with self._lock:
            self._loaded.clear()


SHARED = SharedTokenizers(SHARED_TOKENIZERS_MAX)
_SIGNED_FILES = (TOKENIZER_FILE, "tokenizer_config.json", "chat_template.jinja")


def resolve(path_or_name: str | os.PathLike[str]) -> Path:
    """A tokenizer folder: `path_or_name` itself, or the snapshot of that model name in the local
    Hugging Face hub cache. Raises ValueError when neither exists (modeltap never downloads)."""
    path = Path(path_or_name).expanduser()
    if path.is_dir():
        return path.resolve()
    name = str(path_or_name)
    snapshot = _hub_snapshot(name) if name.count("/") == 1 and not path.is_absolute() else None
    if snapshot is not None:
        return snapshot
    raise ValueError(
        f"no tokenizer at {name!r}: give a local folder with tokenizer.json and tokenizer_config.json, "
        "or a name already in the local Hugging Face cache (modeltap never downloads one)"
    )


def _hub_snapshot(name: str) -> Path | None:
    """The folder of `name`'s main revision in the hub cache, else its newest snapshot with a
    tokenizer.json."""
    repo = _hub_cache() / ("models--" + name.replace("/", "--"))
    main = repo / "refs" / "main"
    if main.is_file():
        snapshot = repo / "snapshots" / main.read_text().strip()
        if (snapshot / TOKENIZER_FILE).is_file():
            return snapshot.resolve()
    found = [p for p in (repo / "snapshots").glob("*") if (p / TOKENIZER_FILE).is_file()]
    return max(found, key=lambda p: p.stat().st_mtime).resolve() if found else None


def _hub_cache() -> Path:
    for variable in _HUB_CACHE_ENV:
        if os.environ.get(variable):
            return Path(os.environ[variable]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    cache = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(cache).expanduser() / "huggingface" / "hub"


def _signature(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def _encoded_length(backend: Any, text: str) -> int:
    return len(backend.encode(text, add_special_tokens=False).ids)


def _added_ids(folder: Path, added: list[str]) -> dict[str, int] | None:
    """Each added token's id, as tokenizer.json and tokenizer_config.json's `added_tokens_decoder`
    declare them (the config's win, as in transformers); None when a token is declared in neither (one
    transformers adds from the special tokens alone gets its id from the vocabulary's size)."""
    with TokenizerJson.read(folder / TOKENIZER_FILE) as document:
        listed = document.spec.get("added_tokens")
    ids = {
        t["content"]: t["id"] for t in listed or [] if isinstance(t, dict) and isinstance(t.get("id"), int)
    }
    try:
        config = json.loads((folder / TOKENIZER_CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    for index, spec in (config.get("added_tokens_decoder") or {}).items():
        if isinstance(spec, dict) and isinstance(spec.get("content"), str) and str(index).isdigit():
            ids[spec["content"]] = int(index)
    return ids if all(token in ids for token in added) else None


def _encoded_ids(backend: Any, text: str) -> list[int]:
    return list(backend.encode(text, add_special_tokens=False).ids)


def _with_added(token_bytes: Callable[[int], bytes], added_ids: Mapping[str, int]) -> Callable[[int], bytes]:
    """`token_bytes` for tiktoken's ids, and each added token's text for its id."""
    added = {index: content.encode() for content, index in added_ids.items()}

    def decode(token: int) -> bytes:
        found = added.get(token)
        return found if found is not None else token_bytes(token)

    return decode


def _byte_level_bytes(backend: Any, pipeline: Mapping[str, Any]) -> Callable[[int], bytes] | None:
    """Each id's bytes through the tokenizers library, for a byte-level BPE (GPT-2's byte-to-character
    map, https://github.com/huggingface/tokenizers/blob/v0.23.0/tokenizers/src/pre_tokenizers/byte_level.rs);
    None for any other decoder, whose ids are not bytes."""
    decoder = pipeline.get("decoder") or {}
    kinds = (
        {step.get("type") for step in decoder.get("decoders", [decoder])}
        if isinstance(decoder, dict)
        else set()
    )
    if "ByteLevel" not in kinds:
        return None
    to_byte = {char: byte for byte, char in bpe.bytes_to_unicode().items()}
    added: dict[int, bytes] = {
        i: token.content.encode() for i, token in backend.get_added_tokens_decoder().items()
    }

    def decode(token: int) -> bytes:
        found = added.get(token)
        if found is not None:
            return found
        piece: str | None = backend.id_to_token(token)
        if piece is None:
            raise ValueError(f"token id {token} is not in the vocabulary")
        return bytes(to_byte[char] for char in piece)

    return decode


def _template_wants_string_content(template: str) -> bool:
    """Whether the template expects string content rather than a list of parts: SGLang's detection
    (sglang/srt/parser/jinja_template_utils.py), which vLLM's also follows. A template naming media,
    or looping over `message.content` (or `msg.content`, `m.content`), takes parts."""
    if any(word in template for word in ("image", "audio", "video", "vision")):
        return False
    try:
        ast = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return True
    for loop in ast.find_all(jinja2.nodes.For):
        node: jinja2.nodes.Node | None = loop.iter
        while isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test)) or (
            isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice)
        ):
            node = node.node
        if _is_content_of_message(node):
            return False
    return True


def _is_content_of_message(node: jinja2.nodes.Node | None) -> bool:
    if isinstance(node, jinja2.nodes.Getattr):
        owner, key = node.node, node.attr
    elif isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Const):
        owner, key = node.node, node.arg.value
    else:
        return False
    return key == "content" and isinstance(owner, jinja2.nodes.Name) and owner.name in ("message", "msg", "m")


def _segments_are_exact(pipeline: dict[str, Any], files: TokenizerFiles) -> bool:
    """Whether counting the pieces between added tokens separately gives the whole text's count.

    `tokenizers` splits at added tokens first and then normalises and pre-tokenizes each piece on its
    own, so this holds unless an added token strips whitespace from its neighbours, is only matched
    after normalisation, or a step depends on where a piece sits in the whole text (Metaspace's
    "first" prefix, a Prepend normaliser); and not where `split_special_tokens` encodes special
    tokens as text. The conditions SGLang's segment encoder checks (docs/token-budgets.md §5.4).
    """
    if files.tokenizer.encode_special_tokens:
        return False
    for token in files.added_tokens.values():
        if token.lstrip or token.rstrip or token.single_word:
            return False
        if token.normalized and pipeline.get("normalizer") is not None:
            return False
    text = json.dumps([pipeline.get("normalizer"), pipeline.get("pre_tokenizer")])
    return '"Metaspace"' not in text and '"Prepend"' not in text

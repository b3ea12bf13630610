"""Exact prompt counting: how many tokens the served model sees for a request body.

Owns: rendering a request's prompt (as its dialect extracts it) with the tokenizer's own chat
template, after the backend's normalisation (compat/prompts.py), and counting its tokens fast and
exactly. Does not own: what a format's prompt is (modeltap.dialects), the limits or what to do when a
prompt does not fit (budget.py), nor running the count off the event loop (budget.py calls `count`
through `asyncio.to_thread`).

How a count is made (docs/token-budgets.md §5):
1. the prompt is normalised the way the backend does it (compat/prompts.py) and rendered with
   `apply_chat_template(..., tokenize=False)`, the render every server does too and most of a
   cached count's cost;
2. the text is split at the tokenizer's added tokens (`<|im_start|>`, `<tool_call>`, ...), which every
   Hugging Face tokenizer matches before anything else, so each piece between them encodes on its
   own exactly as inside the whole text;
3. each piece's count comes from an LRU cache, else from the fast encoder: a tiktoken Encoding built
   from the byte-level BPE vocabulary when its ids equal the Hugging Face ones, else the HF tokenizer;
4. the first requests and a sample after are re-counted by a full Hugging Face encode; any mismatch
   switches the cache and the fast encoder off for good, with a warning.
"""

from __future__ import annotations

import collections
import json
import logging
import re
import threading
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import jinja2
import tiktoken

from modeltap.compat.prompts import normalise_message
from modeltap.dialects.base import Dialect, TextPrompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# A full encode costs about 2 µs per token here (docs/token-budgets.md §5.3): checking the first requests
# catches a tokenizer the fast path cannot reproduce before it decides anything that matters, and one
# request in 128 after keeps checking at well under 1% of the cost of counting without the cache.
VERIFY_FIRST_REQUESTS = 16
VERIFY_EVERY_REQUESTS = 128

# The segment cache keeps each piece's text as its key. 32M characters is about 32 MB of ASCII:
# 64 parallel agent sessions of 100k tokens (about 4 characters a token) fit, and it stays bounded.
SEGMENT_CACHE_MAX_CHARS = 32_000_000

# Template kwargs a request may not set: they would change how the prompt is tokenized, not what the
# template renders.
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "tokenize",
        "return_dict",
    }
)

# The regex of the `ByteLevel(use_regex=True)` pre-tokenizer of the `tokenizers` library (GPT-2's).
_GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Text the tiktoken encoder must encode exactly as the HF tokenizer before it is trusted: code,
# contractions, digits, whitespace runs, CRLF, CJK, emoji, combining marks, full-width forms.
_PROBE_TEXT = (
    "def f(x):\n    return x ** 2  # don't; I'LL we've\r\n\tif x>=10_000: print(f'{x!r}')\n\n\n"
    "  héllo wörld e\u0301 ﬁ 日本語のテキスト、句読点。 한국어 العربية 🤖🚀👩‍💻 ｆｕｌｌ　width\u00a0nbsp "
    '12345678901234567890 3.14159 -> => !== ... ```json\n{"a": [1, 2, {"b": null}]}\n```\n'
)


class CountError(ValueError):
    """The body cannot be rendered into a prompt (malformed messages, or the template refused them)."""


@dataclass(frozen=True, slots=True)
class CounterStats:
    """What the counter has done so far, for `serve`'s status line and the tests.

    `encoder` is "tiktoken" or "huggingface" (the encoder behind the segment cache) and `fast_path`
    says whether the segment cache is on; both turn off for good after a mismatch.
    """

    requests: int
    cache_hits: int
    cache_misses: int
    verifications: int
    mismatches: int
    encoder: str
    fast_path: bool
    cached_chars: int


class TokenCounter:
    """Counts a request's prompt tokens exactly as the served model does.

    >>> counter = TokenCounter.load("/models/qwen2.5", {"enable_thinking": False})
    >>> counter.count(dialects.named("chat"), {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    13

    Thread-safe: `count` may run in several worker threads at once.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        chat_template_kwargs: dict[str, Any] | None = None,
        *,
        request_template_kwargs: bool = True,
        openai_typed_chat: bool = False,
        verify_first: int = VERIFY_FIRST_REQUESTS,
        verify_every: int = VERIFY_EVERY_REQUESTS,
        cache_max_chars: int = SEGMENT_CACHE_MAX_CHARS,
    ) -> None:
        """Use `load` unless the tokenizer is already in memory.

        `request_template_kwargs=False` ignores a request's own `chat_template_kwargs`: AReaL drops
        that field (docs/areal.md §1.1.6), so against AReaL only the configured kwargs
        describe what the server renders. `openai_typed_chat=True` counts a chat body as AReaL's
        proxy sees it after validating it against the openai SDK's types: message fields the types do
        not declare (such as `reasoning_content`) dropped, and tool definitions in the types' key
        order, which the template's `tojson` shows. Against AReaL, set both.

        `verify_first` and `verify_every` (0: never) set which counts are checked by a full encode;
        `cache_max_chars` bounds the segment cache.
        """
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ValueError("modeltap needs a fast tokenizer (a folder with tokenizer.json)")
        if not tokenizer.chat_template:
            raise ValueError("the tokenizer has no chat template; give a tokenizer folder that ships one")
        self._tokenizer = tokenizer
        self._backend = backend
        self._template_kwargs = dict(chat_template_kwargs or {})
        self._request_template_kwargs = request_template_kwargs
        self._openai_typed_chat = openai_typed_chat
        self._string_content = _template_wants_string_content(tokenizer.chat_template)
        spec = json.loads(backend.to_str())
        added = sorted((t.content for t in tokenizer.added_tokens_decoder.values()), key=len, reverse=True)
        # A capturing group makes `split` return the added tokens too: odd indexes are added tokens.
        self._added_split = re.compile("(" + "|".join(map(re.escape, added)) + ")").split if added else None
        self._post_tokens = backend.num_special_tokens_to_add(False)
        self._fast_path = _segments_are_exact(spec, tokenizer)
        fast_encoder = _tiktoken_encoder(spec, backend) if self._fast_path else None
        self._encoder = "tiktoken" if fast_encoder is not None else "huggingface"
        self._encode_piece = fast_encoder or self._hf_piece
        self._verify_first, self._verify_every = verify_first, verify_every
        self._cache: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._cache_max_chars = cache_max_chars
        self._cached_chars = 0
        self._lock = threading.Lock()
        self._requests = self._hits = self._misses = self._verifications = self._mismatches = 0

    @classmethod
    def load(
        cls,
        path_or_name: str,
        chat_template_kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> TokenCounter:
        """Load a local Hugging Face tokenizer folder, or a name already in the local HF cache.

        Never downloads. Raises ValueError naming the fix when there is no usable tokenizer there.
        `options` are the constructor's keyword arguments.
        """
        # transformers takes seconds to import: only a process that loads a tokenizer pays for it,
        # and budget decisions (budget.py) import this module without it.
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(path_or_name, local_files_only=True)
        except OSError as exc:
            raise ValueError(
                f"no tokenizer at {path_or_name!r}: give a local folder with tokenizer.json and "
                "tokenizer_config.json, or a name already in the local Hugging Face cache "
                f"(modeltap never downloads one): {exc}"
            ) from exc
        return cls(tokenizer, chat_template_kwargs, **options)

    @property
    def stats(self) -> CounterStats:
        """A snapshot of the counters."""
        with self._lock:
            return CounterStats(
                requests=self._requests,
                cache_hits=self._hits,
                cache_misses=self._misses,
                verifications=self._verifications,
                mismatches=self._mismatches,
                encoder=self._encoder,
                fast_path=self._fast_path,
                cached_chars=self._cached_chars,
            )

    def count(self, dialect: Dialect, body: dict[str, Any]) -> int:
        """Prompt tokens of `body`, a request of `dialect`, as the served model counts them.

        Blocking (milliseconds on a cache hit, a full encode on a verification): call it off the
        event loop. Raises CountError when the body cannot be rendered.
        """
        rendered = self._render(dialect, body)
        if isinstance(rendered, TextPrompt):
            return self._count_completion_prompt(rendered.prompt)
        # The template writes BOS itself where the model has one, so the rendered text is encoded
        # without special tokens (docs/token-budgets.md §5.1 step 3, §5.2 "Double BOS").
        return self._count_text(rendered, add_special_tokens=False)

    def encode(
        self, dialect: Dialect, body: dict[str, Any], reply: dict[str, Any] | None = None
    ) -> list[int]:
        """The ids the served model's template and tokenizer make of `body`'s prompt: `serve
        --token-ids` records them where the server returns none. With `reply` (the answer as an
        OpenAI chat assistant message), the conversation with the reply appended and no generation
        prompt; a completions prompt (text) gets the reply's `content` appended. Always a full encode
        (the segment cache keeps counts, not ids). Blocking; raises CountError as `count` does."""
        rendered = self._render(dialect, body, reply)
        if not isinstance(rendered, TextPrompt):
            return list(self._backend.encode(rendered, add_special_tokens=False).ids)
        prompt, text = rendered.prompt, (reply or {}).get("content") or ""
        if not isinstance(prompt, str) or not isinstance(text, str):
            raise CountError("only a completions prompt of text is rendered into ids")
        return list(self._backend.encode(prompt + text, add_special_tokens=True).ids)

    def decode_each(self, ids: list[int]) -> list[str]:
        """Each id's text on its own (special tokens included), for showing where two id sequences
        part. A byte-level piece of a multi-byte character decodes to U+FFFD."""
        return [self._backend.decode([token], skip_special_tokens=False) for token in ids]

    def _render(
        self, dialect: Dialect, body: dict[str, Any], reply: dict[str, Any] | None = None
    ) -> str | TextPrompt:
        """The chat template's text for `body` (with `reply` appended and no generation prompt, when
        given), or the completions prompt, which no template renders."""
        try:
            prompt = dialect.prompt(body, openai_typed=self._openai_typed_chat)
            if isinstance(prompt, TextPrompt):
                return prompt
            conversation = [*prompt.messages, reply] if reply is not None else prompt.messages
            messages = [normalise_message(m, self._string_content) for m in conversation]
            request_kwargs = prompt.template_kwargs if self._request_template_kwargs else {}
            kwargs = {**self._template_kwargs, **request_kwargs}
            kwargs = {k: v for k, v in kwargs.items() if k not in _RESERVED_TEMPLATE_KWARGS}
            text = self._tokenizer.apply_chat_template(
                messages, tools=prompt.tools, add_generation_prompt=reply is None, tokenize=False, **kwargs
            )
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
            # RecursionError: a body nested deeper than the template can walk passes uncounted.
            if isinstance(exc, CountError):
                raise
            raise CountError(f"cannot render the prompt of this {dialect.name} request: {exc}") from exc
        # One conversation with tokenize=False renders one str: transformers types the result as every
        # mode's union.
        return cast(str, text)

    def _count_completion_prompt(self, prompt: Any) -> int:
        """Legacy completions: the prompt is text or token ids, or a batch of either; a batch is
        budgeted by its longest prompt."""
        if isinstance(prompt, str):
            # Servers encode a completions prompt with the tokenizer's special tokens (BOS).
            return self._count_text(prompt, add_special_tokens=True)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt)
        if isinstance(prompt, list) and prompt:
            return max(self._count_completion_prompt(p) for p in prompt)
        raise CountError("a completions request needs a prompt: text, token ids, or a list of either")

    def _count_text(self, text: str, add_special_tokens: bool) -> int:
        with self._lock:
            self._requests += 1
            verify = self._requests <= self._verify_first or (
                self._verify_every > 0 and self._requests % self._verify_every == 0
            )
            fast = self._fast_path and self._added_split is not None
        if not fast:
            return self._full_count(text, add_special_tokens)
        pieces = self._added_split(text)  # type: ignore[misc]
        count = len(pieces) // 2 + (self._post_tokens if add_special_tokens else 0)
        count += sum(self._piece_count(piece) for piece in pieces[::2] if piece)
        if verify:
            return self._verified(text, add_special_tokens, count)
        return count

    def _piece_count(self, piece: str) -> int:
        with self._lock:
            cached = self._cache.get(piece)
            if cached is not None:
                self._cache.move_to_end(piece)
                self._hits += 1
                return cached
            self._misses += 1
        count = len(self._encode_piece(piece))
        if len(piece) > self._cache_max_chars:
            return count
        with self._lock:
            if piece not in self._cache:
                self._cache[piece] = count
                self._cached_chars += len(piece)
            while self._cached_chars > self._cache_max_chars and self._cache:
                evicted, _ = self._cache.popitem(last=False)
                self._cached_chars -= len(evicted)
        return count

    def _verified(self, text: str, add_special_tokens: bool, count: int) -> int:
        """The full encode's count; a different fast count turns the fast path off for good."""
        truth = self._full_count(text, add_special_tokens)
        with self._lock:
            self._verifications += 1
            if truth == count or not self._fast_path:
                return truth
            self._mismatches += 1
            self._fast_path = False
            self._cache.clear()
            self._cached_chars = 0
        log.warning(
            "token count mismatch: the %s segment cache counted %d tokens where a full encode counts %d; "
            "counting by full encode from now on",
            self._encoder,
            count,
            truth,
        )
        return truth

    def _full_count(self, text: str, add_special_tokens: bool) -> int:
        return len(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def _hf_piece(self, piece: str) -> list[int]:
        return self._backend.encode(piece, add_special_tokens=False).ids  # type: ignore[no-any-return]


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


def _segments_are_exact(spec: dict[str, Any], tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether counting the pieces between added tokens separately gives the whole text's count.

    Hugging Face tokenizers split at added tokens first and then normalise and pre-tokenize each
    piece on its own, so this holds unless an added token strips whitespace from its neighbours, is
    only matched after normalisation, or a step depends on where a piece sits in the whole text
    (Metaspace's "first" prefix, a Prepend normaliser). The conditions SGLang's segment encoder
    checks (docs/token-budgets.md §5.4, caveats).
    """
    for token in tokenizer.added_tokens_decoder.values():
        if token.lstrip or token.rstrip or token.single_word:
            return False
        if token.normalized and spec.get("normalizer") is not None:
            return False
    text = json.dumps([spec.get("normalizer"), spec.get("pre_tokenizer")])
    return '"Metaspace"' not in text and '"Prepend"' not in text


def _tiktoken_encoder(spec: dict[str, Any], backend: Any) -> Callable[[str], list[int]] | None:
    """A tiktoken encoder giving the same ids as the HF tokenizer, or None where it cannot.

    Only byte-level BPE with one regex pre-tokenizer fits (Qwen2/3, Llama-3, GPT-2 style); the
    merge order must match the ranks, and the encoder must reproduce the HF ids on a probe text.
    """
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout") or model.get("byte_fallback"):
        return None
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None
    pattern = _byte_level_pattern(spec.get("pre_tokenizer"))
    if pattern is None or spec.get("normalizer") not in (None, {"type": "NFC"}):
        return None
    ranks = _byte_ranks(model["vocab"])
    if ranks is None or not _merges_follow_ranks(model.get("merges") or [], model["vocab"]):
        return None
    try:
        encoding = tiktoken.Encoding(
            "modeltap-bpe", pat_str=pattern, mergeable_ranks=ranks, special_tokens={}
        )
    except ValueError:
        return None
    encoder: Callable[[str], list[int]] = encoding.encode_ordinary
    if spec.get("normalizer") is not None:
        # Qwen's tokenizer.json carries an NFC normaliser, which tiktoken does not apply itself.
        encoder = _nfc_first(encoding)
    if encoder(_PROBE_TEXT) != backend.encode(_PROBE_TEXT, add_special_tokens=False).ids:
        log.info("the tiktoken encoder disagrees with the tokenizer on the probe text; using the tokenizer")
        return None
    return encoder


def _nfc_first(encoding: tiktoken.Encoding) -> Callable[[str], list[int]]:
    def encode(piece: str) -> list[int]:
        if not unicodedata.is_normalized("NFC", piece):
            piece = unicodedata.normalize("NFC", piece)
        return encoding.encode_ordinary(piece)

    return encode


def _byte_level_pattern(pre_tokenizer: dict[str, Any] | None) -> str | None:
    """The split regex of a byte-level pre-tokenizer that tiktoken can run, else None."""
    if not pre_tokenizer:
        return None
    steps = pre_tokenizer.get("pretokenizers", [pre_tokenizer])
    last = steps[-1]
    if last.get("type") != "ByteLevel" or last.get("add_prefix_space"):
        return None
    if len(steps) == 1:
        return _GPT2_PATTERN if last.get("use_regex", True) else None
    split = steps[0]
    if len(steps) != 2 or last.get("use_regex") or split.get("type") != "Split":
        return None
    if split.get("behavior") != "Isolated" or split.get("invert") or "Regex" not in split.get("pattern", {}):
        return None
    return str(split["pattern"]["Regex"])


def _byte_ranks(vocab: dict[str, int]) -> dict[bytes, int] | None:
    """The vocabulary as tiktoken ranks: token text decoded through GPT-2's byte-to-unicode map."""
    to_byte = {char: byte for byte, char in _bytes_to_unicode().items()}
    ranks: dict[bytes, int] = {}
    for token, rank in vocab.items():
        if any(char not in to_byte for char in token):
            return None
        ranks[bytes(to_byte[char] for char in token)] = rank
    if len(set(ranks.values())) != len(ranks) or any(bytes([b]) not in ranks for b in range(256)):
        return None
    return ranks


def _merges_follow_ranks(merges: list[Any], vocab: dict[str, int]) -> bool:
    """tiktoken merges the pair whose result has the lowest id; HF applies merges in list order."""
    previous = -1
    for merge in merges:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        rank = vocab.get(left + right)
        if rank is None or rank <= previous:
            return False
        previous = rank
    return True


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters, used by every byte-level BPE."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))

"""Token ids rendered by the served model's template and tokenizer, for an engine that returns none.

Owns: turning a request's prompt, and the prompt with its reply appended, into the ids the served
tokenizer makes of them, marked "rendered" (`IdRenderer`, `rendered_ids`). Does not own: asking an
engine for its own ids or deciding when to render (proxy/token_recorder.py), reading served ids out of
a response (dialects/token_ids.py), or storing them (records/token_store.py).

    renderer = IdRenderer(counter)                       # off the event loop: it loads the vocabulary
    ids = rendered_ids(renderer, dialects.named("chat"), request, response)
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modeltap.counting.loaded import LoadedTokenizer
from modeltap.dialects.roles import AsChat, Dialect
from modeltap.dialects.token_ids import TokenIds, common_prefix

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from modeltap.counting.counter import TokenCounter

log = logging.getLogger(__name__)


class IdRenderer:
    """Prompt and reply ids made by the served model's template and tokenizer, where the server
    returns none. The template and the encoder are the budget's counter's (one loaded tokenizer per
    folder and process: counting/loaded.py), so rendering ids costs no second copy of the vocabulary.
    Its methods block: call them off the event loop."""

    def __init__(self, counter: TokenCounter) -> None:
        self._counter = counter
        self._loaded = counter.tokenizer

    def ids(self, dialect: Dialect, body: dict[str, Any], reply: dict[str, Any] | None = None) -> list[int]:
        """The ids of `body`'s prompt as the server renders and encodes it; with `reply`, of the
        conversation with the reply appended and no generation prompt (a completions prompt: its text
        with the reply's `content` appended). Raises CountError for a body it cannot render."""
        from modeltap.counting.counter import CountError

        rendered = self._counter.render(dialect, body, reply)
        if not isinstance(rendered, str):
            prompt, text = rendered.prompt, (reply or {}).get("content") or ""
            if not isinstance(prompt, str) or not isinstance(text, str):
                raise CountError("only a completions prompt of text is rendered into ids")
            if self._loaded.special_tokens_added:
                # Servers encode a completions prompt with the tokenizer's special tokens (BOS), which
                # only the whole tokenizer's post-processor adds.
                return self._with_special_tokens(prompt + text)
            return self._loaded.encode_ids(prompt + text)
        # The template writes BOS itself where the model has one (docs/token-budgets.md §5.2).
        return self._loaded.encode_ids(rendered)

    @property
    def folder(self) -> Path:
        """The served tokenizer's folder."""
        return self._loaded.folder

    def decode_each(self, ids: list[int]) -> list[str]:
        """Each id's text on its own (special tokens included), for showing where two id sequences
        part. A byte-level piece of a multi-byte character decodes to U+FFFD."""
        return _decode_each(self._loaded, ids)

    def turn_ends(self) -> frozenset[int]:
        """The ids a generated turn may end on (the template's end of turn and the tokenizer's
        end-of-text ids), for telling a stop id rendered as another from a changed reply; empty when
        the template ends a turn in no added token."""
        from modeltap.counting.continuation import study_turn_end

        try:
            return study_turn_end(self._loaded.template, self._loaded.added_ids).stop_ids
        except ValueError as exc:
            log.info("no turn-end ids: %s", exc)
            return frozenset()

    def _with_special_tokens(self, text: str) -> list[int]:
        from modeltap.counting.tokenizer_files import TokenizerFiles

        tokenizer: Tokenizer = TokenizerFiles.load(self._loaded.folder).tokenizer
        return list(tokenizer.encode(text, add_special_tokens=True).ids)


def folder_decoder(folder: str) -> Callable[[list[int]], list[str]]:
    """`IdRenderer.decode_each` for the tokenizer in `folder`, built where there is no counter: in the
    record writer process, on the first break it describes (records/writer_process.py)."""
    return functools.partial(_decode_each, LoadedTokenizer.load(Path(folder)))


def _decode_each(loaded: LoadedTokenizer, ids: list[int]) -> list[str]:
    token_bytes = loaded.token_bytes
    if token_bytes is None:
        return [str(token) for token in ids]
    return [token_bytes(token).decode("utf-8", "replace") for token in ids]


def rendered_ids(
    renderer: IdRenderer, dialect: Dialect, request: dict[str, Any], response: Any
) -> TokenIds | None:
    """The prompt as the template renders it (with the generation prompt), and the completion as what
    the template adds for the reply after it. Blocking."""
    from modeltap.counting.counter import CountError

    if isinstance(response, bytes):
        try:
            response = json.loads(response)
        except ValueError:
            return None
    if not isinstance(response, dict):
        return None
    if isinstance(dialect, AsChat):
        reply = dialect.conversation(request, response).messages[-1]
    else:
        reply = {"content": dialect.read(response)[1]}
    try:
        prompt = renderer.ids(dialect, request)
        full = renderer.ids(dialect, request, reply)
    except CountError as exc:
        log.debug("no rendered token ids: %s", exc)
        return None
    shared = common_prefix(prompt, full)
    return TokenIds(prompt, full[shared:], None, "rendered")

"""Token ids rendered by the served model's template and tokenizer, for an engine that returns none.

Owns: turning a request's prompt, and the prompt with its reply appended, into the ids the served
tokenizer makes of them, marked "rendered" (`IdRenderer`, `rendered_ids`). Does not own: asking an
engine for its own ids or deciding when to render (proxy/token_recorder.py), reading served ids out of
a response (dialects/token_ids.py), or storing them (records/token_store.py).

    renderer = IdRenderer(counter)                       # off the event loop: it loads the vocabulary
    ids = rendered_ids(renderer, dialects.named("chat"), request, response)
"""

from __future__ import annotations

import bisect
import functools
import itertools
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
        from modeltap.counting.continuation import TurnEnd, study_turn_end

        self._counter = counter
        self._loaded = counter.tokenizer
        self._turn: TurnEnd | None = None
        try:
            self._turn = study_turn_end(self._loaded.template, self._loaded.added_ids)
        except ValueError as exc:
            log.info("no turn-end ids: %s", exc)

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

    def mask(self, completion: list[int], reply: dict[str, Any], finish_reason: str | None) -> list[int]:
        """Which ids of a rendered completion the reply's own text encodes to: each id whose bytes lie
        wholly inside the reply's reasoning or content, where the template put them (1), and the
        template's end of turn after a reply that ended on its own; the rest is 0: what the template
        wrote (an empty `<think></think>`, a tool call's markup, the newline after the turn), an id
        merged across the text's edge, text the template rewrote. All 0 where ids have no bytes."""
        mask = [0] * len(completion)
        token_bytes = self._loaded.token_bytes
        if token_bytes is None:
            return mask
        pieces = [token_bytes(token) for token in completion]
        ends = list(itertools.accumulate(len(piece) for piece in pieces))
        written = b"".join(pieces)
        position, after = 0, 0
        texts = [reply.get(field) for field in ("reasoning_content", "reasoning", "content")]
        for text in (t.encode() for t in texts if isinstance(t, str) and t.strip()):
            found = written.find(text, position)
            if found < 0:
                continue
            position = found + len(text)
            # The ids that start at or after `found` and end by `position`.
            first = bisect.bisect_right(ends, found)
            if first < len(ends) and ends[first] - len(pieces[first]) < found:
                first += 1
            last = bisect.bisect_right(ends, position)
            mask[first:last] = [1] * max(last - first, 0)
            after = max(after, last)
        turn = self._turn
        if finish_reason in ("stop", "tool_calls") and turn is not None:
            end = next((i for i in range(after, len(completion)) if completion[i] == turn.token_id), None)
            if end is not None:
                mask[end] = 1
        return mask

    def turn_ends(self) -> frozenset[int]:
        """The ids a generated turn may end on (the template's end of turn and the tokenizer's
        end-of-text ids), for telling a stop id rendered as another from a changed reply; empty when
        the template ends a turn in no added token."""
        return self._turn.stop_ids if self._turn is not None else frozenset()

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
    completion = full[shared:]
    finish = dialect.read(response)[0]
    return TokenIds(prompt, completion, None, "rendered", mask=renderer.mask(completion, reply, finish))

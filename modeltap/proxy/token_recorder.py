"""`serve --token-ids`: asking each upstream for the token ids it used, or rendering them where it has none.

Owns: learning each upstream's engine once (the operator's `--engine`, else its discovery answers,
read by compat/engines.py), adding what that engine needs to a request without re-serialising it, and
the fallback: the served model's template (as the budget renders it: `TokenCounter.render`) and its
tokenizer turn the prompt and the reply into ids, marked "rendered" (`IdRenderer`). Does not own:
which fields each engine reads (compat/engines.py), reading ids out of a response (the dialects),
storing them or checking a session's continuity (records/token_store.py, records/continuity.py).

The client gets the answer it would have got: the fields modeltap asks for come back in the body
(vLLM's `prompt_token_ids`, a trailing `sglext` chunk), and modeltap forwards them untouched rather
than re-serialise every chunk; they are harmless to the openai SDK, opencode and Claude Code
(docs/token-ids.md §2 says why, with the measured cost of both choices).

    recorder = TokenIdRecorder(config, IdRenderer(counter))
    ask = await recorder.ask(dialect, body, upstream, headers)   # TokenAsk(fields=..., headers=...) | None
    payload = with_fields(payload, body, ask.fields)
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from modeltap.compat.engines import PROBE_PATHS, EngineInfo, TokenAsk, chosen, identify, token_ask
from modeltap.dialects.base import Dialect
from modeltap.dialects.token_ids import TokenIds
from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.upstream import Upstream
from modeltap.records.continuity import common_prefix

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from modeltap.proxy.tokens import TokenCounter

log = logging.getLogger(__name__)

# Each discovery request may take this long; an engine that has not answered by then is taken as
# unknown (ids are then rendered, when a tokenizer is configured).
PROBE_TIMEOUT_S = 5.0
# An upstream that answered none of the probes (down at start, say) is asked again after this long,
# rather than rendered for ever; one that answered is remembered for the proxy's life.
REPROBE_AFTER_S = 60.0
# The leading bytes a JSON object may carry before its `{`: whitespace and a UTF-8 byte-order mark.
_LEADING = b" \t\r\n\xef\xbb\xbf"


class IdRenderer:
    """Prompt and reply ids made by the served model's template and tokenizer, where the server
    returns none. The template is the budget's counter's; the encoder is the tokenizer folder's own
    `tokenizers` model with its vocabulary (Qwen2.5's takes ~80 MB), loaded once, here, because the
    counter keeps only counts. Build it off the event loop; its methods block."""

    def __init__(self, counter: TokenCounter) -> None:
        from modeltap.proxy.tokenizer_files import TokenizerFiles

        self._counter = counter
        self._tokenizer: Tokenizer = TokenizerFiles.load(counter.tokenizer.folder).tokenizer

    def ids(self, dialect: Dialect, body: dict[str, Any], reply: dict[str, Any] | None = None) -> list[int]:
        """The ids of `body`'s prompt as the server renders and encodes it; with `reply`, of the
        conversation with the reply appended and no generation prompt (a completions prompt: its text
        with the reply's `content` appended). Raises CountError for a body it cannot render."""
        from modeltap.proxy.tokens import CountError

        rendered = self._counter.render(dialect, body, reply)
        if not isinstance(rendered, str):
            prompt, text = rendered.prompt, (reply or {}).get("content") or ""
            if not isinstance(prompt, str) or not isinstance(text, str):
                raise CountError("only a completions prompt of text is rendered into ids")
            # Servers encode a completions prompt with the tokenizer's special tokens (BOS).
            return list(self._tokenizer.encode(prompt + text, add_special_tokens=True).ids)
        # The template writes BOS itself where the model has one (docs/token-budgets.md §5.2).
        return list(self._tokenizer.encode(rendered, add_special_tokens=False).ids)

    def decode_each(self, ids: list[int]) -> list[str]:
        """Each id's text on its own (special tokens included), for showing where two id sequences
        part. A byte-level piece of a multi-byte character decodes to U+FFFD."""
        return _decode_each(self._tokenizer, ids)


def folder_decoder(folder: str) -> Callable[[list[int]], list[str]]:
    """`IdRenderer.decode_each` for the tokenizer in `folder`, built where there is no counter: in the
    record writer process, on the first break it describes (records/writer_process.py)."""
    from modeltap.proxy.tokenizer_files import TokenizerFiles

    return functools.partial(_decode_each, TokenizerFiles.load(folder).tokenizer)


def _decode_each(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.decode([token], skip_special_tokens=False) for token in ids]


class TokenIdRecorder:
    """The proxy's token-id policy: one per proxy, shared by its handlers."""

    def __init__(self, config: ProxyConfig, renderer: IdRenderer | None) -> None:
        self._choice = chosen(config.engine)
        self._logprobs = config.logprobs
        self._renderer = renderer
        self._engines: dict[str, tuple[EngineInfo, float | None]] = {}
        self._probing = asyncio.Lock()

    @property
    def renders(self) -> bool:
        """Whether ids the server does not return are rendered (a tokenizer is configured)."""
        return self._renderer is not None

    async def engine(self, upstream: Upstream, headers: Mapping[str, str]) -> EngineInfo:
        """The engine behind `upstream`: `--engine` when given, else probed once (docs/engines.md §3)."""
        if self._choice is not None:
            return self._choice
        async with self._probing:
            known = self._engines.get(upstream.root)
            if known is not None and (known[1] is None or time.monotonic() < known[1]):
                return known[0]
            answers = {
                path: await upstream.fetch_json(path, headers, PROBE_TIMEOUT_S) for path in PROBE_PATHS
            }
            engine = identify(answers)
            answered = any(answer is not None for answer in answers.values())
            self._engines[upstream.root] = (engine, None if answered else time.monotonic() + REPROBE_AFTER_S)
            log.info("upstream %s: engine %s", upstream.root, engine.describe())
            return engine

    async def ask(
        self, dialect: Dialect, body: Mapping[str, Any], upstream: Upstream, headers: Mapping[str, str]
    ) -> tuple[EngineInfo, TokenAsk | None]:
        """The upstream's engine and what to add to this request for its ids (None: it returns none)."""
        engine = await self.engine(upstream, headers)
        streamed = body.get("stream") is True
        return engine, token_ask(engine, dialect.name, streamed=streamed, logprobs=self._logprobs, body=body)

    async def render(self, dialect: Dialect, request: dict[str, Any], response: Any) -> TokenIds | None:
        """The ids the served tokenizer makes of `request` and its reply (`response`: a body, or the
        bytes of one), off the event loop; None without a tokenizer or for a reply it cannot render."""
        renderer = self._renderer
        if renderer is None:
            return None
        try:
            return await asyncio.to_thread(rendered_ids, renderer, dialect, request, response)
        except Exception:  # the boundary: a body the renderer cannot read costs its ids, never its record
            log.warning("token ids not rendered for a %s exchange", dialect.name, exc_info=True)
            return None


def rendered_ids(
    renderer: IdRenderer, dialect: Dialect, request: dict[str, Any], response: Any
) -> TokenIds | None:
    """The prompt as the template renders it (with the generation prompt), and the completion as what
    the template adds for the reply after it. Blocking."""
    from modeltap.proxy.tokens import CountError

    if isinstance(response, bytes):
        try:
            response = json.loads(response)
        except ValueError:
            return None
    if not isinstance(response, dict):
        return None
    conversation = dialect.conversation(request, response)
    reply = conversation.messages[-1] if conversation is not None else {"content": dialect.read(response)[1]}
    try:
        prompt = renderer.ids(dialect, request)
        full = renderer.ids(dialect, request, reply)
    except CountError as exc:
        log.debug("no rendered token ids: %s", exc)
        return None
    shared = common_prefix(prompt, full)
    return TokenIds(prompt, full[shared:], None, "rendered")


def with_fields(payload: bytes, body: Mapping[str, Any], fields: Mapping[str, Any]) -> bytes:
    """`payload` (the JSON object `body`, as bytes) with `fields` added, without re-serialising it:
    the fields go in right after its opening brace. `fields` never names a key `body` has
    (compat/engines.py leaves the client's own), so no key is duplicated; an empty object is written
    whole."""
    if not fields:
        return payload
    start = len(payload) - len(payload.lstrip(_LEADING))
    if not body or payload[start : start + 1] != b"{":
        return json.dumps({**body, **fields}).encode()
    added = json.dumps(dict(fields))[1:-1].encode()
    return payload[: start + 1] + added + b"," + payload[start + 1 :]

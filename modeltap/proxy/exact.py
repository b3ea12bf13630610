"""`serve --tokens exact`: token-in, token-out. modeltap builds each chat request's prompt ids itself,
sends them to the engine's token endpoint, and turns the generated ids back into the client's message,
so the ids a trainer trains on are the ids the model saw and produced.

Owns: the mode's state (`ExactMode`: the prompt builder, the reply parsers, the engine's endpoint,
each session's recent turns), and one exchange through it (`ExactTranslation`): the engine request
(the sampling the chat request asked for, its cap after the budget), the chat answer made of the
engine's answer (`reply`) or stream (`stream`: content as the ids arrive, each tool call once it is
complete), the ids for the record, and the turn kept for the next request to continue. Chat is the
format it translates from: a Messages or Responses client comes through the chat translation first
(translate.py), so every format gets exact ids. Does not own: building the ids (counting/continuation.py),
parsing the generated text (compat/parsers), the engines' request shapes (compat/token_requests.py)
or answer shapes (dialects/openai_completions.py, dialects/sglang_generate.py), or HTTP (relay.py,
answers.py).

    exact = ExactMode(counter, engine, parsers, limits)
    translation = await exact.start(session_id, chat_body)      # the ids, built off the event loop
    payload = translation.payload(max_tokens)                    # to translation.endpoint at .path
    chat = translation.reply(engine_answer)                      # or: tap = translation.stream()
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import json
import random
import time
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from modeltap.compat.engines import EngineInfo
from modeltap.compat.token_requests import Sampling, sglang_generate, vllm_completions
from modeltap.counting.continuation import BuiltPrompt, BuiltTurn, PromptBuilder
from modeltap.counting.counter import CountError, TokenCounter
from modeltap.dialects import openai_completions
from modeltap.dialects import sglang_generate as generate_dialect
from modeltap.dialects.openai_chat import DIALECT as CHAT
from modeltap.dialects.roles import TokenEndpoint
from modeltap.dialects.sse import DONE_EVENT, Assembled, StreamAssembler, data_event
from modeltap.dialects.token_ids import Generated, TokenIds
from modeltap.proxy.errors import BadRequest

# Turns kept per session: the main thread's last, and a few side requests an agent interleaves with
# it (opencode's title, a compaction) that must not push the main turn out.
TURNS_PER_SESSION = 4
# Ids kept across every session's turns, at 4 bytes each (array "I"): 64 sessions of 8 turns of 60k
# ids. The least recently continued session goes first.
TURN_MEMORY_MAX_IDS = 32_000_000
# Random bits of the ids modeltap gives a completion and its tool calls (OpenAI's are 24 hex digits).
_ID_BITS = 96


class ParsedCall(Protocol):
    """A tool call parsed out of the generated text (compat/parsers)."""

    @property
    def name(self) -> str: ...

    @property
    def arguments(self) -> str: ...


class ParsedReply(Protocol):
    """The assistant message the engine's parsers make of a choice's text (compat/parsers)."""

    @property
    def content(self) -> str | None: ...

    @property
    def reasoning(self) -> str | None: ...

    @property
    def tool_calls(self) -> Sequence[ParsedCall]: ...

    def finish_reason(self, engine_finish_reason: str | None) -> str: ...


StreamPiece = tuple[Literal["content", "reasoning"], str] | tuple[Literal["call"], ParsedCall]


class ReplyStream(Protocol):
    """One choice's text, parsed as it grows: `feed` takes the text generated since the last call and
    gives what to stream (content and reasoning deltas, each tool call once complete); `end` the whole
    parse, which the fed pieces add up to."""

    def feed(self, text: str) -> list[StreamPiece]: ...

    def end(self) -> tuple[list[StreamPiece], ParsedReply]: ...


class ReplyParsers(Protocol):
    """The served model family's parsers, chosen at start (compat/parsers)."""

    def parse(self, text: str, request: Mapping[str, Any]) -> ParsedReply: ...

    def stream(self, request: Mapping[str, Any]) -> ReplyStream: ...


@dataclass(slots=True)
class _Session:
    turns: collections.deque[BuiltTurn] = field(
        default_factory=lambda: collections.deque(maxlen=TURNS_PER_SESSION)
    )
    ids: int = 0


class TurnMemory:
    """Each session's recent turns, the newest first, bounded by the ids they hold (TURN_MEMORY_MAX_IDS).
    Owned by the proxy; used on the event loop only."""

    def __init__(self, max_ids: int = TURN_MEMORY_MAX_IDS) -> None:
        self._max_ids = max_ids
        self._sessions: collections.OrderedDict[str, _Session] = collections.OrderedDict()
        self._ids = 0

    def recent(self, session: str | None) -> list[BuiltTurn]:
        """The session's turns, newest first."""
        kept = self._sessions.get(session) if session is not None else None
        return list(reversed(kept.turns)) if kept is not None else []

    def keep(self, session: str | None, turn: BuiltTurn) -> None:
        if session is None:
            return
        kept = self._sessions.setdefault(session, _Session())
        self._sessions.move_to_end(session)
        if len(kept.turns) == kept.turns.maxlen:
            self._forget(kept, kept.turns[0])
        kept.turns.append(turn)
        size = len(turn.prompt) + sum(len(c) for c in turn.completions)
        kept.ids += size
        self._ids += size
        while self._ids > self._max_ids and len(self._sessions) > 1:
            _, oldest = self._sessions.popitem(last=False)
            self._ids -= oldest.ids

    def _forget(self, kept: _Session, turn: BuiltTurn) -> None:
        size = len(turn.prompt) + sum(len(c) for c in turn.completions)
        kept.ids -= size
        self._ids -= size


class ExactMode:
    """The proxy's token-in, token-out state: one per proxy. `engine` says which token endpoint the
    upstream has (vLLM `/v1/completions`, SGLang `/generate`); `context_length` bounds a completion a
    request names no cap for (the chat route's meaning: up to the window's remainder)."""

    def __init__(
        self, counter: TokenCounter, engine: EngineInfo, parsers: ReplyParsers, context_length: int
    ) -> None:
        if engine.name not in ("vllm", "sglang"):
            raise ValueError(
                "`--tokens exact` needs an engine that takes token ids (vLLM or SGLang), not "
                f"{engine.describe()}: say which with --engine"
            )
        self.builder = PromptBuilder(counter)
        self.counter = counter
        self.engine = engine
        self.parsers = parsers
        self.context_length = context_length
        self.memory = TurnMemory()
        self.endpoint: TokenEndpoint = (
            openai_completions.DIALECT if engine.name == "vllm" else generate_dialect.DIALECT
        )
        # From the server's root: vLLM's OpenAI routes are under /v1, SGLang's native one is not.
        self.path = "/v1/completions" if engine.name == "vllm" else "/generate"

    async def start(self, session: str | None, chat_body: dict[str, Any]) -> ExactTranslation:
        """The translation of one chat request: its prompt ids built off the event loop, continuing
        the session's most recent turn it continues. Raises BadRequest for a body the template cannot
        render."""
        turns = self.memory.recent(session)
        try:
            built = await asyncio.to_thread(self._build, chat_body, turns)
        except CountError as exc:
            raise BadRequest(str(exc)) from None
        return ExactTranslation(self, session, chat_body, built)

    def _build(self, body: dict[str, Any], turns: list[BuiltTurn]) -> BuiltPrompt:
        """Blocking: the request's ids."""
        return self.builder.build(CHAT, body, turns)


class ExactTranslation:
    """One chat request through the engine's token endpoint. After `payload`, either `reply` (a whole
    answer) or `stream()` (a stream); `token_ids` then holds the ids for the record, and `remember`
    keeps the turn for the next request."""

    def __init__(
        self, mode: ExactMode, session: str | None, chat_body: dict[str, Any], built: BuiltPrompt
    ) -> None:
        self.mode = mode
        self.session = session
        self.chat_body = chat_body
        self.built = built
        self.endpoint = mode.endpoint
        self.path = mode.path
        self.request: dict[str, Any] = {}
        self.token_ids: TokenIds | None = None
        self.stops = mode.builder.turn_end.stop_ids
        self.token_bytes = mode.counter.tokenizer.token_bytes
        self.chat_id = "chatcmpl-" + f"{random.getrandbits(_ID_BITS):024x}"
        self.created = int(time.time())
        self._generated: list[Generated] = []
        self._parsed: list[ParsedReply] = []

    @property
    def streamed(self) -> bool:
        """Whether the client asked for a stream."""
        return self.chat_body.get("stream") is True

    @property
    def how(self) -> str:
        """What the record says of the ids (`token_ask`): continued from the previous turn, or rendered
        in full and why."""
        if self.built.continued is not None:
            return f"built: continues the previous turn's {self.built.shared} ids"
        return f"built: rendered in full ({self.built.reason})"

    def payload(self, max_tokens: int | None) -> bytes:
        """The engine request: the ids, and the chat request's sampling with `max_tokens` (the cap after
        the budget; None: the window's remainder, as the chat route means it)."""
        room = self.mode.context_length - 1 - len(self.built.ids)
        cap = max(min(max_tokens, room) if max_tokens is not None else room, 1)
        sampling = Sampling.of_chat(self.chat_body, max_tokens=cap)
        if self.endpoint is openai_completions.DIALECT:
            model = self.chat_body.get("model")
            self.request = vllm_completions(
                model if isinstance(model, str) else "", self.built.ids, sampling, stream=self.streamed
            )
        else:
            self.request = sglang_generate(self.built.ids, sampling, stream=self.streamed)
        return json.dumps(self.request).encode()

    @property
    def recorded_request(self) -> dict[str, Any]:
        """The engine request as the record keeps it: the prompt ids are the exchange's token ids
        (records/token_store.py), not stored again here."""
        key = "prompt" if "prompt" in self.request else "input_ids"
        return {**self.request, key: f"<{len(self.built.ids)} token ids>"}

    # -- a whole answer -----------------------------------------------------------------------------------

    def reply(self, answer: Any) -> dict[str, Any]:
        """The chat completion the engine's whole answer amounts to."""
        generated = sorted(self.endpoint.generated(answer, streamed=False), key=lambda g: g.index)
        if not generated:
            raise ValueError("the engine's answer holds no generated token ids")
        parsed = [self.mode.parsers.parse(self._text(g.ids), self.chat_body) for g in generated]
        self.settle(generated, parsed)
        return self.completion(generated, parsed)

    def settle(self, generated: Sequence[Generated], parsed: Sequence[ParsedReply]) -> None:
        first = generated[0]
        self.token_ids = TokenIds(self.built.ids, first.ids, first.logprobs, "built")
        self._generated, self._parsed = list(generated), list(parsed)

    def remember(self) -> None:
        """Keep this turn for the session's next request to continue (after a complete answer)."""
        if self.token_ids is None:
            return
        prepared = self.built.prepared
        replies = tuple(self._message(p) for p in self._parsed)
        self.mode.memory.keep(
            self.session,
            BuiltTurn(
                prompt=array("I", self.built.ids),
                messages=prepared.messages,
                tools=prepared.tools,
                kwargs=prepared.kwargs,
                rewritable=self.built.rewritable,
                completions=tuple(array("I", g.ids) for g in self._generated),
                replies=tuple(self.mode.counter.normalised(reply, prepared.tools) for reply in replies),
            ),
        )

    def _text(self, ids: Sequence[int]) -> str:
        """The text of generated ids, less the stop id that ended them (as the engines' text)."""
        token_bytes = self.token_bytes
        assert token_bytes is not None  # ExactMode's builder refuses a tokenizer without it
        return b"".join(token_bytes(i) for i in ids if i not in self.stops).decode("utf-8", "replace")

    def _message(self, parsed: ParsedReply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.reasoning is not None:
            message["reasoning_content"] = parsed.reasoning
        if parsed.tool_calls:
            message["tool_calls"] = [self.call(call) for call in parsed.tool_calls]
        return message

    def call(self, call: ParsedCall) -> dict[str, Any]:
        """A parsed tool call as chat carries it, with an id of its own."""
        number = f"{random.getrandbits(_ID_BITS):024x}"
        return {
            "id": f"call_{number}",
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }

    def completion(self, generated: Sequence[Generated], parsed: Sequence[ParsedReply]) -> dict[str, Any]:
        choices = [
            {
                "index": g.index,
                "message": self._message(p),
                "logprobs": self._logprobs(g),
                "finish_reason": p.finish_reason(g.finish_reason),
            }
            for g, p in zip(generated, parsed, strict=True)
        ]
        completion_tokens = sum(len(g.ids) for g in generated)
        return {
            "id": self.chat_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.chat_body.get("model"),
            "choices": choices,
            "usage": {
                "prompt_tokens": len(self.built.ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(self.built.ids) + completion_tokens,
            },
        }

    def _logprobs(self, generated: Generated) -> dict[str, Any] | None:
        """The sampled tokens' logprobs in chat's shape, when the client asked for them."""
        if (
            self.chat_body.get("logprobs") is not True
            or generated.logprobs is None
            or self.token_bytes is None
        ):
            return None
        entries = []
        for token, logprob in zip(generated.ids, generated.logprobs, strict=True):
            piece = self.token_bytes(token)
            entries.append(
                {
                    "token": piece.decode("utf-8", "replace"),
                    "logprob": logprob,
                    "bytes": list(piece),
                    "top_logprobs": [],
                }
            )
        return {"content": entries}

    # -- a stream ---------------------------------------------------------------------------------------

    def stream(self) -> ExactStream:
        return ExactStream(self)


@dataclass(slots=True)
class _Choice:
    """One choice of a stream: its ids so far, the decoder of their bytes, its parse, what was said."""

    stream: ReplyStream
    ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )
    finish: str | None = None
    weight_version: str | None = None
    parsed: ParsedReply | None = None
    opened: bool = False
    calls: int = 0


class ExactStream:
    """The engine's stream written to the client as a chat stream, as the ids arrive: a role chunk, then
    content and reasoning deltas, each tool call once its text is complete (so a client gets the call
    the whole answer would carry: docs/parsers.md), the finish chunk, usage when asked, `[DONE]`."""

    transforms: Literal[True] = True

    def __init__(self, translation: ExactTranslation) -> None:
        self._t = translation
        self._events = StreamAssembler(translation.endpoint, on_event=self._take)
        self._choices: dict[int, _Choice] = {}
        self._out: list[bytes] = []
        self._ended = False
        self._stamp = {
            "id": translation.chat_id,
            "object": "chat.completion.chunk",
            "created": translation.created,
            "model": translation.chat_body.get("model"),
        }

    @property
    def complete(self) -> bool:
        return self._ended

    @property
    def received(self) -> dict[str, Any] | None:
        """The engine's answer, assembled, for the record."""
        return self._events.result().body

    def relay(self, chunk: bytes) -> bytes:
        self._events.feed(chunk)
        return self._flush()

    def end(self) -> bytes:
        """The closing chunks when the engine's stream ended after every choice finished but without
        `[DONE]`."""
        if not self._ended and self._choices and all(c.finish is not None for c in self._choices.values()):
            self._close()
        return self._flush()

    def result(self) -> Assembled:
        events = self._events.result()
        body = None
        if self._choices and all(c.parsed is not None for c in self._choices.values()):
            ordered = [self._choices[i] for i in sorted(self._choices)]
            generated = [
                Generated(i, c.ids, c.logprobs or None, c.finish, c.weight_version)
                for i, c in sorted(self._choices.items())
            ]
            parsed = [c.parsed for c in ordered if c.parsed is not None]
            body = self._t.completion(generated, parsed)
        error = (
            events.error
            if events.error is not None or self._ended
            else "the engine's stream ended before its finish"
        )
        return Assembled(body, events.events, self._ended, error)

    def _take(self, event: dict[str, Any] | None) -> None:
        if event is None:  # [DONE]
            if not self._ended:
                self._close()
            return
        for generated in self._t.endpoint.generated(event, streamed=True):
            choice = self._choices.get(generated.index)
            if choice is None:
                choice = self._choices[generated.index] = _Choice(
                    self._t.mode.parsers.stream(self._t.chat_body)
                )
            new = generated.ids[len(choice.ids) :] if generated.cumulative else generated.ids
            if generated.logprobs is not None:
                choice.logprobs += (
                    generated.logprobs[len(choice.logprobs) :] if generated.cumulative else generated.logprobs
                )
            choice.ids += new
            choice.weight_version = generated.weight_version or choice.weight_version
            self._say(generated.index, choice, choice.stream.feed(self._decode(choice, new)))
            if generated.finish_reason is not None and choice.finish is None:
                choice.finish = generated.finish_reason
                tail, choice.parsed = choice.stream.end()
                self._say(generated.index, choice, tail)
                self._chunk(generated.index, {}, choice.parsed.finish_reason(choice.finish))

    def _decode(self, choice: _Choice, ids: Sequence[int]) -> str:
        token_bytes = self._t.token_bytes
        assert token_bytes is not None
        return choice.decoder.decode(b"".join(token_bytes(i) for i in ids if i not in self._t.stops))

    def _say(self, index: int, choice: _Choice, pieces: list[StreamPiece]) -> None:
        if not choice.opened:
            choice.opened = True
            self._chunk(index, {"role": "assistant", "content": ""})
        for piece in pieces:
            if piece[0] == "call":
                call = self._t.call(piece[1])
                self._chunk(index, {"tool_calls": [{"index": choice.calls, **call}]})
                choice.calls += 1
            elif piece[1]:
                self._chunk(index, {"content" if piece[0] == "content" else "reasoning_content": piece[1]})

    def _chunk(self, index: int, delta: dict[str, Any], finish: str | None = None) -> None:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        self._out.append(data_event({**self._stamp, "choices": [choice]}))

    def _close(self) -> None:
        self._ended = True
        ordered = [self._choices[i] for i in sorted(self._choices)]
        if ordered and all(c.parsed is not None for c in ordered):
            generated = [
                Generated(i, c.ids, c.logprobs or None, c.finish, c.weight_version)
                for i, c in sorted(self._choices.items())
            ]
            self._t.settle(generated, [c.parsed for c in ordered if c.parsed is not None])
        options = self._t.chat_body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage") is True:
            completion = sum(len(c.ids) for c in ordered)
            prompt = len(self._t.built.ids)
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
            self._out.append(data_event({**self._stamp, "choices": [], "usage": usage}))
        self._out.append(DONE_EVENT)

    def _flush(self) -> bytes:
        out = b"".join(self._out)
        self._out.clear()
        return out
